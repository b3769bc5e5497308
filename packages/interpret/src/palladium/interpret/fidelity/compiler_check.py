"""The TPU compiler's verdict as palladium's typed errors (see ``tpu_compiler``).

* does not fit (the compiler's "Ran out of memory in memory space vmem", E1001, "would
  exceed memory") -> ``TpuResourceError`` with the compiler's numbers, whole;
* Mosaic, verification and jax's TPU lowering failures -> ``TpuLoweringError`` at the
  kernel line (the MLIR location the compiler names, or the equation jax was lowering),
  the compiler's message whole;
* anything else -> ``TpuCompilerError``, message whole.

Each message names the checker that spoke (``libtpu 0.0.42.1 (jax 0.10.2)``). A failure
that is a limit of jax 0.10.x's lowering rather than the kernel's (as the approximate
check knows them) is a ``TpuLoweringWarning``, never an error.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import (
    TpuCompilerError,
    TpuLoweringError,
    TpuLoweringWarning,
    TpuResourceError,
)
from palladium.interpret.fidelity import lowering_check, tpu_compiler
from palladium.interpret.kernel.prepared_kernel import PreparedKernel
from palladium.shared_memory import MemorySpace

__all__ = ["check_with_compiler"]


def check_with_compiler(kernel: PreparedKernel, bind: Callable[..., Any],
                        avals_in: Sequence[Any], *, chip: str, mesh_axes: dict[str, int],
                        check_lowering: bool, check_memory: bool,
                        call: Mapping[str, Any] | None = None) -> tpu_compiler.Verdict | None:
    """Compile ``kernel`` for ``chip`` with libtpu; raise what the compiler says as
    palladium's typed error (its resource half only with ``check_memory``, the rest only
    with ``check_lowering``); return the verdict (None: not compiled, see
    ``compiler_would_abort``). ``call``: the ``pallas_call``'s parameters (see
    ``tpu_compiler.compile_verdict``)."""
    where = kernel.named("pallas_call at ")
    aborts = compiler_would_abort(kernel)
    if aborts is not None:
        warnings.warn(
            f"{where}: not compiled for TPU {chip}: {aborts}; the TPU compiler aborts the "
            "process on such a kernel (a failed check in its pipeline emitter), so the "
            "kernel runs unchecked and its simulation reports the block.",
            TpuLoweringWarning, stacklevel=3)
        return None
    host_in = [False] * (len(avals_in) - len(kernel.inputs)) + [
        info.space == MemorySpace.HOST for info in kernel.inputs]
    host_out = [info.space == MemorySpace.HOST for info in kernel.outputs]
    verdict = tpu_compiler.compile_verdict(bind, avals_in, chip=chip, mesh_axes=mesh_axes,
                                           host=(host_in, host_out), call=call)
    if verdict.accepted:
        return verdict
    if verdict.kind in ("crashed", "timeout"):
        warnings.warn(
            f"{where}: the TPU compiler check for TPU {chip} could not decide "
            f"({verdict.message}); the kernel runs unchecked. A TPU's compiler ends the "
            "process the same way on this kernel.", TpuLoweringWarning, stacklevel=3)
        return verdict
    said = f"the TPU compiler ({verdict.checker}, topology {verdict.topology}) says:"
    if verdict.kind == "resource":
        if check_memory:
            raise TpuResourceError(
                f"{where} does not fit on TPU {chip}: {said}\n{verdict.message}\n"
                "Use smaller blocks, fewer buffers (pipeline_mode=pl.Buffered(1)) or raise "
                "pltpu.CompilerParams(vmem_limit_bytes=...); "
                "InterpretParams(check_memory=False) skips this check.")
        return verdict
    if not check_lowering:
        return verdict
    primitive: object = None
    if verdict.error is not None:
        if lowering_check.unknown_everywhere(verdict.error):
            return verdict  # the interpreter's UnsupportedPrimitiveError says it better
        not_ours = lowering_check.not_the_kernels_fault(kernel, verdict.error)
        if not_ours is not None:
            warnings.warn(
                f"{where}: the TPU compiler check for TPU {chip} could not decide "
                f"({not_ours}); the kernel runs unchecked. {said}\n{verdict.message}",
                TpuLoweringWarning, stacklevel=3)
            return verdict
        line, primitive = lowering_check.kernel_line(kernel, verdict.error)
        at = f" at {line} ({primitive})" if line else ""
    else:
        at = f" at {verdict.location}" if verdict.location else ""
    if verdict.kind == "other":
        raise TpuCompilerError(
            f"{where} does not compile for TPU {chip}{at}: {said}\n{verdict.message}\n"
            "InterpretParams(compile_check='approximate') uses palladium's approximate "
            "checks instead.")
    raise TpuLoweringError(
        f"{where} does not compile for TPU {chip}{at}: {said}\n{verdict.message}\n"
        "A TPU rejects this kernel at compile time. Change the kernel as the compiler asks "
        "(supported dtypes for each operation on this chip, layouts Mosaic can infer, "
        "blocks whose last two dimensions are divisible by 8 and 128 or equal to the "
        "array's); InterpretParams(check_lowering=False) skips this check."
        + lowering_check.print_hint(primitive))


def compiler_would_abort(kernel: PreparedKernel) -> str | None:
    """Why libtpu would abort the process compiling ``kernel``, or None.

    The compiler's pipeline emitter computes the first grid point's block windows at
    compile time and fails a check (``math_util.cc: Check failed: CouldLeS32``, then
    ``abort()``) when one starts past its array: a block index that is a constant, or a
    computation of the grid indices only, out of bounds at grid point 0. palladium's
    simulation reports such a block as an ``OutOfBoundsError`` naming it instead.
    """
    grid = tuple(kernel.grid_mapping.grid)
    if not all(isinstance(g, int) for g in grid):
        return None
    point = (0,) * len(grid)
    for info in (*kernel.inputs, *kernel.outputs):
        if info.in_hbm or not info.dims:
            continue
        block = _static_block_index(info.index_map, len(grid))
        if block is None:
            continue
        try:
            region = info.region(block)
        except (ValueError, TypeError, IndexError):
            continue
        for axis, (r, size) in enumerate(zip(region, info.array_shape)):
            start = r.start if isinstance(r, slice) else r
            if isinstance(start, int) and not 0 <= start < max(size, 1):
                return (f"block {block} of '{info.name}' starts at {start} on axis {axis} of "
                        f"its {info.array_shape} array at grid point {point}")
    return None


def _static_block_index(closed: Any, n_grid: int) -> tuple[int, ...] | None:
    """The block index map's value at grid point 0, when it reads no scalar-prefetch
    operand (the compiler folds it then), else None."""
    jaxpr = closed.jaxpr
    used = {id(v) for eqn in jaxpr.eqns for v in eqn.invars} | {id(v) for v in jaxpr.outvars}
    if any(id(v) in used for v in jaxpr.invars[n_grid:]):
        return None
    args = [np.int32(0)] * n_grid + [None] * (len(jaxpr.invars) - n_grid)
    try:
        values = jc.eval_jaxpr(jaxpr, closed.consts, *args)
        return tuple(int(np.asarray(v)) for v in values)
    except Exception:  # noqa: BLE001  (a map this cannot fold: the compiler decides)
        return None
