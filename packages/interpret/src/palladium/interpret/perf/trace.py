"""A timeline's pictures: Chrome trace-event JSON (Perfetto, chrome://tracing) and a
Gantt chart (matplotlib, the optional ``palladium-interpret[timeline]`` extra)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from palladium.interpret.perf.record import LaunchRecord

__all__ = ["TraceStream", "launch_events", "plot_records", "trace_events"]

_COLOURS = {"step": "#d9d9d9", "compute": "#4e79a7", "overhead": "#bab0ac", "wait": "#e15759",
            "barrier": "#f28e2b", "dma": "#59a14f"}


def launch_events(rec: LaunchRecord, n: int, offset: float) -> list[dict[str, Any]]:
    """The trace events of one launch, the ``n``-th of its document (its processes are
    ``n * 1000 + device``), starting ``offset`` seconds into it."""
    events: list[dict[str, Any]] = []
    tids: dict[tuple[int, str], int] = {}
    tracks = _tracks(rec)
    for device, name in tracks:
        pid = n * 1000 + device
        tids[(device, name)] = tid = len([t for t in tids if t[0] == device])
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                       "args": {"sort_index": tid}})
    for device in sorted({t[0] for t in tracks}):
        events.append({"ph": "M", "name": "process_name", "pid": n * 1000 + device,
                       "args": {"name": f"{rec.kernel_name} #{n} device {device} "
                                        f"(TPU {rec.chip.chip})"}})
    for s in rec.spans:
        events.append({
            "ph": "X", "name": s.name, "cat": s.cat, "pid": n * 1000 + s.track[0],
            "tid": tids[s.track], "ts": (offset + s.start) * 1e6,
            "dur": (s.end - s.start) * 1e6, "args": dict(s.args),
        })
    for (device, core), samples in sorted(rec.vmem.items()):
        for t, nbytes in samples:
            events.append({"ph": "C", "name": f"VMEM in use, core {core}",
                           "pid": n * 1000 + device, "ts": (offset + t) * 1e6,
                           "args": {"bytes": nbytes}})
    return events


def _tracks(rec: LaunchRecord) -> list[tuple[int, str]]:
    """``rec``'s tracks: by device, each device's cores first, then its DMA engines."""
    def order(track: tuple[int, str]) -> tuple[int, int, int]:
        kind, _, index = track[1].rpartition(" ")
        return (track[0], 0 if kind == "core" else 1, int(index))

    return sorted({s.track for s in rec.spans}, key=order)


def trace_events(records: Sequence[LaunchRecord]) -> dict[str, Any]:
    """The Chrome trace-event document of ``records`` (laid end to end in time).

    One process per (launch, device), one thread (track) per core and per DMA engine;
    complete events (``ph: "X"``, microseconds) for grid steps, compute, DMAs (bytes,
    source, destination), semaphore waits (the semaphore's name) and barriers; a
    counter (``ph: "C"``) of the VMEM in use on each core.
    """
    events: list[dict[str, Any]] = []
    offset = 0.0
    for n, rec in enumerate(records):
        events.extend(launch_events(rec, n, offset))
        offset += rec.predicted_seconds
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"producer": "palladium.interpret.timeline",
                          "launches": [r.to_dict() for r in records]}}


class TraceStream:
    """A Chrome trace-event file written launch by launch, as each ends (the timeline's
    ``trace_file``): the same document :func:`trace_events` makes, without keeping the
    launches' spans in memory. ``close()`` finishes the JSON document."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._file.write('{"traceEvents": [\n')
        self._first = True
        self._offset = 0.0
        self._launches: list[dict[str, Any]] = []

    def write(self, rec: LaunchRecord) -> None:
        """Append ``rec``'s events (its processes numbered by ``rec.index``)."""
        for event in launch_events(rec, rec.index, self._offset):
            self._file.write(("" if self._first else ",\n") + json.dumps(event))
            self._first = False
        self._offset += rec.predicted_seconds
        self._launches.append(rec.to_dict())

    def close(self) -> None:
        if self._file.closed:
            return
        self._file.write('\n], "displayTimeUnit": "ns", "otherData": '
                         + json.dumps({"producer": "palladium.interpret.timeline",
                                       "launches": self._launches}) + "}\n")
        self._file.close()


def plot_records(records: Sequence[LaunchRecord], path: str, *, title: str | None = None) -> None:
    """A Gantt chart of ``records`` (one row per core and DMA engine) saved to ``path``.

    Needs matplotlib: ``pip install 'palladium-interpret[timeline]'``.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as e:  # the optional extra
        raise ImportError(
            "Timeline.plot needs matplotlib: pip install 'palladium-interpret[timeline]'"
        ) from e
    rows: list[tuple[int, int, str]] = []
    for n, rec in enumerate(records):
        rows.extend((n, device, name) for device, name in _tracks(rec))
    index = {r: i for i, r in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(11, 0.5 * len(rows) + 1.4))
    offset = 0.0
    for n, rec in enumerate(records):
        for s in rec.spans:
            y = index[(n, s.track[0], s.track[1])]
            height = 0.8 if s.cat == "step" else 0.55
            ax.barh(y, (s.end - s.start) * 1e6, left=(offset + s.start) * 1e6, height=height,
                    color=_COLOURS.get(s.cat, "#999999"),
                    edgecolor="none" if s.cat == "step" else "white", linewidth=0.6)
        offset += rec.predicted_seconds
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"dev {d} {name}" if len(records) == 1 else f"#{n} dev {d} {name}"
                        for n, d, name in rows])
    ax.invert_yaxis()
    ax.set_xlabel("simulated TPU time (us)")
    if title is None and records:
        r = records[-1]
        title = (f"{r.kernel_name} on TPU {r.chip.chip}: {r.predicted_seconds * 1e6:.1f} us, "
                 f"{r.bound}-bound")
    ax.set_title(title or "")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in _COLOURS.items()], ncol=6,
              loc="upper center", bbox_to_anchor=(0.5, -0.18 if len(rows) > 2 else -0.35),
              frameon=False, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
