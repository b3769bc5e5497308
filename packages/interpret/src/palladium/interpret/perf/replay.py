"""Replays a launch's recorded events on simulated TPU clocks (a discrete-event run).

Each core is a program (its recorded events in its own order) with a clock; DMAs are
fluid flows: after a fixed latency a DMA's bytes flow at an equal share of its
resource's bandwidth (a device's HBM; a device's outgoing ICI link for remote DMAs)
with the other DMAs it serves now: per direction, a kernel's own DMAs one burst at a
time in issue order and a pipeline's block copies one step's at a time (``_served``).
Cores and DMA events are processed in simulated-time order (ties: DMAs first, then
cores by id), so the result depends only on each core's own event order: a wait ends at
the later of the waiter's clock and the signal's time, a barrier when the last core
arrives.

The ``pallas_call`` block-copy pipeline is modelled as Mosaic runs it: with
``Buffered(n)`` (n >= 2) the input blocks of step ``s + n - 1`` are fetched as step
``s`` starts, before it waits for its own (their buffer held step ``s - 1``'s, done), so
two copies of an operand are in flight at once: a pipeline of small blocks takes half a
copy's latency a step (r4/copies, r4/flash-moving on a v5e). Block copies are DMAs with
the measured latencies of a kernel's own, each issued by the core; outputs of step ``s``
are written back after its body while the next steps run, and step ``s + n - 1`` waits
for them. With one buffer every copy is exposed. Each grid step pays the fixed
per-step overhead; a launch whose blocks move pays its prologue and epilogue
(``core_program``).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import defaultdict
from typing import Any

from palladium.interpret.eval.context import CoreId
from palladium.interpret.perf.core_program import core_program
from palladium.interpret.perf.dma_runs import Bursts, Member, assign_lanes
from palladium.interpret.perf.model import ChipModel


@dataclasses.dataclass(slots=True)
class Span:
    """One interval on a track: ``track`` is ``(device, "core c" | "DMA engine k")``."""

    track: tuple[int, str]
    name: str
    cat: str  # "step", "compute", "overhead", "wait", "barrier", "dma"
    start: float
    end: float
    args: dict[str, Any] = dataclasses.field(default_factory=dict)


#: A span as the replay keeps it: (track, name, cat, start, end, args or None)
RawSpan = tuple[tuple[int, str], str, str, float, float, "dict[str, Any] | None"]


def span_order(span: RawSpan) -> tuple[tuple[int, str], float, float]:
    """The order of a record's spans: by track, then start, the longer first."""
    return span[0], span[3], -span[4]


def make_spans(raw: list[RawSpan]) -> list[Span]:
    """``raw``'s Span objects, in ``raw``'s order (each DMA's args copied, as each
    other span's without args gets an empty dict of its own)."""
    return [Span(track, name, cat, start, end,
                 {} if args is None else dict(args) if cat == "dma" else args)
            for track, name, cat, start, end, args in raw]


@dataclasses.dataclass(slots=True)
class _Dma:
    id: int
    name: str
    device: int
    resource: tuple[str, int]
    nbytes: int
    signals: list[tuple[Any, int]]
    start: float
    args: dict[str, Any]
    remaining: float = 0.0
    end: float = 0.0
    direction: str = ""
    block: bool = False  # a pipeline block copy (served in issue order, see _served)
    #: A run of DMAs started together (the recorder's ``("dmas", ...)``): each one's
    #: (id, name, signals, args), in order; their bytes flow as ``count`` DMAs' would,
    #: ``remaining`` each (None: this DMA alone)
    members: list[Member] | None = None
    count: int = 1
    #: the ``remaining`` at or below which it has ended (a millionth of its bytes)
    limit: float = 0.0


@dataclasses.dataclass
class CoreStats:
    end: float = 0.0
    compute: float = 0.0
    overhead: float = 0.0
    exposed: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    steps: int = 0


