"""Runtime asserts in kernels: ``pl.debug_check`` (``checkify.debug_check``).

As jax's Mosaic lowering has it: a debug check is compiled in only when
``pl.enable_debug_checks`` is on when the kernel is lowered (else it is dropped), and a
failing one halts the TPU with its message; here it raises ``DebugCheckError`` naming the
kernel, grid point, core and line, with the check's message. A plain ``checkify.check``
inside a kernel is rejected by Mosaic ("Non-debug checks are not supported by the Mosaic
backend") and jax 0.10.2 has no ``checkify`` rule for ``pallas_call`` to functionalise it:
palladium refuses it the same way.
"""

from __future__ import annotations

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import DebugCheckError, UnsupportedFeatureError
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.registry import rule

__all__: list[str] = []


@rule(jc.check_p)
def _check(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    if not eqn.params.get("debug", False):
        raise UnsupportedFeatureError(
            "checkify.check inside a kernel is not supported on a TPU: jax's Mosaic "
            "lowering rejects it (\"Non-debug checks are not supported by the Mosaic "
            "backend\") and jax's checkify cannot functionalise a pallas_call. Use "
            "pl.debug_check(condition, message) with pl.enable_debug_checks(True), or "
            f"check the kernel's inputs and outputs outside it ({ev.site(eqn)})")
    if not ev.debug_checks:
        return []
    failed, message = jc.checkify_check_parts(eqn.params["err_tree"], invals)
    if bool(np.any(np.asarray(failed))):
        raise DebugCheckError(f"pl.debug_check failed: {message} ({ev.site(eqn)})")
    return []
