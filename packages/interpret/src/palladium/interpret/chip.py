"""Which TPU chip a launch simulates: it decides the tile padding of ``buffer_bounds="padded"``.

In order: ``InterpretParams.chip`` when given; else the device kind of the abstract
device of the current abstract mesh (``jax.sharding.use_abstract_mesh(AbstractMesh(...,
abstract_device=AbstractDevice(device_kind="TPU v5e", ...)))``) when it names a TPU; else
the default device's kind when it is a TPU; else :data:`DEFAULT_CHIP`.

>>> chip_of_device_kind("TPU v5 lite"), chip_of_device_kind("cpu")
('v5e', None)
>>> CHIP_GENERATIONS["v3"], CHIP_GENERATIONS[DEFAULT_CHIP]
(3, 5)
"""

from __future__ import annotations

import jax

__all__ = ["CHIP_GENERATIONS", "DEFAULT_CHIP", "chip_of_device_kind", "resolve_chip"]

#: Chip name -> TPU generation. Only generations < 4 pad differently (see
#: ``palladium.shared_memory.padding``).
CHIP_GENERATIONS: dict[str, int] = {
    "v2": 2, "v3": 3, "v4": 4, "v4i": 4, "v5e": 5, "v5p": 5, "v6e": 6, "v7": 7, "v7x": 7,
}

#: The chip simulated when neither the params, the abstract mesh nor the default device
#: name a TPU (every generation >= 4 pads alike).
DEFAULT_CHIP = "v5e"

# jax device kinds (``Device.device_kind``) of each chip.
_DEVICE_KINDS: dict[str, str] = {
    "TPU v2": "v2", "TPU v3": "v3", "TPU v4": "v4", "TPU v4 lite": "v4i",
    "TPU v5e": "v5e", "TPU v5 lite": "v5e", "TPU v5": "v5p", "TPU v5p": "v5p",
    "TPU v6e": "v6e", "TPU v6 lite": "v6e", "TPU7": "v7", "TPU7x": "v7x",
}


def chip_of_device_kind(kind: str | None) -> str | None:
    """The chip name of a jax device kind, or None if it is not a TPU palladium knows."""
    return _DEVICE_KINDS.get(kind) if kind else None


def resolve_chip(chip: str | None) -> str:
    """The chip to simulate, given ``InterpretParams.chip`` (see the module docstring).

    Called when the ``pallas_call`` is lowered, i.e. in the caller's abstract-mesh context.
    """
    if chip is not None:
        return chip
    device = jax.sharding.get_abstract_mesh().abstract_device
    found = chip_of_device_kind(getattr(device, "device_kind", None))
    if found is not None:
        return found
    default = jax.devices()[0]
    if default.platform == "tpu":
        found = chip_of_device_kind(default.device_kind)
        if found is not None:
            return found
    return DEFAULT_CHIP
