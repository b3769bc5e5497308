"""The performance model's constants: one :class:`ChipModel` per simulated chip.

Every number below says where it comes from. Chip facts (MXU peaks, HBM bandwidth,
VMEM capacity and XLA's default scoped-VMEM limit, MXU shape, TensorCores per chip) are
palladium's one chip record, ``palladium.interpret.chip.chip_record`` (read from jax's own
``TpuInfo``, per TensorCore); what ``TpuInfo`` lacks (clock, ICI bandwidth, latencies,
per-step overhead) is tabled here, next to it, with its public source or marked as an
assumption.

Measured chips (:data:`MEASURED_CHIPS`, today the v5e) replace the spec-derived rates and
the assumed latencies with what microbenchmarks timed on the chip itself give
(``perf/measured/<chip>.json``: each constant, the microbenchmarks it comes from and
how; ``benchmarks/chip/`` has the kernels, the timer and the fit). Other chips take the
measured chip's cycles at their own clock and its efficiencies at their own peaks, and
say so: their ``measured`` is empty.

>>> m = chip_model("v5e")
>>> round(m.mxu_bf16_flops / 1e12), round(m.hbm_bytes_per_second / 1e9), m.clock_hz
(196, 820, 1500000000.0)
>>> round(m.hbm_read_bytes_per_second / 1e9), round(m.hbm_write_bytes_per_second / 1e9)
(749, 649)
>>> "mxu_bf16_flops" in m.measured, "mxu_bf16_flops" in chip_model("v6e").measured
(True, False)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping
from importlib import resources
from typing import Any

from palladium.interpret.chip import chip_record

__all__ = ["MEASURED_CHIPS", "ChipModel", "chip_model", "measured_constants"]

#: Per-grid-step overhead of a pipelined ``pallas_call``: "about 0.35 us" per grid
#: iteration, the figure the Pallas TPU pipelining guide gives
#: (docs.jax.dev/en/latest/pallas/tpu/pipelining.html) and issue 10 quotes.
STEP_OVERHEAD_S = 0.35e-6

#: Fixed latency of one DMA before its bytes flow (issue, descriptor, first bytes).
#: ASSUMPTION: no public figure; chosen below the per-step overhead so that a
#: double-buffered pipeline of small blocks hides it, as TPU profiles of small-block
#: kernels (step-overhead bound) suggest.
DMA_LATENCY_S = 0.25e-6

#: Prologue / epilogue of a pipeline whose blocks move (set-up and drain, outside the
#: pipeline: before its first block copy, after its last). ASSUMPTION for chips not
#: measured: one step overhead each (the v5e's is fitted from round 22's copies).
LAUNCH_OVERHEAD_S = STEP_OVERHEAD_S

#: Vector-unit throughput: vreg operations ((8, 128) 32-bit elements each) per cycle.
#: ASSUMPTION from the TPUv2/v3 VLIW bundle (Norrie et al., "The Design Process for
#: Google's Training Chips: TPUv2 and TPUv3", IEEE Micro 2021: 2 scalar, 4 vector
#: (2 of them load/store), 2 matrix-push, 1 matrix-pop slots): 2 vector-ALU ops per cycle.
VPU_VREG_OPS_PER_CYCLE = 2
#: Transcendentals (exp, log, tanh, logistic, rsqrt, erf, sin, cos ...) run on the
#: extended unit, ASSUMED 1 vreg per cycle (one EUP slot), plus their VALU work.
EUP_VREG_OPS_PER_CYCLE = 1
#: Vector loads / stores between VMEM and vregs: 1 vreg load and 1 vreg store per cycle
#: (the bundle's load and store slots, same source).
VMEM_VREGS_PER_CYCLE = 1
#: Elements of one vreg: 8 sublanes x 128 lanes of 32 bits (``TpuInfo.num_sublanes`` x
#: ``num_lanes``); 16-bit types pack 2 per 32-bit element, 8-bit 4.
VREG_BYTES = 8 * 128 * 4

#: TensorCore clocks published by Google (TPU v4 paper, Jouppi et al. ISCA 2023: v2 700
#: MHz, v3 940 MHz, v4 1050 MHz; Cloud TPU v5e/v5p docs: 1.5 / 1.75 GHz; the scaling
#: book, jax-ml.github.io/scaling-book/tpus: v5e MXU "5e13 bf16 FLOPs/s at 1.5 GHz").
#: Newer chips: derived as MXU peak / (2 x 4 MXUs x mxu_column_size^2) (ASSUMPTION:
#: 4 MXUs; gives 1.75 GHz for v6e).
_CLOCK_HZ: dict[str, float] = {
    "v2": 0.70e9, "v3": 0.94e9, "v4": 1.05e9, "v4i": 1.05e9, "v5e": 1.5e9, "v5p": 1.75e9,
}

#: ICI bandwidth, bytes/s one way on one link (a ring neighbour), from the scaling book's
#: chip table (jax-ml.github.io/scaling-book/tpus, "ICI one-way bandwidth per link"):
#: v4 / v5e 4.5e10, v5p / v6e 9e10. v2 / v3 / v7 / TPU8i: ASSUMED (v4's, v6e's).
_ICI_BYTES_PER_S: dict[str, float] = {
    "v2": 4.5e10, "v3": 4.5e10, "v4": 4.5e10, "v4i": 4.5e10, "v5e": 4.5e10, "v5p": 9e10,
    "v6e": 9e10, "v7": 9e10, "v7x": 9e10, "v8i": 9e10,
}

#: DMAs to and from the host's memory (``pl.HOST``) cross the host link, bytes/s one way.
#: ASSUMPTION: a PCIe 4.0 x16 link (~32 GB/s) shared by the device's DMAs, for every chip.
HOST_BYTES_PER_S = 32e9


#: The chips whose constants were measured on the chip itself: ``perf/measured/<chip>.json``
#: (written by ``benchmarks/chip/fit_constants.py`` from the microbenchmarks of
#: ``benchmarks/chip/calibration_kernels.py``, timed by ``calibrate_on_chip.py``).
MEASURED_CHIPS = ("v5e",)

#: The measured table's constants (``perf/measured/<chip>.json``) named otherwise in
#: ``ChipModel``: every other one sets the field of its own name.
_RENAMED = {
    "dma_latency_in_seconds": "dma_latency_in_s",
    "dma_latency_out_seconds": "dma_latency_out_s",
    "dma_latency_hbm_seconds": "dma_latency_hbm_s",
    "dma_latency_local_seconds": "dma_latency_local_s",
    "block_copy_issue_seconds": "block_copy_issue_s",
    "step_overhead_seconds": "step_overhead_s",
    "launch_overhead_seconds": "launch_overhead_s",
}

#: Constants counted in cycles of the measured chip: a chip that was not measured gets
#: the v5e's cycles at its own clock (ASSUMPTION: the same core design).
_CYCLE_FIELDS = ("valu_vreg_seconds", "dependent_op_seconds", "loop_iteration_seconds",
                 "load_use_seconds", "vmem_vreg_seconds", "mxu_dot_seconds",
                 "mxu_weight_tile_seconds", "mxu_transposed_rhs_seconds",
                 "step_overhead_s", "launch_overhead_s", "dma_min_seconds",
                 "dma_min_deep_seconds", "xlu_latency_seconds",
                 "sublane_reduce_latency_seconds", "branch_seconds",
                 "predicated_seconds", "predicated_dma_seconds", "operand_step_seconds",
                 "strided_copy_seconds", "dynamic_operand_step_seconds",
                 "table_operand_step_seconds")


@dataclasses.dataclass(frozen=True)
class ChipModel:
    """What the performance model needs to know about one simulated chip (per
    TensorCore unless said otherwise). Build one with :func:`chip_model`, or by hand
    to ask "what if" questions. ``measured`` names the fields measured on that chip
    (``perf/measured/<chip>.json``); every other field is assumed (spec-derived, or the
    v5e's measured cycles at this chip's clock)."""

    chip: str
    clock_hz: float
    mxu_bf16_flops: float  # dense bf16 MXU rate, FLOP/s per TensorCore
    mxu_int8_ops: float  # int8 rate (bf16 rate where TpuInfo says 0)
    mxu_fp8_ops: float  # TpuInfo fp8 peak (bf16 peak where TpuInfo says 0)
    hbm_bytes_per_second: float  # per TensorCore (TpuInfo mem_bw_bytes_per_second)
    ici_bytes_per_second: float  # one link, one direction
    vmem_capacity_bytes: int  # per TensorCore (TpuInfo)
    vmem_limit_bytes: int  # XLA's default scoped-VMEM limit (chip_facts)
    tensor_cores_per_chip: int = 1
    host_bytes_per_second: float = HOST_BYTES_PER_S  # the host link (pl.HOST DMAs)
    dma_latency_s: float = DMA_LATENCY_S
    step_overhead_s: float = STEP_OVERHEAD_S
    launch_overhead_s: float = LAUNCH_OVERHEAD_S
    vpu_vreg_ops_per_cycle: float = VPU_VREG_OPS_PER_CYCLE
    eup_vreg_ops_per_cycle: float = EUP_VREG_OPS_PER_CYCLE
    vmem_vregs_per_cycle: float = VMEM_VREGS_PER_CYCLE
    vreg_bytes: int = VREG_BYTES
    #: (sublanes, lanes) of a vreg: a 2-D array occupies whole (8, 128) tiles of 32-bit
    #: words (a (128, 1) column as many vregs as a (128, 128) block)
    vreg_tile: tuple[int, int] = (8, 128)
    #: rows of a dot's left operand the MXU streams as one unit: a dot's first rows come
    #: out (and a dependent dot starts) before its last ones (TpuInfo's MXU size)
    mxu_rows: int = 128
    # --- measured on the chip (see MEASURED_CHIPS); None: derived from the above -------
    #: HBM bytes per second of reads into VMEM, writes from VMEM, and HBM -> HBM copies
    #: (bytes moved); a device's DMAs share one HBM: each byte costs 1 / its rate.
    hbm_read_bytes_per_second: float | None = None
    hbm_write_bytes_per_second: float | None = None
    hbm_copy_bytes_per_second: float | None = None
    #: One DMA started and waited for, beyond its bytes: HBM -> VMEM, VMEM -> HBM,
    #: HBM -> HBM (a grid pipeline's block copies too).
    dma_latency_in_s: float | None = None
    dma_latency_out_s: float | None = None
    dma_latency_hbm_s: float | None = None
    #: A DMA between on-core memories (VMEM -> VMEM, VMEM <-> SMEM; a pipeline's block
    #: copy of an operand XLA placed in VMEM): its latency and bytes per second, on the
    #: core's own DMA path, not the HBM's. None: as an HBM read (the default).
    dma_latency_local_s: float | None = None
    local_dma_bytes_per_second: float | None = None
    #: the core's time to issue one of a grid pipeline's block copies (0: not modelled)
    block_copy_issue_s: float = 0.0
    #: Seconds per (8, 128) 32-bit vreg of a plain vector ALU op, of each primitive
    #: measured apart, and of a vector load or store.
    valu_vreg_seconds: float | None = None
    vector_op_vreg_seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)
    vmem_vreg_seconds: float | None = None
    #: A 16-bit float element's cost relative to a 32-bit one's: vector ALU ops and
    #: transcendentals (0.5: packed two per 32-bit lane, as the spec-derived default).
    narrow_valu_factor: float = 0.5
    narrow_transcendental_factor: float = 0.5
    #: Per transcendental measured apart ("exp", "sin" ...): its 16-bit element's cost
    #: relative to its 32-bit one's (the chip's bf16 transcendentals differ by op: a v5e
    #: 0.3-1.5x); others take ``narrow_transcendental_factor``.
    narrow_transcendental_factors: Mapping[str, float] = dataclasses.field(
        default_factory=dict)
    #: Latency of one dependent vector op, of a loop iteration, of a load/store on the
    #: dependent chain (0: not modelled).
    dependent_op_seconds: float = 0.0
    #: ... and of the transcendentals measured apart (others: the median of these)
    vector_op_latency_seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)
    loop_iteration_seconds: float = 0.0
    load_use_seconds: float = 0.0
    #: Latency of a cross-lane op on the chain (a reduction over the lanes, a column
    #: spread over them) and of a reduction over sublanes (0: not modelled)
    xlu_latency_seconds: float = 0.0
    sublane_reduce_latency_seconds: float = 0.0
    #: A conditional (``pl.when``, ``lax.cond``): a basic block ends, the ops after it
    #: issue after the ops before it did, and this much later (0: not modelled)
    branch_seconds: float = 0.0
    #: ... unless a branch starts DMAs and has at most this many equations: the
    #: compiler predicates it, and its DMA starts' issue costs the core this much and
    #: this much each, taken or not (0: no conditional is predicated)
    predicated_branch_equations: int = 0
    predicated_seconds: float = 0.0
    predicated_dma_seconds: float = 0.0
    #: Per grid step and blocked operand: its index map and block check on the scalar
    #: unit (beside ``step_overhead_s``; 0: not modelled)
    operand_step_seconds: float = 0.0
    #: ... more per grid step for an operand whose index map computes its block index
    #: (it depends on the grid or scalar prefetch) and checks it against the last step's
    dynamic_operand_step_seconds: float = 0.0
    #: ... and more for one whose index map reads a scalar-prefetch table (SMEM) for it
    table_operand_step_seconds: float = 0.0
    #: A pipeline block copy whose block is pieces of its array ((128, 128) of a (2048,
    #: 2048) array): the DMA engine's time more than the bytes' (0: not modelled)
    strided_copy_seconds: float = 0.0
    #: The MXU: one dot's fixed cost, each (128, 128) weight tile's load, and the passes
    #: of a precision=HIGHEST f32 dot.
    mxu_dot_seconds: float = 0.0
    #: the least time a kernel's own DMA holds the DMA engine, however few its bytes
    #: (a page gather's small DMAs are bound by it; a big DMA's bytes hide it)
    dma_min_seconds: float = 0.0
    #: ... and, from its ``dma_burst_depth``-th DMA of a burst on (those the core started
    #: together), the least time of each further one (0: as ``dma_min_seconds``)
    dma_min_deep_seconds: float = 0.0
    dma_burst_depth: int = 16
    mxu_weight_tile_seconds: float = 0.0
    #: a dot contracting its right operand's last dimension (``q @ k.T``) whose operand
    #: has 128 rows or more: its transpose, per 256 rows begun (fewer rows: none)
    mxu_transposed_rhs_seconds: float = 0.0
    f32_highest_passes: float = 6.0
    #: HBM time of reads and writes in flight together over their time apart (1: none)
    hbm_mixed_factor: float = 1.0
    #: block copies larger than this do not mix directions: an input block copy waits
    #: to issue while an output block copy is issued and not yet flowing (inf: no rule)
    mixed_copy_limit_bytes: float = math.inf
    #: a value vector ops make of at least this many vregs does not stay in the vector
    #: registers: it is written to VMEM whole, and a dot taking it as its left operand
    #: waits for all of it instead of streaming its first rows (0: no such rule)
    spill_vregs: int = 0
    measured: frozenset[str] = frozenset()

    def hbm_byte_seconds(self, kind: str, cores: int = 1) -> float:
        """Seconds of a device's HBM one byte of a ``kind`` transfer costs: ``"in"``
        (HBM -> VMEM/SMEM), ``"out"`` (to HBM) or ``"hbm"`` (HBM -> HBM: read and
        written, so half the bandwidth where it was not measured)."""
        scale = min(max(cores, 1), self.tensor_cores_per_chip)
        rate = {"in": self.hbm_read_bytes_per_second, "out": self.hbm_write_bytes_per_second,
                "hbm": self.hbm_copy_bytes_per_second}.get(kind)
        if rate is None:
            rate = self.hbm_bytes_per_second / (2.0 if kind == "hbm" else 1.0)
        return 1.0 / (rate * scale)

    def dma_latency(self, kind: str) -> float:
        """The fixed latency of one DMA of ``kind`` (``"in"``, ``"out"``, ``"hbm"``,
        ``"local"``; anything else: the default)."""
        value = {"in": self.dma_latency_in_s, "out": self.dma_latency_out_s,
                 "hbm": self.dma_latency_hbm_s, "local": self.dma_latency_local_s}.get(kind)
        if value is None and kind == "local":
            value = self.dma_latency_in_s
        return self.dma_latency_s if value is None else value

    def local_bytes_per_second(self) -> float:
        """The rate of a DMA between on-core memories (an HBM read's where not measured)."""
        if self.local_dma_bytes_per_second is not None:
            return self.local_dma_bytes_per_second
        return 1.0 / self.hbm_byte_seconds("in")

    def vector_vreg_seconds(self, primitive: str, transcendental: bool) -> float:
        """Seconds per vreg of a vector op: measured per primitive where the chip was,
        else the chip's VALU cost (or the VLIW default rates)."""
        found = self.vector_op_vreg_seconds.get(primitive)
        if found is not None:
            return found
        if transcendental:
            measured = [v for k, v in self.vector_op_vreg_seconds.items()
                        if k in ("exp", "log", "tanh")]
            if measured:
                return max(measured)
            return 1.0 / (self.eup_vreg_ops_per_cycle * self.clock_hz)
        if self.valu_vreg_seconds is not None:
            return self.valu_vreg_seconds
        return 1.0 / (self.vpu_vreg_ops_per_cycle * self.clock_hz)

    def vector_latency(self, primitive: str, transcendental: bool, per_vreg: float) -> float:
        """The latency of a vector op on a dependent chain (0 where not modelled)."""
        if not self.dependent_op_seconds:
            return 0.0
        found = self.vector_op_latency_seconds.get(primitive)
        if found is None and transcendental and self.vector_op_latency_seconds:
            found = sorted(self.vector_op_latency_seconds.values())[
                len(self.vector_op_latency_seconds) // 2]
        return max(found or 0.0, self.dependent_op_seconds, per_vreg)

    def vmem_seconds_per_vreg(self) -> float:
        if self.vmem_vreg_seconds is not None:
            return self.vmem_vreg_seconds
        return 1.0 / (self.vmem_vregs_per_cycle * self.clock_hz)


def measured_constants(chip: str) -> dict[str, Any] | None:
    """The measured table of ``chip`` (``perf/measured/<chip>.json``: each constant's
    value, the microbenchmarks it comes from and how), or None if it was not measured."""
    return _measured_table(chip) if chip in MEASURED_CHIPS else None


@functools.cache
def _measured_table(chip: str) -> dict[str, Any]:
    text = resources.files("palladium.interpret.perf").joinpath(
        f"measured/{chip}.json").read_text()
    return dict(json.loads(text))


@functools.cache
def chip_model(chip: str) -> ChipModel:
    """The model of ``chip`` (a palladium chip name: ``"v5e"``, ``"v6e"`` ...)."""
    facts = chip_record(chip).facts
    bf16 = float(facts.bf16_ops_per_second)
    clock = _CLOCK_HZ.get(chip) or bf16 / (2 * 4 * facts.mxu_column_size ** 2)
    base = ChipModel(
        chip=chip,
        clock_hz=clock,
        mxu_bf16_flops=bf16,
        mxu_int8_ops=float(facts.int8_ops_per_second or bf16),
        mxu_fp8_ops=float(facts.fp8_ops_per_second or bf16),
        hbm_bytes_per_second=float(facts.hbm_bandwidth_bytes_per_second),
        ici_bytes_per_second=_ICI_BYTES_PER_S[chip],
        vmem_capacity_bytes=int(facts.vmem_capacity_bytes),
        vmem_limit_bytes=int(facts.default_scoped_vmem_limit_bytes),
        tensor_cores_per_chip=int(facts.tensor_cores_per_chip),
        vreg_bytes=int(facts.num_sublanes * facts.num_lanes * 4),
        vreg_tile=(int(facts.num_sublanes), int(facts.num_lanes)),
        mxu_rows=int(facts.mxu_column_size),
    )
    table = measured_constants(chip)
    if table is not None:
        values = {_RENAMED.get(k, k): c["value"] for k, c in table["constants"].items()}
        return dataclasses.replace(base, **values, measured=frozenset(values))
    return _from_reference(base, MEASURED_CHIPS[0])


def _from_reference(base: ChipModel, reference: str) -> ChipModel:
    """An unmeasured chip: the reference chip's measured cycles at this chip's clock, its
    measured HBM efficiency at this chip's HBM bandwidth, its MXU efficiency at this
    chip's peak (every one an ASSUMPTION, and not in ``measured``)."""
    ref = chip_model(reference)
    cycles = {f: getattr(ref, f) * ref.clock_hz / base.clock_hz for f in _CYCLE_FIELDS}
    ops = {k: v * ref.clock_hz / base.clock_hz for k, v in ref.vector_op_vreg_seconds.items()}
    lat = {k: v * ref.clock_hz / base.clock_hz
           for k, v in ref.vector_op_latency_seconds.items()}
    hbm = base.hbm_bytes_per_second / ref.hbm_bytes_per_second
    mxu = ref.mxu_bf16_flops / float(chip_record(reference).facts.bf16_ops_per_second)
    # chips from v6e on have bf16 vector units: the packed default
    narrow = chip_record(base.chip).facts.generation <= 5
    return dataclasses.replace(
        base, **cycles, vector_op_vreg_seconds=ops, vector_op_latency_seconds=lat,
        mxu_bf16_flops=base.mxu_bf16_flops * mxu,
        hbm_read_bytes_per_second=_times(ref.hbm_read_bytes_per_second, hbm),
        hbm_write_bytes_per_second=_times(ref.hbm_write_bytes_per_second, hbm),
        hbm_copy_bytes_per_second=_times(ref.hbm_copy_bytes_per_second, hbm),
        dma_latency_in_s=ref.dma_latency_in_s, dma_latency_out_s=ref.dma_latency_out_s,
        dma_latency_hbm_s=ref.dma_latency_hbm_s, block_copy_issue_s=ref.block_copy_issue_s,
        # (a local DMA moves VMEM's bytes: at this chip's clock)
        dma_latency_local_s=ref.dma_latency_local_s,
        local_dma_bytes_per_second=_times(ref.local_dma_bytes_per_second,
                                          base.clock_hz / ref.clock_hz),
        f32_highest_passes=ref.f32_highest_passes, hbm_mixed_factor=ref.hbm_mixed_factor,
        mixed_copy_limit_bytes=ref.mixed_copy_limit_bytes,
        predicated_branch_equations=ref.predicated_branch_equations,
        spill_vregs=ref.spill_vregs, dma_burst_depth=ref.dma_burst_depth,
        narrow_valu_factor=ref.narrow_valu_factor if narrow else 0.5,
        narrow_transcendental_factor=ref.narrow_transcendental_factor if narrow else 0.5,
        narrow_transcendental_factors=ref.narrow_transcendental_factors if narrow else {},
    )


def _times(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor
