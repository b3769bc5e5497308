"""palladium beside a TPU, and the chip a kernel is traced for on a CPU.

On a CPU, jax asks its ``tpu_info`` for "the current TPU" while it traces some kernels
(jax's own ``pltpu.emit_pipeline`` asks for the tiling): :func:`install` makes it answer
with the chip palladium simulates (``_traced_chip``). On a TPU host palladium simulates
on the CPU device: the forced interpret mode, ``predict`` and the pytest plugin enter
:func:`on_the_cpu_device`, and a ``pallas_call`` with palladium's params lowered for the
TPU is refused with :data:`ON_TPU_DEVICE` (jax's own rule would run it under jax's HLO
interpreter, without palladium's checks). Checked on a TPU v5e (benchmarks/README.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax

from palladium.interpret import _jax_compat as jc
from palladium.interpret.chip import DEFAULT_CHIP, chip_record, device_kind
from palladium.interpret.errors import ConfigError
from palladium.interpret.params import InterpretParams

__all__ = ["ON_TPU_DEVICE", "install", "on_the_cpu_device"]

_ORIGINAL_TPU_RULE = jc.original_cpu_lowering(jc.PALLAS_CALL_P, "tpu")

#: What a ``pallas_call`` with palladium's params placed on a TPU says (jax's own rule
#: would run it under jax's HLO interpreter, silently without palladium's checks).
ON_TPU_DEVICE = (
    "palladium.interpret simulates TPU kernels on the CPU device, and this pallas_call was "
    "placed on a TPU (jax's default backend on this host). Put it on the CPU: call it "
    "inside `with jax.default_device(jax.devices('cpu')[0]):` with operands not committed "
    "to the TPU (or jax.device_put them onto the CPU; after set_tpu_interpret_mode, "
    "jax.config.update('jax_default_device', jax.devices('cpu')[0])). "
    "force_tpu_interpret_mode, the pytest plugin and predict do this themselves; to run "
    "the kernel on the chip instead, pass interpret=False.")


def _pallas_call_tpu_lowering(ctx: Any, *in_nodes: Any, interpret: Any, **params: Any) -> Any:
    """On a TPU: palladium's params are refused with :data:`ON_TPU_DEVICE`; anything else
    is jax's own rule (Mosaic, or jax's interpreters)."""
    if isinstance(interpret, InterpretParams):
        raise ConfigError(ON_TPU_DEVICE)
    return _ORIGINAL_TPU_RULE(ctx, *in_nodes, interpret=interpret, **params)


@contextlib.contextmanager
def on_the_cpu_device() -> Iterator[None]:
    """Where jax's default backend is a TPU, make the CPU the default device (palladium
    simulates there); elsewhere nothing."""
    if jax.default_backend() == "tpu":
        with jax.default_device(jax.devices("cpu")[0]):
            yield
    else:
        yield


def _traced_chip() -> tuple[str, int]:
    """The TPU a kernel traced on a CPU is traced for (jax's ``tpu_info`` asks, e.g. jax's
    own ``pltpu.emit_pipeline`` for the tiling): the chip of the forced palladium interpret
    mode when it names one, else :data:`DEFAULT_CHIP`. Its device kind and the cores per
    device jax's tables take (two on a megacore chip, else one)."""
    forced = jc.tpu_interpret_mode_config().value
    chip = getattr(forced, "chip", None) if isinstance(forced, InterpretParams) else None
    chip = chip or DEFAULT_CHIP
    return device_kind(chip), chip_record(chip).cores_per_device


def install() -> None:
    """Register the TPU-platform rule and the CPU's answer to ``tpu_info`` (idempotent)."""
    jc.register_lowering(jc.PALLAS_CALL_P, _pallas_call_tpu_lowering, platform="tpu")
    jc.answer_for_cpu(_traced_chip)
