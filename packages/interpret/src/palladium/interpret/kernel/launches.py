"""A kernel's launches in the process: their count, the latest one's execution plan and
the kernel's compiled whole launches (per-kernel launch state, apart from what the
kernel is)."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["KernelLaunches"]


class KernelLaunches:
    """Numbers a kernel's launches (trial reruns are not launches: they take the number
    of the launch they check) and keeps what later launches of it use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        #: The plan of the latest launch (``run.execution_plan.ExecutionPlan``), as run.
        self.last_plan: Any = None
        #: The kernel's compiled launches (``compiled/compiled_launch.py``), by grid and
        #: order, and the keys it was compiled whole for (at most ``MAX_GRIDS``).
        self.whole_launches: dict[Any, Any] = {}
        self.whole_launch_keys: set[Any] = set()

    def next(self) -> int:
        """Count one more launch of the kernel; its number (1 for the first)."""
        with self._lock:
            self._count += 1
            return self._count

    @property
    def count(self) -> int:
        """How many launches of the kernel were counted."""
        return self._count
