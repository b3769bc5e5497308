"""``palladium.interpret.timeline()``: record every launch run inside a ``with`` block."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from palladium.interpret.logging_observer import register_mode_logger
from palladium.interpret.observers import LaunchInfo, scoped_launch_observer
from palladium.interpret.params import LoggingMode
from palladium.interpret.perf.model import chip_model
from palladium.interpret.perf.record import LaunchRecord
from palladium.interpret.perf.recorder import TimelineRecorder
from palladium.interpret.perf.trace import plot_records, save_trace, trace_events

__all__ = ["Timeline", "timeline"]

logger = logging.getLogger("palladium.interpret")


class Timeline:
    """The launches recorded by one :func:`timeline` block, in the order they started.

    ``chip`` (optional) predicts every launch for that chip instead of the one its
    ``InterpretParams`` simulate.
    """

    def __init__(self, chip: str | None = None) -> None:
        self.chip = chip
        self._recorders: list[TimelineRecorder] = []
        self._records: dict[int, LaunchRecord] = {}
        self._lock = threading.Lock()

    def _observe(self, info: LaunchInfo) -> TimelineRecorder:
        recorder = TimelineRecorder(info, chip_model(self.chip or info.chip))
        with self._lock:
            self._recorders.append(recorder)
        return recorder

    @property
    def launches(self) -> list[LaunchRecord]:
        """A :class:`LaunchRecord` per finished launch (a launch that raised is left
        out)."""
        with self._lock:
            recorders = [r for r in self._recorders if r.finished]
        out = []
        for r in recorders:
            rec = self._records.get(id(r))
            if rec is None:
                rec = self._records[id(r)] = LaunchRecord(r)
            out.append(rec)
        return out

    @property
    def predicted_seconds(self) -> float:
        """The launches' predicted times, summed (they run one after another)."""
        return sum(r.predicted_seconds for r in self.launches)

    def summary(self) -> str:
        """Every launch's summary."""
        return "\n\n".join(r.summary() for r in self.launches) or "no launch recorded"

    def trace(self) -> dict[str, Any]:
        """The Chrome trace-event document (see :meth:`save`)."""
        return trace_events(self.launches)

    def save(self, path: str) -> None:
        """Write a Chrome trace-event JSON file: open it in https://ui.perfetto.dev or
        chrome://tracing. One process per device and launch, a track per core and DMA
        engine, a VMEM-in-use counter per core."""
        save_trace(self.launches, path)

    def plot(self, path: str, *, title: str | None = None) -> None:
        """Save a Gantt chart of the launches (needs the ``timeline`` extra:
        ``pip install 'palladium-interpret[timeline]'``, i.e. matplotlib)."""
        plot_records(self.launches, path, title=title)


@contextlib.contextmanager
def timeline(chip: str | None = None) -> Iterator[Timeline]:
    """Record every palladium launch run inside the block (eager, jit, any devices) by
    this thread or asyncio task, not other threads' (see
    ``palladium.interpret.observers.scoped_launch_observer``).

    Under ``jax.jit`` a launch runs when its result is computed: block on the results
    (``jax.block_until_ready``) inside the block so they are recorded.

    >>> import palladium.interpret as pi
    >>> with pi.timeline() as tl:
    ...     pass
    >>> tl.launches
    []
    """
    tl = Timeline(chip)
    with scoped_launch_observer(tl._observe):
        yield tl


class SummaryLogger(TimelineRecorder):
    """``LoggingMode.TIMELINE``: logs the launch's timeline summary when it ends."""

    def run_end(self, cores: tuple[tuple[int, int], ...]) -> None:
        super().run_end(cores)
        logger.debug("timeline of %s:\n%s", self.info.kernel_name, LaunchRecord(self).summary())


def summary_logger(info: LaunchInfo) -> SummaryLogger:
    """The ``LoggingMode.TIMELINE`` observer of a launch."""
    return SummaryLogger(info, chip_model(info.chip))


register_mode_logger(LoggingMode.TIMELINE, summary_logger)
