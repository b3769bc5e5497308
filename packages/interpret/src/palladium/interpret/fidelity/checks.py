"""The fidelity checks of one ``pallas_call``, run when it is lowered (before it runs)."""

from __future__ import annotations

import math
from typing import Any

from palladium.interpret import _jax_compat as jc
from palladium.interpret.fidelity.lowering_check import check_lowering
from palladium.interpret.fidelity.memory_budget import check_fits, measure
from palladium.interpret.kernel import PreparedKernel
from palladium.interpret.params import InterpretParams

__all__ = ["check_kernel"]


def check_kernel(kernel: PreparedKernel, params: InterpretParams, ctx: Any) -> None:
    """Count ``kernel``'s memory (``kernel.memory_use``) and run the checks ``params``
    asks for (``params.chip`` resolved): the lowering check first (its errors are the
    more basic ones), then whether the kernel fits."""
    assert params.chip is not None
    num_cores = (math.prod(kernel.mesh.shape.values()) if kernel.is_core_map
                 else params.num_cores_or_threads)
    # jax 0.10.0 has no Mosaic entry point for the check: it is skipped there.
    if params.check_lowering and jc.mosaic_lowering_available():
        check_lowering(kernel, ctx, chip=params.chip, num_cores=num_cores)
    kernel.memory_use = measure(kernel, params.chip)
    if params.check_memory:
        check_fits(kernel, kernel.memory_use)
