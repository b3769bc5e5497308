"""Single-threaded BLAS while kernels are interpreted (through threadpoolctl).

The matrix products of an interpreted kernel are small (one block, e.g. 128x128x128:
~0.05 ms on one core). A threaded BLAS splits such a product over all cores anyway, and
inside a host callback its worker threads compete with XLA's own threads (and with
whatever else runs on the machine): measured on a 2-core machine under load, one
128^3 f32 ``np.matmul`` took 10-25 ms that way instead of 0.05 ms. So each launch
runs with one BLAS thread and restores the previous counts afterwards.

threadpoolctl finds the BLAS libraries numpy loaded (OpenBLAS, MKL, BLIS; on Linux,
macOS and Windows) and sets their thread counts. The counts are process-wide, so the
limit is reference counted over the launches in flight (several devices or kernels may
run at once): the first launch in sets one thread, the last one out restores the
counts. threadpoolctl lets only one thread at a time set a process-wide pool's size (it
silently ignores the others), and launches run on XLA's callback threads, so the limit
takes that control while it sets or restores the counts and gives it back after. (A BLAS
built on OpenMP keeps a limit per thread: there the limit holds in the thread that runs
the launch, which is where a single-core launch computes.) The thread count can change the last bits of a product (a BLAS may pick other
kernels or blockings for other thread counts), so the products of an interpreted kernel
are those of the single-threaded BLAS.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy  # noqa: F401  (loads numpy's BLAS, so that threadpoolctl finds it)
from threadpoolctl import OpenBLASController, ThreadpoolController

__all__ = ["SingleThreadLimit"]


def _release_control() -> None:
    """Let any thread set OpenBLAS's process-wide pool next (recent threadpoolctl gives
    that right to the first thread that sets it; older versions have no such rule)."""
    clear = getattr(OpenBLASController, "clear_controlling_thread", None)
    if clear is not None:
        clear(force=True)


class SingleThreadLimit:
    """Reference-counted "one BLAS thread" over the launches in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._controller: ThreadpoolController | None = None
        self._limiter: Any = None

    def controller(self) -> ThreadpoolController:
        # Made once, on first use: it scans the loaded libraries (about a millisecond).
        if self._controller is None:
            self._controller = ThreadpoolController()
        return self._controller

    def enter(self) -> None:
        with self._lock:
            if self._depth == 0:
                _release_control()
                self._limiter = self.controller().limit(limits=1, user_api="blas")
                _release_control()
            self._depth += 1

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Within this context every BLAS library numpy uses runs one thread (the context
        every launch runs in)."""
        self.enter()
        try:
            yield
        finally:
            self.exit()

    def threads(self) -> int:
        """The largest current thread count of numpy's BLAS libraries (0 if none is found)."""
        counts = [lib["num_threads"] for lib in self.controller().select(user_api="blas").info()]
        return max(counts, default=0)

    @property
    def depth(self) -> int:
        """How many launches hold the limit now (0: none)."""
        return self._depth

    def exit(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._limiter is not None:
                _release_control()
                self._limiter.restore_original_limits()
                _release_control()
                self._limiter = None
