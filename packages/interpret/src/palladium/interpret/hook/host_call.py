"""``host_call``: the host callback a launch lowers to, without jax's operand transfer.

``jax.pure_callback`` on CPU first ``device_put``s every operand onto CPU device 0 and
only then calls the Python function. A copy that is not zero-copy (above ~100 KiB) is
done by XLA's CPU client on its thread pool and waited for. Under a multi-device
``shard_map`` the device callbacks occupy those threads while they wait in palladium's
rendezvous for each other, so the copies of the devices still arriving can starve and the
launch deadlocks (8 devices, 256 KiB per device was enough). ``host_call`` lowers to the
same XLA FFI host callback, but hands the function the operands as the handler received
them, on the device's own thread (the handler's numpy copies), copied again before the
function sees them (a launch's exception and its traceback may outlive the call).

With ``views=True`` (a single device's launch) it lowers to palladium's own FFI handler
(``ffi_callback``): the function gets read-only views of XLA's buffers, without the
handler's copy, valid during the call only, and copies what it keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.hook import ffi_callback
from palladium.interpret.state.failures import is_recorded

HOST_CALL_P = jc.Primitive("palladium_host_call")
HOST_CALL_P.multiple_results = True


def host_call(fn: Callable[..., Sequence[np.ndarray]], out_shapes: Sequence[Any],
              *args: Any, views: bool = False) -> list[Any]:
    """``fn(*numpy copies of args)`` on the host, once per device under ``shard_map``;
    ``views``: ``fn`` gets the views themselves and copies what it keeps past the call.

    ``fn`` returns one array per entry of ``out_shapes`` (``jax.ShapeDtypeStruct``s).
    Only lowerable on CPU; the interpreted kernel is pure, so no effect is declared.
    """
    out_avals = tuple(jc.ShapedArray(tuple(s.shape), np.dtype(s.dtype)) for s in out_shapes)
    return HOST_CALL_P.bind(*args, fn=fn, out_avals=out_avals, views=views)


def _abstract_eval(*avals: Any, fn: Any, out_avals: tuple[Any, ...], views: bool) -> list[Any]:
    del avals, fn, views
    return list(out_avals)


def _lowering(ctx: Any, *operands: Any, fn: Any, out_avals: tuple[Any, ...],
              views: bool) -> Any:
    del out_avals

    if views and ffi_callback.supports([*ctx.avals_in, *ctx.avals_out]) and ffi_callback.available():
        return ffi_callback.lower_ffi_callback(ctx, fn, operands)

    def callback(*given: np.ndarray) -> tuple[np.ndarray, ...]:
        try:
            if views:
                return tuple(fn(*given))
            return tuple(fn(*[np.array(v, copy=True) for v in given]))
        except Exception as error:
            if not is_recorded(error):
                raise
            # A kernel's failure: its text names its type and how to get it typed; the
            # frames of palladium's simulation would come before it in jax's error.
            failure = error
        raise failure.with_traceback(None)

    return jc.emit_cpu_host_callback(ctx, callback, operands)


HOST_CALL_P.def_abstract_eval(_abstract_eval)
jc.register_lowering(HOST_CALL_P, _lowering, platform="cpu", cacheable=False)
