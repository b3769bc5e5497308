"""Exceptions raised by the simulated TPU slice.

Every simulated-hardware fault is a :class:`SimulationError`; messages name the buffer
or semaphore as the user named it, the core ("device 0 core 1") and the caller's site.
"""

from __future__ import annotations

from palladium.race_detect import ConfigError, PalladiumError, SimulationError

__all__ = [
    "ConfigError",
    "DeadlockError",
    "OutOfBoundsError",
    "PalladiumError",
    "PeerProcessError",
    "SemaphoreLeakError",
    "SimulationError",
    "UninitializedReadError",
    "UninitializedReadWarning",
    "WatchdogError",
    "core_name",
]


class OutOfBoundsError(SimulationError, IndexError):
    """A read, write, swap or DMA touched elements outside a buffer's bounds."""


class DeadlockError(SimulationError):
    """Every simulated core is blocked and no pending DMA can make progress."""


class WatchdogError(SimulationError):
    """A run went on longer than its watchdog budget: some core loops (a spin-wait that
    nothing will end) while the others wait or loop too. The message gives each core's
    state and source line."""


class UninitializedReadError(SimulationError):
    """A read of memory nothing wrote (no store, DMA, block copy or input), or an output
    region nothing wrote by the end of the launch. On a TPU those bytes are whatever an
    earlier kernel left there."""


class UninitializedReadWarning(UserWarning):
    """``uninitialized_reads="warn"``: the message an ``UninitializedReadError`` would
    carry, as a warning (once per buffer and source line per launch)."""


class SemaphoreLeakError(SimulationError):
    """A semaphore still has a non-zero count when its scope (or the kernel) ends."""


def core_name(core: tuple[int, int]) -> str:
    """The user-facing name of a core: ``device 0 core 1``."""
    return f"device {core[0]} core {core[1]}"


def at_site(site: object) -> str:
    """`` at <site>`` or nothing, for appending to messages."""
    return "" if site is None else f" at {site}"


class PeerProcessError(SimulationError):
    """A launch split over several processes (``Partition``) cannot go on because another
    process failed, died, or never reached the launch. The message names the process and
    why; every surviving process raises it instead of waiting forever."""
