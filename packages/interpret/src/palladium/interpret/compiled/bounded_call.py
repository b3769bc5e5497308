"""A compiled launch's executable run under the watchdog, progress reports and Ctrl-C.

A simulated launch sees ``watchdog_timeout``, ``progress_interval`` and Ctrl-C at every
grid step (``run/grid_loop.py``). A compiled launch is one XLA executable, which cannot
be stopped once it runs: before this module, a 5 s watchdog returned after 35.9 s, when
the executable ended (issue 42, item 4). Here the executable runs on a worker thread
while the launch's thread waits for it in slices of ``_SLICE`` seconds, and

- after ``watchdog_timeout`` seconds raises ``WatchdogError`` (the executable is left to
  finish on its worker: its operands are copies, so nothing it reads is freed);
- after ``progress_interval`` seconds logs a progress report, as a simulated launch does
  (``STATE.progress``);
- on Ctrl-C (``interrupt_all``, called by the jax hook's interrupt handler) raises the
  ``LaunchInterrupted`` it is given, as a simulated launch's cores do.

A launch whose previous run took under ``INLINE_SECONDS`` runs inline on the launch's
thread: a watchdog or Ctrl-C then waits at most about that long, as its ``while``
loops, which other data could make run longer, are given a budget of iterations
(``compiled_launch._inline_budget``: twice its last run's and ``INLINE_LOOPS`` more); a
run that spends it runs again here, on the worker thread (the same results). Before the
budget, kernels with ``while`` loops always ran threaded, their operands copied: paged
attention's steady call 0.71-0.93 ms against 0.44-0.50 ms inline (2026-12-06, a shared
2-core machine; ``benchmarks/compiled_launch_bounded.py`` measured 1.66-2.13 against
1.61-2.12 ms before its executable was made ~2x faster).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

from palladium.interpret.errors import WatchdogError
from palladium.interpret.params import InterpretParams
from palladium.interpret.state.process_state import STATE

__all__ = ["INLINE_SECONDS", "bounded_call", "interrupt_all"]

#: A launch that ran for less than this runs inline next time (its loops on a budget).
INLINE_SECONDS = 0.05
_SLICE = 0.05  # seconds between two looks at the watchdog and Ctrl-C

# The registry of this module: the compiled launches waiting now (Ctrl-C cancels them)
# and the worker threads' pool (made on first use; its threads are daemons).
_WAITING: set[_Waiter] = STATE.keep(
    "bounded_calls_waiting", set(), owner=__name__,
    holds="the compiled launches waiting now (Ctrl-C cancels them)")
_LOCK = threading.Lock()
_POOL: list[concurrent.futures.ThreadPoolExecutor] = STATE.keep(
    "bounded_call_threads", [], owner=__name__,
    holds="the worker threads' pool of bounded calls (made on first use; daemons)")


class _Waiter:
    __slots__ = ("interrupted",)

    def __init__(self) -> None:
        self.interrupted: BaseException | None = None


def interrupt_all(exc: BaseException) -> None:
    """Ctrl-C: every compiled launch waiting now raises ``exc`` at its next look."""
    with _LOCK:
        for waiter in _WAITING:
            waiter.interrupted = exc


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    with _LOCK:
        if not _POOL:
            _POOL.append(concurrent.futures.ThreadPoolExecutor(
                max_workers=4, thread_name_prefix="palladium-compiled-launch"))
        return _POOL[0]


def bounded_call(call: Callable[[], Any], *, kernel_name: str, params: InterpretParams,
                 inline: bool) -> Any:
    """``call()`` (an executable's run on operands it owns), on a worker thread unless
    ``inline``, waited for under ``params``' watchdog and progress interval and Ctrl-C."""
    if inline:
        return call()
    watchdog = params.watchdog_timeout
    interval = params.progress_interval
    start = time.monotonic()
    deadline = start + watchdog if watchdog is not None else None
    future = _pool().submit(call)
    waiter = _Waiter()
    key = None if interval is None else STATE.progress.register(
        kernel_name, interval, lambda: f"  running compiled (one XLA executable) for "
                                       f"{time.monotonic() - start:.0f} s")
    with _LOCK:
        _WAITING.add(waiter)
    try:
        while True:
            timeout = _SLICE if deadline is None else max(0.0, min(_SLICE, deadline - time.monotonic()))
            try:
                return future.result(timeout)
            except concurrent.futures.TimeoutError:
                pass
            if waiter.interrupted is not None:
                raise waiter.interrupted
            if deadline is not None and time.monotonic() >= deadline:
                raise WatchdogError(
                    f"watchdog: kernel '{kernel_name}' is still running after {watchdog:g} s "
                    f"(its launch runs compiled, as one XLA executable, which finishes in "
                    f"the background). A loop that runs longer than expected, or does not "
                    f"end, is the likely cause: run the kernel with "
                    f"InterpretParams(compile_segments=False) to see where each core loops, "
                    f"or raise watchdog_timeout for a kernel that is just long.")
    finally:
        with _LOCK:
            _WAITING.discard(waiter)
        if key is not None:
            STATE.progress.unregister(key)
