"""A launch's DMAs as the replay takes them: each one's direction, resource, signals and
labels, runs of DMAs started back to back (issue 40, item 4), and the DMA engine lanes.

A run is DMAs one core started one after the other, nothing between them (no compute:
the same start on the core's clock), with consecutive DMA numbers, the same bytes and
the same source and destination devices and memory spaces: the same resource, cost and
latency. The replay runs it as one flow that counts as that many DMAs in its resource's
share, so each of its DMAs ends when it would have alone; each keeps its own signals (in
order), engine lane and span (paged attention's page DMAs: 36,864 DMAs, 4,608 runs).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from palladium.interpret.eval.context import CoreId
from palladium.shared_memory import MemorySpace

_HOST = MemorySpace.HOST

#: A DMA of a run as the replay keeps it: (number, name, signals, span args)
Member = tuple[int, str, list[tuple[Any, int]], dict[str, Any]]


def merge_run(events: list[tuple[Any, ...]]) -> None:
    """Merge the ``("dma", event)`` just appended to a core's ``events`` into the DMA (or
    run, ``("dmas", [event, ...])``) right before it where they make a run."""
    if len(events) < 2:
        return
    prev = events[-2]
    kind = prev[0]
    if kind != "dma" and kind != "dmas":
        return
    d = events[-1][1]
    p = prev[1] if kind == "dma" else prev[1][-1]
    if (d.id != p.id + 1 or d.nbytes != p.nbytes or d.src.device != p.src.device
            or d.dst.device != p.dst.device or d.src.space is not p.src.space
            or d.dst.space is not p.dst.space):
        return
    events.pop()
    if kind == "dma":
        events[-1] = ("dmas", [p, d])
    else:
        prev[1].append(d)


def route(d: Any) -> tuple[str, tuple[str, int]]:
    """The DMA event ``d``'s kind for its cost, ``"hbm"`` (HBM -> HBM), ``"out"`` (into
    HBM), ``"in"`` (out of HBM; to or from the host; a remote one between on-core
    memories: over ICI, not the core's own path) or ``"local"`` (between on-core
    memories: VMEM, SMEM), and its resource: its device's outgoing ICI link (remote),
    the host link, the core's own path (``"local"``) or its device's HBM."""
    src, dst, hbm = d.src.space, d.dst.space, MemorySpace.HBM
    host = _HOST in (src, dst)
    way = ("hbm" if src is hbm and dst is hbm else "out" if dst is hbm
           else "in" if src is hbm or host or d.remote else "local")
    res = (("ici", d.src.device) if d.remote else ("host", d.core[0]) if host
           else ("local" if way == "local" else "hbm", d.core[0]))
    return way, res


def member(d: Any, labels: dict[Any, tuple[Any, ...]]) -> Member:
    """The DMA event ``d`` as the replay keeps it (``labels``: per buffer, its label; per
    kind of DMA, its signals and span args, made once and shared: read only, a span's
    args are copied into its ``Span``)."""
    dst_sem, src_sem, src, dst = d.dst_sem, d.src_sem, d.src, d.dst
    key = (id(dst_sem), id(src_sem), d.nbytes, id(src), id(dst))
    known = labels.get(key)
    if (known is None or known[0] is not dst_sem or known[1] is not src_sem
            or known[2] is not src or known[3] is not dst):  # (held: their ids are theirs)
        signals = [(dst_sem.key, d.nbytes)]
        if src_sem is not None:
            signals.append((src_sem.key, d.nbytes))
        known = labels[key] = (dst_sem, src_sem, src, dst, signals, {
            "bytes": d.nbytes, "src": label(src, labels), "dst": label(dst, labels)})
    return (d.id, d.name, known[4], known[5])


def label(buffer: Any, labels: dict[Any, tuple[Any, ...]]) -> str:
    """``buffer.label``, made once per buffer (a page loop's DMAs name the same two)."""
    known = labels.get(id(buffer))
    if known is None or known[0] is not buffer:
        known = labels[id(buffer)] = (buffer, buffer.label)
    return known[1]


def assign_lanes(dmas: list[Any], append: Callable[[Any], None]) -> None:
    """``append`` each DMA's span on its device's lowest engine lane free at its start
    (by start, then number; a run's DMAs one by one): per device a heap of the busy
    lanes by end and one of the free lanes by number (the starts never decrease, so a
    lane freed stays free until taken)."""
    lanes: dict[int, tuple[list[tuple[float, int]], list[int], list[int]]] = {}
    heappush, heappop = heapq.heappush, heapq.heappop
    names: list[str] = []
    for dma in sorted(dmas, key=attrgetter("start", "id")):
        known = lanes.get(dma.device)
        if known is None:
            known = lanes[dma.device] = ([], [], [0])
        busy, free, count = known
        start, end = dma.start, dma.end
        # (a run's numbers follow each other: no other DMA sorts between them)
        for _, name, _, args in (dma.members or ((dma.id, dma.name, None, dma.args),)):
            while busy and busy[0][0] <= start:
                heappush(free, heappop(busy)[1])
            if free:
                lane = heappop(free)
            else:
                lane = count[0]
                count[0] += 1
            heappush(busy, (end, lane))
            if lane >= len(names):
                names.extend(f"DMA engine {n}" for n in range(len(names), lane + 1))
            append(((dma.device, names[lane]), name, "dma", start, end, args))


class Bursts:
    """A kernel's DMAs by burst (those one core starts at one time on its clock, per
    direction): from the chip's ``dma_burst_depth``-th DMA of a burst on, a DMA holds
    the HBM DMA engine its bytes' time or ``dma_min_deep_seconds``, not
    ``dma_min_seconds`` (r26 on a v5e: 8 KiB page DMAs started together take 23.8 ns a
    page up to 16 a burst, 13.7 from 16 to 64, from one array or two alike)."""

    def __init__(self, chip: Any, bandwidth: float) -> None:
        self._depth = chip.dma_burst_depth
        self._deep = chip.dma_min_deep_seconds * bandwidth  # (work: read-equivalent bytes)
        self._open: dict[tuple[CoreId, str], tuple[float, int]] = {}

    def work(self, core: CoreId, t: float, direction: str, res: tuple[str, int],
             bytes_work: float, count: int, work: float) -> float:
        """The work of each of ``count`` DMAs the core starts at ``t`` on ``res``, whose
        bytes are ``bytes_work`` each (``work`` each by the least time of a shallow one;
        only HBM's change); a run started together ends together, so its members take
        the mean."""
        key = (core, direction)
        at, started = self._open.get(key, (t, 0))
        if at != t:
            started = 0
        self._open[key] = (t, started + count)
        deep = started + count - max(started, self._depth)
        if deep <= 0 or res[0] != "hbm":
            return work
        less = min(work, max(bytes_work, self._deep))
        return (work * (count - deep) + less * deep) / count
