"""Race reports of launches run with ``InterpretParams(on_race="collect")``.

Reports go to the innermost open ``collect_race_reports()`` scope, else to a
process-wide log that ``collected_race_reports()`` drains. That log keeps at most
``CAPACITY`` reports (about 2 KiB each): when more arrive before they are collected, the
oldest are dropped and the next ``collected_race_reports()`` warns how many. A scope's
list is the caller's, and lives as long as the caller keeps it.
"""

from __future__ import annotations

import collections
import threading
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from palladium.race_detect import RaceReport, RaceWarning

__all__ = ["CAPACITY", "RaceLog"]

CAPACITY = 1024


class RaceLog:
    """The process-wide log plus the stack of open collection scopes (thread-safe)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._reports: collections.deque[RaceReport] = collections.deque(maxlen=capacity)
        self._dropped = 0
        self._scopes: list[list[RaceReport]] = []
        self._lock = threading.Lock()

    def extend(self, reports: Iterable[RaceReport]) -> None:
        reports = list(reports)
        if not reports:
            return
        with self._lock:
            if self._scopes:
                self._scopes[-1].extend(reports)
                return
            maxlen = self._reports.maxlen or 0
            self._dropped += max(0, len(self._reports) + len(reports) - maxlen)
            self._reports.extend(reports)

    def drain(self) -> list[RaceReport]:
        with self._lock:
            out, dropped = list(self._reports), self._dropped
            self._reports.clear()
            self._dropped = 0
        if dropped:
            warnings.warn(
                f"{dropped} race report(s) were dropped: the log keeps the latest "
                f"{self._reports.maxlen} until collected_race_reports() is called. Call it "
                f"more often, or collect within palladium.interpret.collect_race_reports().",
                RaceWarning, stacklevel=3,
            )
        return out

    def __len__(self) -> int:
        return len(self._reports)

    def clear(self) -> None:
        """Drop the uncollected reports (open scopes keep theirs: they are the caller's)."""
        with self._lock:
            self._reports.clear()
            self._dropped = 0

    @contextmanager
    def scope(self) -> Iterator[list[RaceReport]]:
        reports: list[RaceReport] = []
        with self._lock:
            self._scopes.append(reports)
        try:
            yield reports
        finally:
            with self._lock:  # by identity: two empty scopes' lists are equal
                self._scopes = [r for r in self._scopes if r is not reports]
