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
from collections.abc import Callable, Sequence
from typing import Any

from palladium.interpret.errors import (
    TpuCompilerError,
    TpuLoweringError,
    TpuLoweringWarning,
    TpuResourceError,
)
from palladium.interpret.fidelity import lowering_check, tpu_compiler
from palladium.interpret.kernel import PreparedKernel

__all__ = ["check_with_compiler"]


def check_with_compiler(kernel: PreparedKernel, bind: Callable[..., Any],
                        avals_in: Sequence[Any], *, chip: str, mesh_axes: dict[str, int],
                        check_lowering: bool, check_memory: bool) -> tpu_compiler.Verdict:
    """Compile ``kernel`` for ``chip`` with libtpu; raise what the compiler says as
    palladium's typed error (its resource half only with ``check_memory``, the rest only
    with ``check_lowering``); return the verdict."""
    verdict = tpu_compiler.compile_verdict(bind, avals_in, chip=chip, mesh_axes=mesh_axes)
    if verdict.accepted:
        return verdict
    where = f"kernel '{kernel.name}'"
    if kernel.launch_location:
        where += f" (pallas_call at {kernel.launch_location})"
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
        "array's); InterpretParams(check_lowering=False) skips this check.")
