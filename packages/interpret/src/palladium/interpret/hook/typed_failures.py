"""A kernel's failure as palladium's own exception at the ``pallas_call``'s caller.

A launch runs inside an XLA host callback, so jax raises its failure as
``jax.errors.JaxRuntimeError`` carrying the text alone (``state.failures`` words that
text: palladium's type and why it is not raised as such first, the failure id last).
The one Python frame between the caller and that error which palladium can own is the
function ``pl.pallas_call`` returns: wrapped here, it re-raises the recorded exception
itself, so a kernel called on its own (eagerly, also under ``jax.vmap`` or ``jax.grad``
applied eagerly) raises ``DeadlockError``, ``OutOfBoundsError``, ``DataRaceError``, ...
that a plain ``except`` catches. A kernel called from inside the user's own ``jax.jit``
(``jax.jit(call)`` too) fails in jax's dispatch of that function, past any frame of
palladium's: there the text says why and how (``errors_as_raised``).

The traceback of the re-raised exception is the caller's frames only: palladium's own
files are filtered from tracebacks as jax filters its own (``JAX_TRACEBACK_FILTERING=off``
shows them; where in palladium the launch failed stays readable as
``exc.launch_traceback``). Measured on stderr of a script calling a broken kernel
eagerly, before -> after: an out-of-bounds index map 53 -> 7 lines (before: the message
twice among 27 frames of palladium and jax), a deadlock 61 -> 7, a race 79 -> 9.
"""

from __future__ import annotations

import atexit
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import jax

from palladium.interpret import _jax_compat as jc
from palladium.interpret._jax_compat import call_site
from palladium.interpret.params import InterpretParams
from palladium.interpret.state.process_state import STATE

__all__ = ["install", "raising_typed_failures"]

# What a jit-compiled function offers beyond being called (AOT lowering and the like):
# the wrapper hands these through.
_JIT_ATTRIBUTES = ("lower", "trace", "eval_shape", "clear_cache")


def raising_typed_failures(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a ``pallas_call``'s function), with a kernel failure raised as the
    palladium exception it is instead of jax's ``JaxRuntimeError`` wrapper."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (jax.errors.JaxRuntimeError, ValueError) as wrapper:
            failure = STATE.failures.claim(str(wrapper))
            if failure is None:
                raise
        raise failure

    boundary = call_site.api_boundary(call)
    for name in _JIT_ATTRIBUTES:
        if hasattr(fn, name):
            setattr(boundary, name, getattr(fn, name))
    return boundary


def _under_palladium(interpret: Any) -> bool:
    return (isinstance(interpret, InterpretParams)
            or isinstance(jc.tpu_interpret_mode_config().value, InterpretParams))


def _pallas_call_of(pallas_call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(pallas_call)
    def palladium_pallas_call(*args: Any, **kwargs: Any) -> Any:
        fn = pallas_call(*args, **kwargs)
        if _under_palladium(kwargs.get("interpret")):
            return raising_typed_failures(fn)
        return fn

    return palladium_pallas_call


def install() -> None:
    """``pl.pallas_call`` returns functions that raise typed failures when the kernel
    runs under palladium (``interpret=InterpretParams(...)`` or a forced interpret mode
    when it is made); palladium's frames are left out of jax-filtered tracebacks; at exit
    the launches still running are waited for and a failed one is not raised again by
    jax's exit barriers."""
    call_site.hide_frames_of(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if call_site.wrap_pallas_call(_pallas_call_of):  # (the first install only)
        # Registered after jax's own exit barriers, so run before them (atexit is LIFO).
        atexit.register(_at_exit)


def _at_exit() -> None:
    """Before jax's exit barriers: wait for the launches still running (a host callback
    of palladium's that runs while the interpreter finalizes aborts the process: 5 of 5
    runs of two un-awaited 2-device launches ended by SIGABRT, "terminate called without
    an active exception"), then drop the failed launches jax would raise again."""
    deadline = time.monotonic() + _EXIT_WAIT_SECONDS
    call_site.wait_for_cpu_computations(deadline)  # those whose results are alive
    if STATE.rendezvous.arrivals:  # multi-device launches ran: some may still come
        _wait_for_launches(deadline)
    call_site.forget_failed_runtime_tokens(_was_raised)


#: How long the exit waits for launches still running (a launch waiting for a device
#: that never comes would wait its whole rendezvous_timeout), and how long none must be
#: running before it ends (a launch XLA dispatched may not have reached its callback).
_EXIT_WAIT_SECONDS = 30.0
_EXIT_SETTLE_SECONDS = 0.05


def _wait_for_launches(deadline: float) -> None:
    """Until no launch has run or met for ``_EXIT_SETTLE_SECONDS`` (launches whose
    results are gone, which ``wait_for_cpu_computations`` cannot wait for), or
    ``deadline``."""
    now = time.monotonic()
    idle_since = now
    while now < deadline and now - idle_since < _EXIT_SETTLE_SECONDS:
        time.sleep(0.005)
        now = time.monotonic()
        if len(STATE.rendezvous) or STATE.blas.depth:
            idle_since = now


def _was_raised(text: str) -> bool:
    """Whether a failed computation's error is a kernel failure, which reached the
    caller when it read the results: jax's exit barriers need not raise it again (each
    raised it once more: 44 lines of stderr after a caught 2-device deadlock, issue 42
    item 11)."""
    return STATE.failures.carries_id(text)
