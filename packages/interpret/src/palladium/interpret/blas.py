"""Single-threaded BLAS while kernels are interpreted.

The matrix products of an interpreted kernel are small (one block, e.g. 128x128x128:
~0.05 ms on one core). OpenBLAS splits such a product over all cores anyway, and
inside a host callback its worker threads compete with XLA's own threads (and with
whatever else runs on the machine): measured on a 2-core machine under load, one
128^3 f32 ``np.matmul`` took 10-25 ms that way instead of 0.05 ms. So each launch
runs with one BLAS thread and restores the previous count afterwards.

OpenBLAS's thread count is process-wide, so the limit is reference counted over the
launches in flight (several devices or kernels may run at once); the count is
restored when the last one finishes. Each output element is computed by the same
kernel over the same reduction order whatever the thread count (threads only split
the output), so results do not change. Without an OpenBLAS numpy (Accelerate, MKL,
another platform) this does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator

# (setter, getter) symbol pairs, newest OpenBLAS builds first: numpy's wheels ship
# scipy-openblas with a symbol prefix/suffix, system builds use the plain names.
_SYMBOLS = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)


def _loaded_openblas_paths() -> list[str]:
    """Paths of the OpenBLAS libraries mapped into this process (Linux only)."""
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return []
    paths = []
    for line in lines:
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if "openblas" in os.path.basename(path).lower() and path not in paths:
            paths.append(path)
    return paths


class _OpenBlasThreads:
    """Get/set the thread count of the OpenBLAS numpy uses (no-ops if there is none)."""

    def __init__(self) -> None:
        import numpy  # noqa: F401  (loads numpy's BLAS so that it is mapped)

        self._set = None
        self._get = None
        for path in _loaded_openblas_paths():
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for set_name, get_name in _SYMBOLS:
                setter = getattr(lib, set_name, None)
                getter = getattr(lib, get_name, None)
                if setter is not None and getter is not None:
                    setter.argtypes, setter.restype = [ctypes.c_int], None
                    getter.argtypes, getter.restype = [], ctypes.c_int
                    self._set, self._get = setter, getter
                    return

    @property
    def found(self) -> bool:
        return self._set is not None

    def get(self) -> int:
        return int(self._get()) if self._get is not None else 0

    def set(self, n: int) -> None:
        if self._set is not None:
            self._set(int(n))


class _SingleThreadLimit:
    """Reference-counted "one BLAS thread" over the launches in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._saved = 0
        self._blas: _OpenBlasThreads | None = None

    def enter(self) -> None:
        with self._lock:
            if self._blas is None:
                self._blas = _OpenBlasThreads()
            if self._depth == 0 and self._blas.found:
                self._saved = self._blas.get()
                if self._saved != 1:
                    self._blas.set(1)
            self._depth += 1

    def exit(self) -> None:
        with self._lock:
            self._depth -= 1
            restore = self._depth == 0 and self._blas is not None and self._blas.found
            if restore and self._saved not in (0, 1):
                assert self._blas is not None
                self._blas.set(self._saved)


# The BLAS thread count is process state; this one object tracks who limited it.
_LIMIT = _SingleThreadLimit()


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Within this context numpy's OpenBLAS (if any) uses one thread."""
    _LIMIT.enter()
    try:
        yield
    finally:
        _LIMIT.exit()


def blas_threads() -> int:
    """The current OpenBLAS thread count (0 when numpy does not use OpenBLAS)."""
    blas = _OpenBlasThreads()
    return blas.get() if blas.found else 0
