"""Time every call of a module-level function while a block runs (the benchmarks' way to
measure one check inside a whole first call)."""

from __future__ import annotations

import time
from typing import Any


class timed_calls:  # noqa: N801  (used as a context manager, like a function)
    """``with timed_calls(module, "name") as t: ...`` replaces ``module.name`` by a wrapper
    adding each call's wall time to ``t.seconds``; the original is put back after."""

    def __init__(self, module: Any, name: str) -> None:
        self.seconds = 0.0
        self._module, self._name = module, name
        self._inner = getattr(module, name)

    def __enter__(self) -> timed_calls:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return self._inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        setattr(self._module, self._name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self._module, self._name, self._inner)
