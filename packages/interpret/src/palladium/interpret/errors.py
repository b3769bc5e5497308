"""The interpreter's exception types.

Every exception the interpreter raises is a ``PalladiumError``. Every failure of a
simulated kernel is a ``SimulationError``: the simulator's own (``OutOfBoundsError``,
``DataRaceError``, ``DeadlockError``, ``SemaphoreLeakError``,
``UninitializedReadError``, re-exported here) and the
interpreter's (below); a parameter it does not accept is a ``ConfigError`` (a
``ValueError``). Messages name the kernel, the operand
as the kernel names it, the grid point, the core and the source line.
"""

from __future__ import annotations

import jax

from palladium.shared_memory import (
    ConfigError,
    DataRaceError,
    DeadlockError,
    OutOfBoundsError,
    PalladiumError,
    PeerProcessError,
    SemaphoreLeakError,
    SimulationError,
    UninitializedReadError,
    UninitializedReadWarning,
    WatchdogError,
)

__all__ = [
    "ConfigError",
    "DataRaceError",
    "DebugCheckError",
    "DeadlockError",
    "DmaOrderDependenceError",
    "DynamicParallelDimensionError",
    "InvalidKernelError",
    "KernelError",
    "OutOfBoundsError",
    "PalladiumError",
    "PeerProcessError",
    "ProcessMismatchError",
    "RendezvousTimeoutError",
    "RevisitError",
    "SemaphoreLeakError",
    "SimulationError",
    "TpuCompilerError",
    "TpuLoweringError",
    "TpuLoweringWarning",
    "TpuResourceError",
    "UnsupportedPrimitiveError",
    "UnsupportedFeatureError",
    "UninitializedReadError",
    "UninitializedReadWarning",
    "UninitializedUseError",
    "WatchdogError",
]


class UninitializedUseError(UninitializedReadError):
    """``uninitialized_reads="on_use"`` (the default): a value derived from
    uninitialised memory (a scratch or output block nothing wrote, the padding of a
    partial edge block) decided something -- a branch, a loop, an index, a DMA or
    semaphore operand -- or reached an output that the launch returns. The message names
    where it was read, where it was used, the operand, region, grid point and core, and
    what to change. Data that is masked away or overwritten is never reported."""


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


class InvalidKernelError(KernelError, ValueError):
    """A kernel that is wrong whatever its inputs, found when it is prepared (at trace
    time, before any launch), as Mosaic would reject it when compiling: a direct read or
    write of an HBM ref, an HBM allocation in ``run_scoped``.

    Also a ``ValueError``, the type jax's TPU interpreter raises for these."""


class DynamicParallelDimensionError(KernelError, jax.errors.ConcretizationTypeError):
    """A grid dimension with parallel semantics has a size known only at run time.

    The cores split a parallel dimension when the kernel is compiled, so its size must
    be static. Also a ``jax.errors.ConcretizationTypeError``, as jax raises."""

    def __init__(self, message: str) -> None:
        # Not ConcretizationTypeError's (tracer, context) constructor: there is no tracer.
        Exception.__init__(self, message)


class RendezvousTimeoutError(SimulationError):
    """Some device of a multi-device launch never reached the launch.

    The devices of a launch under ``shard_map`` are simulated together; each device's
    host callback waits for the others (``InterpretParams.rendezvous_timeout``).
    """


class ProcessMismatchError(KernelError):
    """The processes of a ``jax.distributed`` run reached different launches: another
    kernel, the same kernel with other operands, or another ``random_seed``.

    A launch split over processes is one simulation: every process must run the same
    kernels, with the same ``InterpretParams(random_seed=...)``, in the same order.
    """


class DmaOrderDependenceError(SimulationError):
    """The kernel's outputs differ between two legal DMA completion orders.

    Raised with ``InterpretParams(dma_order="random", dma_order_trials=k)``; the message
    names the outputs and devices that differ and the conflicting accesses (DMAs and
    source lines) the race detector found in the run that disagreed.
    """


# --- jax's wording --------------------------------------------------------------------
# Tests written against jax's TPU interpreter match these phrases (``assertRaisesRegex``),
# so palladium's messages contain them next to their own details. The out-of-bounds
# access phrases ("Out-of-bounds read of", "... write of", "... masked swap of") are
# palladium.shared_memory's, which words those errors.

JAX_HBM_IN_RUN_SCOPED = "Cannot allocate HBM in `run_scoped`."


def jax_hbm_reference_phrase(primitive_name: str) -> str:
    """jax's sentence for a direct access of an HBM ref by ``primitive_name``."""
    return (f"{primitive_name}: Buffers with a memory space of HBM or ANY cannot be "
            f"referenced directly. Instead, use `pltpu.sync_copy` or `pltpu.async_copy`.")


def jax_block_index_phrase(block: tuple[int, ...], kind: str, name: str,
                           point: tuple[int, ...]) -> str:
    """jax's phrase for a block of input/output (``kind``) ``name`` out of bounds."""
    return f'Out-of-bounds block index {block} for {kind} "{name}" in iteration {point}'


def jax_revisit_phrase(block: tuple[int, ...], output: int, point: tuple[int, ...]) -> str:
    """jax's phrase for output number ``output`` revisiting ``block`` at ``point``."""
    return f"Revisited block {block} of output {output} in iteration {point}"


class DebugCheckError(KernelError):
    """A ``pl.debug_check`` (``checkify.debug_check``) in a kernel failed, with debug
    checks enabled (``pl.enable_debug_checks``); a TPU halts on it."""


class TpuResourceError(KernelError):
    """The kernel needs more VMEM or SMEM per core than the TPU it simulates gives it.

    Said by the TPU compiler itself when libtpu is installed (its numbers, whole), else
    checked before the kernel runs from what the compiled kernel certainly holds (see
    ``palladium.interpret.fidelity.memory_budget``); a TPU fails to compile such a kernel
    ("Ran out of memory in memory space vmem").
    """


class TpuLoweringError(KernelError):
    """The TPU compiler (libtpu's Mosaic passes, when installed) or jax's Mosaic lowering
    (its front end, always) rejects the kernel.

    The message keeps Mosaic's own whole and names the kernel line it was lowering.
    """


class TpuCompilerError(KernelError):
    """The TPU compiler (libtpu, ``InterpretParams(compile_check=...)``) rejects the
    kernel for a reason that is neither a resource nor a lowering failure; the message
    keeps the compiler's whole."""


class TpuLoweringWarning(UserWarning):
    """The lowering check could not decide: Mosaic failed for a reason that is not the
    kernel's (a jax 0.10.x limit, such as ``vmap`` of a kernel with ``pl.ANY`` operands)."""
