"""``palladium.interpret.timeline()``: record every launch run inside a ``with`` block."""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

from palladium.interpret.errors import ConfigError
from palladium.interpret.observe.logging_observer import register_mode_logger
from palladium.interpret.observe.observers import LaunchInfo, scoped_launch_observer
from palladium.interpret.params import LoggingMode
from palladium.interpret.perf.model import chip_model
from palladium.interpret.perf.record import LaunchRecord
from palladium.interpret.perf.recorder import TimelineRecorder
from palladium.interpret.perf.trace import TraceStream, plot_records, trace_events

__all__ = ["Timeline", "timeline"]

logger = logging.getLogger("palladium.interpret")


# The spans a timeline keeps by default (~100 bytes each with their arguments, so tens
# of MiB at most); the oldest launches' spans go first, their summaries stay.
DEFAULT_DETAIL_LIMIT = 250_000


class Timeline:
    """The launches recorded by one :func:`timeline` block, in the order they started.

    ``chip`` (optional) predicts every launch for that chip instead of the one its
    ``InterpretParams`` simulate. A launch's events are turned into its
    :class:`LaunchRecord` when it ends and then dropped; the records' spans (the detail
    the trace and the picture draw) are kept up to ``detail_limit`` spans in all (None:
    no limit), the summaries always. ``trace_file`` streams every launch's trace events
    to that Chrome trace file as it ends (complete when the block ends), whatever the
    limit. Failed launches are left out unless ``keep_failed``.
    """

    def __init__(self, chip: str | None = None, *, keep_failed: bool = False,
                 detail_limit: int | None = DEFAULT_DETAIL_LIMIT,
                 trace_file: str | None = None, placement: Any = None) -> None:
        if detail_limit is not None and (isinstance(detail_limit, bool)
                                         or not isinstance(detail_limit, int)
                                         or detail_limit < 0):
            raise ConfigError(f"timeline(detail_limit=...) must be None or an int >= 0, "
                              f"got {detail_limit!r}.")
        self.chip = chip
        self.keep_failed = keep_failed
        self.detail_limit = detail_limit
        self._started = itertools.count()
        self._records: dict[int, LaunchRecord] = {}  # by start number
        self._detail: collections.deque[LaunchRecord] = collections.deque()  # spans kept
        self._spans = 0
        self._lock = threading.Lock()
        self._stream = TraceStream(trace_file) if trace_file is not None else None
        # where XLA put each launch's operands (``fidelity.xla_placement.ProgramPlacement``,
        # asked ``local_operands(kernel)`` per launch); None: every operand in HBM
        self._placement = placement

    def _observe(self, info: LaunchInfo) -> TimelineRecorder:
        recorder = TimelineRecorder(info, chip_model(self.chip or info.chip))
        if self._placement is not None and info.kernel is not None:
            recorder.local_operands = self._placement.local_operands(info.kernel)
        # The recorder is held by its launch only: a launch that fails and is not kept
        # leaves nothing here.
        recorder.on_done = functools.partial(self._done, next(self._started))
        return recorder

    def _done(self, index: int, recorder: TimelineRecorder) -> None:
        if recorder.error is not None and not self.keep_failed:
            return
        record = LaunchRecord(recorder, index)
        with self._lock:
            if self._stream is not None:
                self._stream.write(record)
            self._records[index] = record
            self._detail.append(record)
            self._spans += record.num_spans
            limit = self.detail_limit
            while limit is not None and self._spans > limit and self._detail:
                oldest = self._detail.popleft()
                self._spans -= oldest.num_spans
                oldest.drop_detail(limit)

    def _close(self) -> None:
        if self._stream is not None:
            self._stream.close()

    @property
    def launches(self) -> list[LaunchRecord]:
        """A :class:`LaunchRecord` per finished launch (a launch that raised is left
        out unless ``keep_failed``: then its record has ``failed`` and ``error``)."""
        with self._lock:
            return [self._records[i] for i in sorted(self._records)]

    @property
    def predicted_seconds(self) -> float:
        """The launches' predicted times, summed (they run one after another)."""
        return sum(r.predicted_seconds for r in self.launches)

    def summary(self) -> str:
        """Every launch's summary."""
        return "\n\n".join(r.summary() for r in self.launches) or "no launch recorded"

    def trace(self) -> dict[str, Any]:
        """The Chrome trace-event document (see :meth:`save`); ``ConfigError`` if some
        launch's spans were dropped (``detail_limit``; ``trace_file`` has them all)."""
        return trace_events(self.launches)

    def save(self, path: str) -> None:
        """Write a Chrome trace-event JSON file: open it in https://ui.perfetto.dev or
        chrome://tracing. One process per device and launch, a track per core and DMA
        engine, a VMEM-in-use counter per core."""
        with open(path, "w") as f:
            json.dump(trace_events(self.launches), f)

    def plot(self, path: str, *, title: str | None = None) -> None:
        """Save a Gantt chart of the launches (needs the ``timeline`` extra:
        ``pip install 'palladium-interpret[timeline]'``, i.e. matplotlib)."""
        plot_records(self.launches, path, title=title)


@contextlib.contextmanager
def timeline(chip: str | None = None, *, keep_failed: bool = False,
             detail_limit: int | None = DEFAULT_DETAIL_LIMIT,
             trace_file: str | None = None, placement: Any = None) -> Iterator[Timeline]:
    """Record every palladium launch run inside the block (eager, jit, any devices) by
    this thread or asyncio task, not other threads' (see
    ``palladium.interpret.observe.observers.scoped_launch_observer``). See :class:`Timeline` for
    ``keep_failed``, ``detail_limit`` and ``trace_file``. ``placement``: where XLA put
    the launches' operands (``palladium.interpret.fidelity.xla_placement``, as
    ``predict`` finds it): the block copies of an operand in VMEM are VMEM -> VMEM.

    Under ``jax.jit`` a launch runs when its result is computed: block on the results
    (``jax.block_until_ready``) inside the block so they are recorded.

    >>> import palladium.interpret as pi
    >>> with pi.timeline() as tl:
    ...     pass
    >>> tl.launches
    []
    """
    tl = Timeline(chip, keep_failed=keep_failed, detail_limit=detail_limit,
                  trace_file=trace_file, placement=placement)
    try:
        with scoped_launch_observer(tl._observe):
            yield tl
    finally:
        tl._close()


class SummaryLogger(TimelineRecorder):
    """``LoggingMode.TIMELINE``: logs the launch's timeline summary when it ends."""

    def run_end(self, cores: tuple[tuple[int, int], ...]) -> None:
        super().run_end(cores)
        logger.debug("timeline of %s:\n%s", self.info.kernel_name, LaunchRecord(self).summary())


register_mode_logger(LoggingMode.TIMELINE, lambda info: SummaryLogger(info, chip_model(info.chip)))
