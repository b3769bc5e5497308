"""The fidelity checks of one ``pallas_call``: does it compile and fit on the simulated
chip? Run when it is lowered (before it runs).

Who decides (``InterpretParams.compile_check``): the TPU compiler itself (libtpu, see
``tpu_compiler`` and ``compiler_check``) when it is installed and compiles for the chip,
else palladium's approximation: jax's Mosaic lowering (``lowering_check``) and the
VMEM/SMEM count (``memory_budget``). The count is made either way
(``kernel.memory_use``, with the compiler's VMEM figure when it spoke).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import ConfigError
from palladium.interpret.fidelity import tpu_compiler
from palladium.interpret.fidelity.compiler_check import check_with_compiler
from palladium.interpret.fidelity.lowering_check import check_lowering
from palladium.interpret.fidelity.memory_budget import check_fits, measure
from palladium.interpret.kernel.prepared_kernel import PreparedKernel
from palladium.interpret.params import InterpretParams

__all__ = ["APPROXIMATION", "check_compiles_and_fits", "uses_compiler"]

#: How reports name the checks that stand in for the compiler.
APPROXIMATION = "palladium's approximation (jax's Mosaic lowering and a VMEM/SMEM count)"


def uses_compiler(params: InterpretParams) -> bool:
    """Whether ``params`` (``chip`` resolved) has the TPU compiler decide; a
    ``ConfigError`` when it asks for the compiler (``compile_check="compiler"``) and the
    compiler cannot be had."""
    assert params.chip is not None
    if params.compile_check in ("approximate", "off"):
        return False
    if params.compile_check == "compiler":
        version = tpu_compiler.compiler_version()
        if version is None:
            raise ConfigError(
                "InterpretParams(compile_check='compiler') needs the TPU compiler (libtpu), "
                f"which is not installed: {tpu_compiler.INSTALL_COMMAND} installs the "
                "libtpu matching your jax. compile_check='auto' falls back to palladium's "
                "approximate checks without it.")
        if not tpu_compiler.can_compile_for(params.chip):
            raise ConfigError(
                f"InterpretParams(compile_check='compiler'): libtpu {version} cannot compile "
                f"for TPU {params.chip}; it compiles for "
                f"{tuple(tpu_compiler.compilable_chips())}. Use compile_check='auto' "
                "(palladium's approximate checks for this chip).")
        return True
    return tpu_compiler.can_compile_for(params.chip)


def check_compiles_and_fits(kernel: PreparedKernel, params: InterpretParams, ctx: Any, *,
                 bind: Callable[..., Any] | None = None, avals_in: Sequence[Any] = (),
                 mesh_axes: dict[str, int] | None = None,
                 call: Mapping[str, Any] | None = None) -> None:
    """Count ``kernel``'s memory (``kernel.memory_use``) and run the checks ``params``
    asks for (``params.chip`` resolved): the TPU compiler's, or the approximation's
    lowering check first (its errors are the more basic ones), then whether it fits.

    ``bind`` binds the kernel's primitive again (with ``interpret=False``) for the
    compiler, with operands ``avals_in`` per device, under a mesh of ``mesh_axes``;
    ``call`` holds the parameters it binds with (a known call's verdict is found by them).
    """
    assert params.chip is not None
    use = measure(kernel, params.chip)
    kernel.memory_use = use
    if params.compile_check == "off" or not (params.check_lowering or params.check_memory):
        return
    if bind is not None and uses_compiler(params):
        verdict = check_with_compiler(
            kernel, bind, avals_in, chip=params.chip, mesh_axes=mesh_axes or {},
            check_lowering=params.check_lowering, check_memory=params.check_memory,
            call=call)
        if verdict is not None and verdict.kind in ("accepted", "resource"):
            kernel.memory_use = dataclasses.replace(
                use, checker=verdict.checker, compiler_vmem_bytes=verdict.vmem_bytes)
            return
        # The compiler did not get as far as placing the kernel in memory (it was not
        # handed the kernel, or stopped at a lowering failure check_lowering=False lets
        # through): whether it fits is the approximation's to say.
        if params.check_memory:
            check_fits(kernel, use)
        return
    num_cores = (math.prod(kernel.mesh.shape.values()) if kernel.is_core_map
                 else params.num_cores_or_threads)
    # jax 0.10.0 has no Mosaic entry point: only the approximation's own rules run there.
    if params.check_lowering:
        check_lowering(kernel, ctx, chip=params.chip, num_cores=num_cores,
                       mosaic=jc.mosaic_lowering_available())
    if params.check_memory:
        check_fits(kernel, use)
