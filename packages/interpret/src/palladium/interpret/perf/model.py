"""The performance model's constants: one :class:`ChipModel` per simulated chip.

Every number below says where it comes from. Chip facts (MXU peaks, HBM bandwidth,
VMEM capacity and XLA's default scoped-VMEM limit, MXU shape, TensorCores per chip) are
palladium's one chip record, ``palladium.interpret.chip.chip_record`` (read from jax's own
``TpuInfo``, per TensorCore); what ``TpuInfo`` lacks (clock, ICI bandwidth, latencies,
per-step overhead) is tabled here, next to it, with its public source or marked as an
assumption.

>>> m = chip_model("v5e")
>>> round(m.mxu_bf16_flops / 1e12), round(m.hbm_bytes_per_second / 1e9), m.clock_hz
(197, 820, 1500000000.0)
"""

from __future__ import annotations

import dataclasses
import functools

from palladium.interpret.chip import chip_record

__all__ = ["ChipModel", "chip_model"]

#: Per-grid-step overhead of a pipelined ``pallas_call``: "about 0.35 us" per grid
#: iteration, the figure the Pallas TPU pipelining guide gives
#: (docs.jax.dev/en/latest/pallas/tpu/pipelining.html) and issue 10 quotes.
STEP_OVERHEAD_S = 0.35e-6

#: Fixed latency of one DMA before its bytes flow (issue, descriptor, first bytes).
#: ASSUMPTION: no public figure; chosen below the per-step overhead so that a
#: double-buffered pipeline of small blocks hides it, as TPU profiles of small-block
#: kernels (step-overhead bound) suggest.
DMA_LATENCY_S = 0.25e-6

#: Kernel launch prologue / epilogue (program start, pipeline set-up and drain control).
#: ASSUMPTION: one step overhead each.
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


@dataclasses.dataclass(frozen=True)
class ChipModel:
    """What the performance model needs to know about one simulated chip (per
    TensorCore unless said otherwise). Build one with :func:`chip_model`, or by hand
    to ask "what if" questions."""

    chip: str
    clock_hz: float
    mxu_bf16_flops: float  # dense bf16 MXU peak, FLOP/s per TensorCore (TpuInfo)
    mxu_int8_ops: float  # TpuInfo int8 peak (bf16 peak where TpuInfo says 0)
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

    def hbm_bandwidth(self, cores: int) -> float:
        """HBM bandwidth of a device simulated with ``cores`` TensorCores (TpuInfo's
        figure is per TensorCore; a megacore device has the chip's, never more)."""
        return self.hbm_bytes_per_second * min(max(cores, 1), self.tensor_cores_per_chip)


@functools.cache
def chip_model(chip: str) -> ChipModel:
    """The model of ``chip`` (a palladium chip name: ``"v5e"``, ``"v6e"`` ...)."""
    facts = chip_record(chip).facts
    bf16 = float(facts.bf16_ops_per_second)
    clock = _CLOCK_HZ.get(chip) or bf16 / (2 * 4 * facts.mxu_column_size ** 2)
    return ChipModel(
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
    )
