"""One launch's prediction: its spans on simulated clocks, its time and where it goes."""

from __future__ import annotations

import functools
import math
import operator
from typing import Any

from palladium.interpret.errors import ConfigError
from palladium.interpret.eval.context import CoreId
from palladium.interpret.observe.observers import LaunchInfo
from palladium.interpret.perf.model import ChipModel
from palladium.interpret.perf.recorder import TimelineRecorder
from palladium.interpret.perf.replay import (
    CoreStats,
    RawSpan,
    Replay,
    Span,
    make_spans,
    span_order,
)
from palladium.shared_memory import MemorySpace

__all__ = ["LaunchRecord"]


def _operand_step_seconds(info: Any, chip: ChipModel,
                          local: frozenset[tuple[str, str]] = frozenset()) -> float:
    """What the launch's blocked operands cost each grid step: each its index map and
    block check (``ChipModel.operand_step_seconds``), more where the block index is
    computed at every step and checked against the last (``dynamic_operand_step_seconds``),
    more where it reads a scalar-prefetch table for it (``table_operand_step_seconds``),
    unless every blocked operand is one XLA placed in VMEM (``local``: ``("in", name)``,
    ``("out", name)``): such a kernel has no block to fetch, only addresses. On a v5e jax's
    flash backward kernels (every operand in VMEM) run a grid step as fast as round 6's
    step on resident blocks (437 against 440 ns at 128-blocks), while gated-delta (four of
    six operands in VMEM) pays the check: exempting its VMEM operands put it 8% low."""
    kernel = info.kernel
    if kernel is None:
        return 0.0
    blocked = [(("in", o.name), o) for o in kernel.inputs if not o.in_hbm]
    blocked += [(("out", o.name), o) for o in kernel.outputs if not o.in_hbm]
    dynamic = sum(o.dynamic for _, o in blocked)
    tables = sum(o.reads_table for _, o in blocked)
    if blocked and all(key in local for key, _ in blocked):
        dynamic = tables = 0
    return (len(blocked) * chip.operand_step_seconds
            + dynamic * chip.dynamic_operand_step_seconds
            + tables * chip.table_operand_step_seconds)


def _pipeline_vmem(info: LaunchInfo) -> int:
    """VMEM the pipeline's extra buffers take on each core: the interpreter allocates
    one block per blocked operand, a TPU ``Buffered(n)`` holds n."""
    kernel = info.kernel
    total = 0
    for spec in (*getattr(kernel, "inputs", ()), *getattr(kernel, "outputs", ())):
        if getattr(spec, "space", None) is MemorySpace.VMEM:
            nbytes = math.prod(spec.block_shape) * spec.dtype.itemsize
            total += (spec.buffer_count - 1) * nbytes
    return total


_END = operator.itemgetter(4)


def _dma_spans(raw: list[RawSpan]) -> list[RawSpan]:
    """The DMA spans of ``raw`` in ``span_order`` (a stable sort): track by track, each
    track's own in its order (a DMA engine lane's spans come nearly sorted)."""
    tracks: dict[Any, list[RawSpan]] = {}
    for s in raw:
        if s[2] == "dma":
            tracks.setdefault(s[0], []).append(s)
    return [s for track in sorted(tracks) for s in sorted(tracks[track], key=span_order)]


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.2f} us"


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.2f} MiB"


