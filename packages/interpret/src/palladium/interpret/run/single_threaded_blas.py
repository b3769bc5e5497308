"""Single-threaded BLAS while kernels are interpreted: the context every launch runs in
(the reference-counted limit itself, and why, is ``blas_limit``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from palladium.interpret.state.process_state import STATE

__all__ = ["blas_threads", "single_threaded_blas"]

@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Within this context every BLAS library numpy uses runs one thread."""
    STATE.blas.enter()
    try:
        yield
    finally:
        STATE.blas.exit()


def blas_threads() -> int:
    """The largest current thread count of numpy's BLAS libraries (0 if none is found)."""
    counts = [lib["num_threads"] for lib in STATE.blas.controller().select(user_api="blas").info()]
    return max(counts, default=0)
