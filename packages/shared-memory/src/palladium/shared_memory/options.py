"""The simulator's option vocabulary, defined once for ``Simulation`` and ``InterpretParams``.

Each option is a ``Literal`` type alias whose values are the choices; :data:`CHOICES`
lists them by the simulator's option name, and :class:`SimulationOptions` bundles one
launch's choices (validated). ``palladium.interpret.InterpretParams`` keeps jax's field
names (``out_of_bounds_reads``, ``uninitialized_memory``, ``buffer_bounds``) but types
and checks them with these aliases and hands the simulator a ``SimulationOptions``.

>>> SimulationOptions(bounds="padded").bounds
'padded'
>>> SimulationOptions(dma_execution_mode="later")
Traceback (most recent call last):
...
palladium.race_detect.errors.ConfigError: dma_execution_mode must be one of ('on_wait', 'eager'), got 'later'
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, TypeAlias, get_args

from palladium.race_detect import ConfigError, OnRace
from palladium.shared_memory.tpu_facts import GENERATION_DEFAULT, TILING_DEFAULT

__all__ = [
    "CHOICES",
    "Bounds",
    "DmaExecutionMode",
    "DmaOrder",
    "OnRace",
    "OutOfBounds",
    "SimulationOptions",
    "Uninitialized",
    "UninitializedReads",
    "check_choice",
    "check_on_race",
]

DmaExecutionMode: TypeAlias = Literal["on_wait", "eager"]
"""When a DMA executes: when someone waits on its semaphore, or when it starts."""

DmaOrder: TypeAlias = Literal["issue", "random"]
"""The order pending DMAs complete in: issue order, or any legal order from the seed."""

OutOfBounds: TypeAlias = Literal["raise", "uninitialized"]
"""An out-of-bounds read raises ``OutOfBoundsError`` or reads the uninitialised fill."""

Uninitialized: TypeAlias = Literal["nan", "zero"]
"""The fill of fresh memory: NaN / max int / True, or zero (``tpu_facts``)."""

Bounds: TypeAlias = Literal["logical", "padded"]
"""Where a buffer ends: its array shape, or its TPU tile-padded shape."""

UninitializedReads: TypeAlias = Literal["off", "on_use", "warn", "raise"]
"""What a read of never-written memory does: nothing (nothing is tracked); nothing by
itself, the client reports where what it read is used (``"on_use"``: the buffers track
what is initialised, and the padding a block copy brings in past its source's end counts
as uninitialised); a warning; or ``UninitializedReadError``."""

CHOICES: dict[str, tuple[str, ...]] = {
    "dma_execution_mode": get_args(DmaExecutionMode),
    "dma_order": get_args(DmaOrder),
    "out_of_bounds": get_args(OutOfBounds),
    "uninitialized": get_args(Uninitialized),
    "bounds": get_args(Bounds),
    "uninitialized_reads": get_args(UninitializedReads),
}
"""The allowed values of each option, by the simulator's option name."""

_ON_RACE_POLICIES = ("raise", "warn", "collect")


def check_choice(option: str, value: Any, *, name: str | None = None) -> None:
    """``ConfigError`` unless ``value`` is one of option ``option``'s choices; the message
    names the option as ``name`` (the caller's field name, default ``option``)."""
    allowed = CHOICES[option]
    if value not in allowed:
        raise ConfigError(f"{name or option} must be one of {allowed}, got {value!r}")


def check_on_race(value: Any, *, name: str = "on_race") -> None:
    """``ConfigError`` unless ``value`` is an ``on_race`` policy or a callable."""
    if not (value in _ON_RACE_POLICIES or callable(value)):
        raise ConfigError(
            f"{name} must be one of {_ON_RACE_POLICIES} or a callable taking a RaceReport, "
            f"got {value!r}"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimulationOptions:
    """How one simulated launch behaves (see the aliases above for each choice)."""

    seed: int = 0
    detect_races: bool = False
    on_race: OnRace = "raise"
    dma_execution_mode: DmaExecutionMode = "on_wait"
    dma_order: DmaOrder = "issue"
    out_of_bounds: OutOfBounds = "raise"
    uninitialized: Uninitialized = "nan"
    bounds: Bounds = "logical"
    tiling: tuple[int, int] = TILING_DEFAULT
    tpu_generation: int = GENERATION_DEFAULT
    watchdog: float | None = None  # seconds a run may take before WatchdogError (None: any)
    uninitialized_reads: UninitializedReads = "off"
    #: False: floating-point buffers hold no data (a zero-stride array of the fill):
    #: reads give the fill, writes only check their bounds. Copies, DMAs, semaphores,
    #: bounds and bytes are simulated as ever; for predictions that look at shapes only.
    keep_float_data: bool = True

    def __post_init__(self) -> None:
        for option in CHOICES:
            check_choice(option, getattr(self, option))
