"""Progress reports of long launches: where each core is, every ``progress_interval``.

A launch that runs longer than its ``InterpretParams.progress_interval`` logs (logger
``palladium.interpret``, level WARNING) each core's grid point, state and source line
and the DMAs in flight, and again at every interval, so that a stuck test is visible
long before the watchdog fails it. One daemon thread serves every launch of the process
(started at the first launch that asks); a launch costs a registration and a removal.
The thread only reads the launch's state (a report is a best-effort look, never a
lock on the simulation) and never raises into it.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable

__all__ = ["ProgressMonitor"]

logger = logging.getLogger("palladium.interpret")


class _Entry:
    __slots__ = ("describe", "due", "interval", "name", "reports", "start")

    def __init__(self, name: str, interval: float, describe: Callable[[], str]) -> None:
        self.name = name
        self.interval = interval
        self.describe = describe
        self.start = time.monotonic()
        self.due = self.start + interval
        self.reports = 0


class ProgressMonitor:
    """The launches running now that want progress reports, and the thread that reports."""

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        self._ids = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        # When the thread wakes next: a launch due later needs no wake-up (waking the
        # thread costs a thread switch, ~10% of a small kernel's launch)
        self._until = math.inf

    def __len__(self) -> int:
        return len(self._entries)

    def register(self, name: str, interval: float, describe: Callable[[], str]) -> int:
        """A launch called ``name`` started: report ``describe()`` after ``interval``
        seconds and at every interval until ``unregister(id)``."""
        entry = _Entry(name, interval, describe)
        with self._wake:
            key = next(self._ids)
            self._entries[key] = entry
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="palladium-progress")
                self._thread.start()
            elif entry.due < self._until:
                self._wake.notify()
        return key

    def unregister(self, key: int) -> None:
        with self._wake:
            self._entries.pop(key, None)

    def _loop(self) -> None:
        while True:
            with self._wake:
                now = time.monotonic()
                due = [e for e in self._entries.values() if e.due <= now]
                for e in due:
                    e.reports += 1
                    e.due = now + e.interval
                nxt = min((e.due for e in self._entries.values()), default=now + 3600.0)
            for e in due:
                self._report(e, now)
            with self._wake:
                # (entries registered while it reported, unseen above)
                nxt = min((e.due for e in self._entries.values()), default=nxt)
                self._until = nxt
                timeout = nxt - time.monotonic()
                if timeout > 0:
                    self._wake.wait(timeout)
                self._until = -math.inf  # awake: it looks at every entry before waiting

    @staticmethod
    def _report(entry: _Entry, now: float) -> None:
        try:
            text = entry.describe()
        except Exception as e:  # the launch changed under us: say so, never raise
            text = f"(its state could not be read: {type(e).__name__}: {e})"
        logger.warning("kernel '%s' still running after %.0f s:\n%s", entry.name,
                       now - entry.start, text)