class LaunchRecord:
    """The predicted TPU timeline of one kernel launch (see ``palladium.interpret.timeline``).

    ``predicted_seconds``: the launch's time on the simulated chip. ``spans``: every
    interval (grid steps, compute, DMAs, waits, barriers) on its track. ``summary()``:
    the table users read.
    """

    def __init__(self, recorder: TimelineRecorder, index: int = 0) -> None:
        self.info = recorder.info
        self.index = index  # the launch's number in its timeline (#0 first)
        self.kernel_name = recorder.info.kernel_name
        self.grid = recorder.info.grid
        self.chip: ChipModel = recorder.chip
        self.num_devices = recorder.info.num_devices
        self.cores_per_device = recorder.info.num_cores
        self.failed = recorder.error is not None
        self.error: str | None = recorder.error  # "Type: first line" of a failed launch
        self.detail_dropped = False
        self._detail_limit: int | None = None
        raw: list[RawSpan] = []
        stats: dict[CoreId, CoreStats] = {}
        vmem: dict[CoreId, list[tuple[float, int]]] = {}
        resource_bytes: dict[Any, int] = {}
        bandwidth: dict[str, float] = {}
        if not self.failed:  # a failed launch's events stop anywhere: not replayed
            extra = _pipeline_vmem(recorder.info)
            cores = recorder.cores or tuple(recorder.events)
            replay = Replay(dict(recorder.events), cores, recorder.chip, self.cores_per_device,
                            vmem_base=dict.fromkeys(cores, extra),
                            operand_seconds=_operand_step_seconds(
                                recorder.info, recorder.chip, recorder.local_operands))
            replay.run()
            raw = replay.raw_spans
            stats, vmem = replay.stats, replay.vmem
            resource_bytes, bandwidth = dict(replay.resource_bytes), replay.bandwidth
        # the spans as the replay left them, made Span objects (sorted) when first read:
        # a prediction reads none of them
        self._raw: list[RawSpan] | None = raw
        self._spans: list[Span] | None = None
        self.core_stats: dict[CoreId, CoreStats] = stats
        self._vmem: dict[CoreId, list[tuple[float, int]]] = vmem
        self.resource_bytes = resource_bytes
        self.bandwidth = bandwidth
        self.flops = recorder.flops  # MXU flops
        self.vector_flops = recorder.vector_flops  # floating-point vector-unit flops
        self.transcendentals = recorder.transcendentals  # elements of exp, log, tanh...
        self.by_primitive = dict(recorder.by_primitive)
        self.by_unit = dict(recorder.by_unit)
        ends = [max(map(_END, raw))] if raw else []  # (the first of equal ones, as before)
        ends += [st.end for st in stats.values()]
        self.predicted_seconds: float = max(ends, default=0.0)
        # (added in the spans' order, as read: the DMAs' own order within it, the sort
        # being stable)
        dmas = _dma_spans(raw)
        self.dma_seconds = sum(s[4] - s[3] for s in dmas)
        self.dma_bytes = sum(s[5].get("bytes", 0) for s in dmas)  # type: ignore[union-attr]
        # the most VMEM in use on any core (allocations, plus the pipeline's extra
        # ``Buffered(n)`` block buffers)
        self.vmem_peak_bytes = max((b for samples in vmem.values() for _, b in samples),
                                   default=0)

    # -- detail: every span and VMEM sample (the summary does not need them) -------------
    @property
    def spans(self) -> list[Span]:
        """Every interval (grid steps, compute, DMAs, waits, barriers) on its track;
        ``ConfigError`` once the timeline dropped them (``detail_limit``)."""
        self._check_detail()
        if self._spans is None:
            self._spans = make_spans(sorted(self._raw or (), key=span_order))
            self._raw = None
        return self._spans

    @property
    def vmem(self) -> dict[CoreId, list[tuple[float, int]]]:
        """Per core, (time, bytes of VMEM in use) at every change (dropped with the
        spans)."""
        self._check_detail()
        return self._vmem

    @property
    def num_spans(self) -> int:
        """How many spans the record holds (0 once dropped)."""
        return len(self._raw or ()) if self._spans is None else len(self._spans)

    def drop_detail(self, limit: int | None = None) -> None:
        """Forget the spans and VMEM samples, keep the summary (``limit``: the timeline's
        ``detail_limit`` that made it drop them, for the message)."""
        self._spans, self._raw, self._vmem = [], None, {}
        self.detail_dropped = True
        self._detail_limit = limit

    def _check_detail(self) -> None:
        if self.detail_dropped:
            raise ConfigError(
                f"the spans of kernel '{self.kernel_name}' (launch #{self.index}) were "
                f"dropped: the timeline keeps at most {self._detail_limit} spans "
                f"(detail_limit), older launches' first. Pass "
                f"palladium.interpret.timeline(trace_file=...) to stream every launch's "
                f"trace to a file as it ends, or detail_limit=None to keep them all."
            )

    # -- what the summary reports ----------------------------------------------------------
    @functools.cached_property
    def critical_core(self) -> CoreId:
        """The core that finishes last (ties: the lowest id; (0, 0) for a failed launch)."""
        if not self.core_stats:
            return (0, 0)
        return max(sorted(self.core_stats), key=lambda c: self.core_stats[c].end)

    @property
    def _critical_stats(self) -> CoreStats:
        return self.core_stats.get(self.critical_core) or CoreStats()

    @property
    def compute_seconds(self) -> float:
        """Busy compute time of the critical core."""
        return self._critical_stats.compute

    @property
    def overhead_seconds(self) -> float:
        """Per-step overhead, prologue and epilogue of the critical core."""
        return self._critical_stats.overhead

    @property
    def exposed_dma_seconds(self) -> float:
        """Time the critical core waited for DMAs (HBM, ICI and the host link): DMA time
        not hidden behind its compute."""
        exposed = self._critical_stats.exposed
        return exposed.get("hbm", 0.0) + exposed.get("ici", 0.0) + exposed.get("host", 0.0)

    def busy_seconds(self, resource: str) -> float:
        """How long the busiest device's ``"hbm"`` or ``"ici"`` link must stream:
        its bytes over its bandwidth."""
        return max((n / self.bandwidth[kind] for (kind, _), n in self.resource_bytes.items()
                    if kind == resource), default=0.0)

    @property
    def bound(self) -> str:
        """The resource that needs the most time: ``"compute"`` (the critical core's
        compute), ``"HBM"`` / ``"ICI"`` / ``"host link"`` (the busiest device's bytes over bandwidth) or
        ``"per-step overhead"`` (grid steps x overhead, prologue, epilogue);
        ``"synchronisation"`` when waits on other cores' signals or barriers exceed
        them all."""
        exposed = self._critical_stats.exposed
        parts = {
            "compute": self.compute_seconds,
            "HBM": self.busy_seconds("hbm"),
            "ICI": self.busy_seconds("ici"),
            "host link": self.busy_seconds("host"),
            "per-step overhead": self.overhead_seconds,
            "synchronisation": exposed.get("sem", 0.0) + exposed.get("barrier", 0.0),
        }
        return max(parts, key=lambda k: parts[k])

    @property
    def mxu_utilisation(self) -> float:
        """MXU flops over what every core's MXUs could do in the predicted time."""
        cores = self.num_devices * self.cores_per_device
        if not self.predicted_seconds:
            return 0.0
        return self.flops / (self.predicted_seconds * self.chip.mxu_bf16_flops * cores)

    @property
    def vmem_limit_bytes(self) -> int:
        """The kernel's scoped-VMEM limit: ``CompilerParams(vmem_limit_bytes=...)``, else
        XLA's default for the chip."""
        cp = getattr(self.info.kernel, "compiler_params", None)
        limit = getattr(cp, "vmem_limit_bytes", None)
        return int(limit) if limit else self.chip.vmem_limit_bytes

    def top_primitives(self, n: int = 5) -> list[tuple[str, float]]:
        """The ``n`` primitives with the most compute time (all cores)."""
        return sorted(self.by_primitive.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def summary(self) -> str:
        """A table: time, bound, compute / DMA / exposed DMA, MXU use, top primitives,
        VMEM peak vs capacity."""
        c = self.chip
        head = (f"kernel '{self.kernel_name}' on {self.num_devices} x TPU {c.chip} "
                f"({self.cores_per_device} core(s) each), grid {self.grid}")
        if self.failed:
            return f"{head}: FAILED ({self.error})"
        steps = self._critical_stats.steps
        lines = [
            head,
            f"  predicted time      {_us(self.predicted_seconds)}",
            f"  bound               {self.bound}",
            f"  compute             {_us(self.compute_seconds)}  (critical core "
            f"{self.critical_core})",
            f"  DMA                 {_us(self.dma_seconds)}  ({self.dma_bytes:,} bytes, all "
            f"engines)",
            f"  exposed DMA         {_us(self.exposed_dma_seconds)}",
            f"  step overhead       {_us(self.overhead_seconds)}  ({steps} step(s) x "
            f"{_us(c.step_overhead_s)} + prologue/epilogue)",
            f"  MXU utilisation     {self.mxu_utilisation:.1%}",
            f"  VMEM peak           {_mib(self.vmem_peak_bytes)} (scoped limit "
            f"{_mib(self.vmem_limit_bytes)}, capacity {_mib(c.vmem_capacity_bytes)})"
            + ("  OVER THE LIMIT" if self.vmem_peak_bytes > self.vmem_limit_bytes else ""),
            "  top primitives      "
            + (", ".join(f"{name} {_us(t)}" for name, t in self.top_primitives()) or "none"),
        ]
        memory = self.info.memory
        if getattr(memory, "compiler_vmem_bytes", None) is not None:
            lines.insert(-1, f"  compiler's VMEM     {_mib(memory.compiler_vmem_bytes)} "
                             f"(scoped, {memory.checker})")
        return "\n".join(lines)

    def __repr__(self) -> str:
        if self.failed:
            return f"LaunchRecord('{self.kernel_name}', failed={self.error!r})"
        return (f"LaunchRecord('{self.kernel_name}', predicted_seconds="
                f"{self.predicted_seconds:.3e}, bound='{self.bound}')")

    def to_dict(self) -> dict[str, Any]:
        """The record's numbers (for scripts and benchmarks)."""
        return {
            "kernel": self.kernel_name, "chip": self.chip.chip, "grid": list(self.grid),
            "predicted_seconds": self.predicted_seconds, "bound": self.bound,
            "compute_seconds": self.compute_seconds, "dma_seconds": self.dma_seconds,
            "exposed_dma_seconds": self.exposed_dma_seconds,
            "overhead_seconds": self.overhead_seconds, "flops": self.flops,
            "dma_bytes": self.dma_bytes, "mxu_utilisation": self.mxu_utilisation,
            "vmem_peak_bytes": self.vmem_peak_bytes,
            "compiler_vmem_bytes": getattr(self.info.memory, "compiler_vmem_bytes", None),
        }