class Replay:
    """Runs the programs of every core of a launch; results in ``raw_spans``, ``stats``,
    ``dmas`` and ``vmem`` (per core: ``[(time, bytes in use)]``)."""

    def __init__(self, events: dict[CoreId, list[tuple[Any, ...]]], cores: tuple[CoreId, ...],
                 chip: ChipModel, cores_per_device: int,
                 vmem_base: dict[CoreId, int] | None = None,
                 operand_seconds: float = 0.0) -> None:
        self.chip = chip
        # (a device's HBM serves reads, writes and HBM -> HBM copies at the rates measured
        # for each: a DMA's bytes are counted in read-equivalent bytes, its "work")
        self._cores_per_device = cores_per_device
        self.bandwidth = {"hbm": 1.0 / chip.hbm_byte_seconds("in", cores_per_device),
                          "ici": chip.ici_bytes_per_second,
                          "host": chip.host_bytes_per_second,
                          "local": chip.local_bytes_per_second()}
        self.cores = tuple(sorted(set(cores) | set(events)))
        # (``operand_seconds``: what the launch's blocked operands cost a grid step,
        # their index maps and block checks)
        step = chip.step_overhead_s + operand_seconds
        self.programs = {c: core_program(c, events.get(c, []), chip, step)
                         for c in self.cores}
        self.clock = dict.fromkeys(self.cores, 0.0)
        self.stats = {c: CoreStats() for c in self.cores}
        # every span as the tuple (track, name, cat, start, end, args): ``make_spans``
        # makes the Span objects (a record, only when its spans are read). A DMA's args
        # are its own, copied into its Span; None: a new empty dict.
        self.raw_spans: list[RawSpan] = []
        self.dmas: list[_Dma] = []
        self.resource_bytes: dict[tuple[str, int], int] = defaultdict(int)
        self.vmem = {c: [(0.0, (vmem_base or {}).get(c, 0))] for c in self.cores}
        self._open: dict[CoreId, list[tuple[str, float, dict[str, Any]]]] = defaultdict(list)
        self._count: dict[Any, int] = defaultdict(int)
        self._waiter: dict[Any, tuple[CoreId, int, float, str, str]] = {}
        self._barrier: list[tuple[CoreId, float]] = []
        self._ready: list[tuple[float, CoreId]] = []
        self._pending: list[tuple[float, int, _Dma]] = []
        self._active: dict[tuple[str, int], list[_Dma]] = defaultdict(list)
        self._t_dma = 0.0
        # per resource, the large block writes issued and not yet flowing, and the large
        # block reads waiting for them (``_start``)
        self._issuing: dict[tuple[str, int], int] = defaultdict(int)
        self._held: dict[tuple[str, int], list[tuple[_Dma, float, int]]] = {}
        # per resource with DMAs in flight: the ones it serves and their rate
        # (``_next_dma_time``, for ``_advance``)
        self._flows: list[tuple[list[_Dma], float]] = []
        # when the first of them ends (None: not found since the last ``_advance``)
        self._flow_end: float | None = None
        self._dma_terms: dict[str, tuple[str, bool, float, float, float]] = {}
        # (a burst's DMAs from the ``dma_burst_depth``-th on hold the engine less)
        self._bursts = (Bursts(chip, self.bandwidth["hbm"])
                        if chip.dma_min_deep_seconds else None)

    # -- the run -------------------------------------------------------------------------
    def run(self) -> None:
        self._ready = [(0.0, c) for c in self.cores]
        heapq.heapify(self._ready)
        ready, pending, next_dma_time, advance, step = (
            self._ready, self._pending, self._next_dma_time, self._advance, self._step)
        inf, heappop = math.inf, heapq.heappop
        while True:
            tc = ready[0][0] if ready else inf
            td = self._flow_end  # (``_next_dma_time``, its flows found: inline)
            if td is None:
                td = next_dma_time()
            elif pending and pending[0][0] < td:
                td = pending[0][0]
            if td <= tc and td < inf:
                advance(td)
                continue
            if not ready:
                break
            step(heappop(ready)[1])
        assign_lanes(self.dmas, self.raw_spans.append)

    def _step(self, core: CoreId) -> None:
        """Run ``core``'s program from its clock until it waits or its clock passes
        another event (a compute or overhead span ends where the run loop would pick
        this core again at once, before any DMA event: it goes on here)."""
        program = self.programs[core]
        track = (core[0], f"core {core[1]}")
        st = self.stats[core]
        clock, ready, spans = self.clock, self._ready, self.raw_spans
        t = clock[core]
        while True:
            action = next(program, None)
            if action is None:
                st.end = t
                return
            kind = action[0]
            if kind == "overhead" or kind == "compute":
                dt = action[1]
                end = t + dt
                spans.append((track, action[2], kind, t, end, None))
                if kind == "compute":
                    st.compute += dt
                else:
                    st.overhead += dt
                clock[core] = t = end
                td = self._flow_end  # (``_next_dma_time``, its flows found: inline)
                if td is None:
                    td = self._next_dma_time()
                elif self._pending and self._pending[0][0] < td:
                    td = self._pending[0][0]
                if (ready and ready[0] <= (end, core)) or td <= end:
                    heapq.heappush(ready, (end, core))
                    return
                continue  # (the run loop would pop this core next)
            if kind == "dma" or kind == "dmas":  # ("dmas": started together, one flow)
                if kind == "dma":
                    _, dma_id, name, res, nbytes, signals, args, kind = action
                    members, count = None, 1
                else:
                    _, members, res, nbytes, kind = action
                    (dma_id, name, signals, args), count = members[0], len(members)
                direction, block, work, latency = self._work(kind, res, nbytes)
                if not block and self._bursts is not None:  # (bytes: ``_terms``'s scale)
                    work = self._bursts.work(core, t, direction, res,
                                             nbytes * self._dma_terms[kind][2], count, work)
                self._start(_Dma(dma_id, name, core[0], res, nbytes, signals, t, args, work,
                                 0.0, direction, block, members, count,
                                 1e-6 * max(nbytes, 1)), latency)
            elif kind == "signal":
                self._signal(action[1], action[2], t, "sem")
            elif kind == "wait":
                _, key, value, label, what = action
                if self._count[key] >= value:
                    self._count[key] -= value
                else:
                    self._waiter[key] = (core, value, t, label, what)
                    return
            elif kind == "barrier":
                self._barrier.append((core, t))
                if len(self._barrier) < len(self.cores):
                    return
                end = max(at for _, at in self._barrier)
                for c, at in self._barrier:
                    spans.append(((c[0], f"core {c[1]}"), "barrier", "barrier", at, end, None))
                    self.stats[c].exposed["barrier"] += end - at
                    clock[c] = end
                    heapq.heappush(ready, (end, c))
                self._barrier = []
                return
            elif kind == "mem":
                self.vmem[core].append((t, self.vmem[core][-1][1] + action[1]))
            elif kind == "begin":
                self._open[core].append((action[1], t, action[2]))
                st.steps += 1
            elif kind == "end":
                name, t0, args = self._open[core].pop()
                spans.append((track, name, "step", t0, t, args))

    def _work(self, kind: str, res: tuple[str, int], nbytes: int,
              ) -> tuple[str, bool, float, float]:
        """A DMA's direction, whether it is a block copy, its work on its resource (HBM:
        read-equivalent bytes; a kernel's own DMA holds the engine at least its least
        time, a strided block copy's pieces cost it that much more) and its latency."""
        direction, block, scale, least, latency = (self._dma_terms.get(kind)
                                                   or self._terms(kind))
        work = float(nbytes)
        if res[0] == "hbm":
            work *= scale
            work = work + least if block else max(work, least)
        return direction, block, work, latency

    def _start(self, dma: _Dma, latency: float) -> None:
        """``dma`` (a run of ``dma.count``) issued: its bytes flow after ``latency``."""
        dmas = self.dmas
        dmas.append(dma)
        self.resource_bytes[dma.resource] += dma.nbytes * dma.count
        if dma.block and dma.nbytes > self.chip.mixed_copy_limit_bytes:
            if dma.direction == "in" and self._issuing[dma.resource]:
                # a large block read waits while a large block write is issued and not
                # yet flowing: the two do not mix (r5/in-out on a v5e: a step's 64 KiB
                # input and output copies take the two apart added, 389 ns against
                # 236 + 169; 32 KiB ones overlap, 262 against 212 + 144)
                self._held.setdefault(dma.resource, []).append((dma, latency, len(dmas)))
                return
            if dma.direction == "out":
                self._issuing[dma.resource] += 1
        heapq.heappush(self._pending, (dma.start + latency, len(dmas), dma))

    def _terms(self, kind: str) -> tuple[str, bool, float, float, float]:
        """A DMA kind's (``"block in"``, ``"block strided in"``, ``"in"``...) direction,
        whether it is a block copy, its HBM work per byte, a kernel DMA's least work (a
        strided block copy's work more), and its latency (the chip's, once per kind)."""
        direction = kind.split()[-1]
        block = kind.startswith("block")
        bandwidth = self.bandwidth["hbm"]
        least = (self.chip.strided_copy_seconds if "strided" in kind else 0.0) if block else (
            self.chip.dma_min_seconds)
        terms = self._dma_terms[kind] = (
            direction, block,
            self.chip.hbm_byte_seconds(direction, self._cores_per_device) * bandwidth,
            least * bandwidth,
            self.chip.dma_latency(direction))  # (a block copy is a DMA like any)
        return terms

    def _signal(self, key: Any, inc: int, t: float, source: str) -> None:
        self._count[key] += inc
        waiter = self._waiter.get(key)
        if waiter is None or self._count[key] < waiter[1]:
            return
        core, value, t0, label, what = self._waiter.pop(key)
        self._count[key] -= value
        end = max(t0, t)
        if end > t0:
            self.raw_spans.append(((core[0], f"core {core[1]}"), f"wait {label}", "wait", t0,
                                   end, {"semaphore": label}))
        self.stats[core].exposed[source if what != "sem" else "sem"] += end - t0
        self.clock[core] = end
        heapq.heappush(self._ready, (end, core))

    # -- DMAs as fluid flows --------------------------------------------------------------
    def _next_dma_time(self) -> float:
        """When the next DMA event happens (a pending DMA's bytes start to flow, a
        flowing one ends). The DMAs each resource serves and their rate are kept in
        ``_flows`` for ``_advance`` to that time (the active lists do not change
        between: a core's step only adds pending DMAs)."""
        t = self._pending[0][0] if self._pending else math.inf
        ends = self._flow_end
        if ends is None:  # (else the flows as found since the last ``_advance``)
            ends = math.inf
            flows = self._flows
            flows.clear()
            for res, active in self._active.items():
                if not active:
                    continue
                if len(active) > 1:
                    served = self._served(active)
                    if len(served) > 1:
                        rate = self._rate(res, served)
                        flows.append((served, rate))
                        ends = min(ends, self._t_dma + min(d.remaining for d in served) / rate)
                        continue
                else:
                    served = active
                # (one DMA served: ``_rate``'s share, never mixed)
                d = served[0]
                rate = self.bandwidth[res[0]] / d.count
                flows.append((served, rate))
                ends = min(ends, self._t_dma + d.remaining / rate)
            self._flow_end = ends
        return min(t, ends)

    @staticmethod
    def _served(active: list[_Dma]) -> list[_Dma]:
        """The DMAs that share the resource now: per direction, a pipeline's block
        copies one step's at a time (two steps' copies of small blocks in flight take
        their latencies together but their bytes one after the other: a step of four
        64 KiB f32 blocks runs at the read rate, r4/copies on a v5e), and a kernel's own
        DMAs one burst at a time in issue order, a burst being the DMAs a core started
        together (at one time on its clock): a ring of k DMAs in flight, each waited for
        and started again, runs at the engine's rate (on a v5e two 256 KiB reads in
        flight take 100.5 us a ring where sharing the engine would take 134 and in
        order 90; jax's paged attention at 16 pages a block takes 21 ns a page DMA,
        its page DMAs in bursts of a block's keys and values)."""
        if len(active) == 2:  # (the common case, as below)
            a, b = active
            if a.block is not b.block or a.direction != b.direction or a.start == b.start:
                return active
            return [a] if a.start < b.start else [b]
        first: dict[str, float] = {}
        own: dict[str, float] = {}
        for d in active:
            starts = first if d.block else own
            if d.start < starts.get(d.direction, math.inf):
                starts[d.direction] = d.start
        if len(first) + len(own) == len(active):
            return active
        return [d for d in active
                if d.start == (first if d.block else own)[d.direction]]

    def _rate(self, res: tuple[str, int], active: list[_Dma]) -> float:
        """Each served DMA's share of its resource; HBM serving reads and writes at once
        is slower than either alone (the chip's measured read/write turnaround)."""
        n = sum(d.count for d in active)  # (a run of DMAs: each one's share)
        rate = self.bandwidth[res[0]] / n
        if res[0] == "hbm" and self.chip.hbm_mixed_factor != 1.0:
            kinds = {d.direction for d in active}
            if "in" in kinds and "out" in kinds:
                rate /= self.chip.hbm_mixed_factor
        return rate

    def _advance(self, t: float) -> None:
        """Move the flowing DMAs on to ``t`` (as ``_next_dma_time`` just found them)."""
        dt = t - self._t_dma
        self._flow_end = None  # (the flows change here)
        done: list[_Dma] = []
        for served, rate in self._flows:
            moved = dt * rate
            for d in served:
                d.remaining -= moved
        self._t_dma = t
        while self._pending and self._pending[0][0] <= t:
            _, _, dma = heapq.heappop(self._pending)
            self._active[dma.resource].append(dma)
            if (dma.direction == "out" and dma.block
                    and dma.nbytes > self.chip.mixed_copy_limit_bytes):
                self._issuing[dma.resource] -= 1
                if not self._issuing[dma.resource]:
                    # the block reads held on this resource (``_start``) issue now
                    for held, latency, n in self._held.pop(dma.resource, ()):
                        heapq.heappush(self._pending, (t + latency, n, held))
        for res, active in self._active.items():
            if len(active) == 1:  # (the common case)
                if active[0].remaining <= active[0].limit:
                    done.append(active.pop())
                continue
            finished = [d for d in active if d.remaining <= d.limit]
            if finished:  # (by identity: a dataclass's == compares every field)
                self._active[res] = [d for d in active if d.remaining > d.limit]
                done.extend(finished)
        if len(done) > 1:  # (most steps end one DMA)
            done.sort(key=lambda d: (d.start, d.id))
        for dma in done:
            dma.end = t
            if dma.members is not None:
                # (consecutive signals of one semaphore at one time as one: a waiter
                # wakes at the same time, the count ends the same)
                last, total = None, 0
                for member in dma.members:
                    for key, inc in member[2]:
                        if key != last and last is not None:
                            self._signal(last, total, t, dma.resource[0])
                            total = 0
                        last = key
                        total += inc
                if last is not None:
                    self._signal(last, total, t, dma.resource[0])
                continue
            for key, inc in dma.signals:
                self._signal(key, inc, t, dma.resource[0])
