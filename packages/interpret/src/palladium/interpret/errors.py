"""The interpreter's exception types.

Every failure of a simulated kernel is a ``SimulationError``: the simulator's own
(``OutOfBoundsError``, ``DataRaceError``, ``DeadlockError``, ``SemaphoreLeakError``,
re-exported here) and the interpreter's (below). Messages name the kernel, the operand
as the kernel names it, the grid point, the core and the source line.
"""

from __future__ import annotations

from palladium.shared_memory import (
    DataRaceError,
    DeadlockError,
    OutOfBoundsError,
    SemaphoreLeakError,
    SimulationError,
)

__all__ = [
    "DataRaceError",
    "DeadlockError",
    "DmaOrderDependenceError",
    "KernelError",
    "OutOfBoundsError",
    "RendezvousTimeoutError",
    "RevisitError",
    "SemaphoreLeakError",
    "SimulationError",
    "UnsupportedPrimitiveError",
    "UnsupportedFeatureError",
]


class RevisitError(SimulationError):
    """An output block was written, left, and then visited again.

    On a TPU the block is copied back to HBM when the grid moves off it, so coming
    back to it later starts from stale data: the earlier result is lost.
    """


class UnsupportedPrimitiveError(SimulationError):
    """The kernel uses a primitive the interpreter has no rule for and cannot bind."""


class UnsupportedFeatureError(SimulationError):
    """The kernel uses a Pallas feature the interpreter does not model (yet)."""


class KernelError(SimulationError):
    """A kernel invariant a TPU enforces at compile time was violated.

    For example parallel dimensions that are not a prefix of the grid, an HBM operand
    read directly with ``ref[...]``, or an HBM allocation in ``run_scoped``.
    """


class RendezvousTimeoutError(SimulationError):
    """Some device of a multi-device launch never reached the launch.

    The devices of a launch under ``shard_map`` are simulated together; each device's
    host callback waits for the others (``InterpretParams.rendezvous_timeout``).
    """


class DmaOrderDependenceError(SimulationError):
    """The kernel's outputs differ between two legal DMA completion orders.

    Raised with ``InterpretParams(dma_order="random", dma_order_trials=k)``; the message
    names the outputs and devices that differ and the conflicting accesses (DMAs and
    source lines) the race detector found in the run that disagreed.
    """
