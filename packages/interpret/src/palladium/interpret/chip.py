"""The TPU chips palladium simulates: their facts, and which one a launch simulates.

The chip table comes from jax's own ``tpu_info`` (``get_tpu_info_for_chip``, through
``_jax_compat``), not a hand-typed copy; the one fact jax does not state there is XLA's
default scoped-VMEM limit (see :data:`DEFAULT_SCOPED_VMEM_LIMIT_BYTES`). Every number is
per TensorCore, as jax gives it (a megacore chip's two cores each have the stated VMEM).
Tiles and fills are ``palladium.shared_memory.tpu_facts`` (jax-free, plain data).

Which chip a launch simulates, in order: ``InterpretParams.chip`` when given; else the
device kind of the abstract device of the current abstract mesh
(``jax.sharding.use_abstract_mesh(AbstractMesh(..., abstract_device=AbstractDevice(
device_kind="TPU v5e", ...)))``) when it names a TPU; else the default device's kind
when it is a TPU; else :data:`DEFAULT_CHIP`.

>>> chip_of_device_kind("TPU v5 lite"), chip_of_device_kind("cpu")
('v5e', None)
>>> CHIP_GENERATIONS["v3"], CHIP_GENERATIONS[DEFAULT_CHIP]
(3, 5)
>>> v6e = chip_facts("v6e")
>>> v6e.vmem_capacity_bytes // 2**20, v6e.default_scoped_vmem_limit_bytes // 2**20
(128, 32)
>>> chip_facts("v5p").tensor_cores_per_chip, chip_facts("v5p").megacore
(2, True)

Code asks for a chip's one record by name, :func:`chip_record`: its facts, what its
compiler rejects and its topology, in one frozen :class:`Chip` (the performance model's
constants, ``perf.model.chip_model``, are derived from it; they live in ``perf/``, above
the evaluator and beside the launch, which ask for this record too).

>>> v5p = chip_record("v5p")
>>> v5p.cores_per_device, v5p.compiler_topology, v5p.compiler.core_parallel_cores
(2, ('v5p', True), 2)
>>> chip_record(DEFAULT_CHIP).facts is chip_facts(DEFAULT_CHIP)
True
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import ConfigError

__all__ = [
    "CHIPS",
    "CHIP_GENERATIONS",
    "DEFAULT_CHIP",
    "DEFAULT_SCOPED_VMEM_LIMIT_BYTES",
    "Chip",
    "ChipFacts",
    "CompilerFacts",
    "chip_facts",
    "compiler_facts",
    "chip_of_device_kind",
    "chip_record",
    "device_kind",
    "resolve_chip",
]

#: palladium's chip names -> jax's ``ChipVersion`` values.
_JAX_CHIP_VERSIONS: dict[str, str] = {
    "v2": "v2", "v3": "v3", "v4": "v4", "v4i": "v4i", "v5e": "v5e", "v5p": "v5p",
    "v6e": "v6e", "v7": "7", "v7x": "7x", "v8i": "8i",
}

#: palladium's chip names -> the jax device kind of such a TPU (what
#: ``tpu_info.chip_version_from_device_kind`` reads; the lowering check lowers for it).
_DEVICE_KINDS: dict[str, str] = {
    "v2": "TPU v2", "v3": "TPU v3", "v4": "TPU v4", "v4i": "TPU v4 lite",
    "v5e": "TPU v5 lite", "v5p": "TPU v5", "v6e": "TPU v6 lite", "v7": "TPU7", "v7x": "TPU7x",
    "v8i": "TPU8i",
}

#: The chip names palladium simulates (``InterpretParams.chip``): every chip the installed
#: jax's ``tpu_info`` knows (an older jax may not know TPU8i).
CHIPS: tuple[str, ...] = tuple(
    name for name, version in _JAX_CHIP_VERSIONS.items()
    if version in {v.value for v in jc.TpuChipVersion})

#: The chip simulated when neither the params, the abstract mesh nor the default device
#: name a TPU (every generation >= 4 pads alike).
DEFAULT_CHIP = "v5e"

#: XLA's default scoped-VMEM limit per TPU generation: the VMEM a Mosaic kernel may use
#: unless ``pltpu.CompilerParams(vmem_limit_bytes=...)`` raises it (together with
#: ``--xla_tpu_scoped_vmem_limit_kib``, as the docstring of jax's ``CompilerParams``
#: says). The values are the defaults of that XLA flag: 16 MiB up to v5, 32 MiB from v6e.
#: jax's ``tpu_info`` does not state them, so they are the one hand-kept fact here.
#: Generation 8 (TPU8i) is assumed to keep v6e's and v7x's 32 MiB: the installed libtpu
#: cannot compile for it, so nothing here can confirm it (its checks are the
#: approximation's, and say so).
DEFAULT_SCOPED_VMEM_LIMIT_BYTES: dict[int, int] = {
    2: 16 * 2**20, 3: 16 * 2**20, 4: 16 * 2**20, 5: 16 * 2**20,
    6: 32 * 2**20, 7: 32 * 2**20, 8: 32 * 2**20,
}


@dataclasses.dataclass(frozen=True)
class ChipFacts:
    """What palladium knows about one TPU chip, per TensorCore (from jax's ``tpu_info``).

    ``hbm_capacity_bytes``, ``hbm_bandwidth_bytes_per_second`` and the peak rates are a
    TensorCore's share of the chip (jax divides the chip's by its TensorCores).
    """

    name: str  #: palladium's name: "v5e", "v7x", ...
    jax_chip_version: str  #: jax's ``ChipVersion`` value: "v5e", "7x", ...
    generation: int
    tensor_cores_per_chip: int
    megacore: bool  #: the chip's TensorCores can act as one device (v4, v5p)
    lite: bool
    num_lanes: int
    num_sublanes: int
    mxu_column_size: int
    num_mxus: int  #: 0 where jax states none (jax < 0.10.2's TpuInfo has no num_mxus)
    #: (sublanes, mxu_column_size) 32-bit accumulators per MXU (v7x: 128); 0 where jax
    #: states none (before v7, or jax < 0.10.2)
    num_accumulators: int
    vmem_capacity_bytes: int
    smem_capacity_bytes: int
    hbm_capacity_bytes: int
    hbm_bandwidth_bytes_per_second: int
    bf16_ops_per_second: int
    int8_ops_per_second: int  #: 0 where jax states none
    fp8_ops_per_second: int  #: 0 where jax states none
    int4_ops_per_second: int  #: 0 where jax states none
    default_scoped_vmem_limit_bytes: int  #: see DEFAULT_SCOPED_VMEM_LIMIT_BYTES


#: (num_mxus, num_accumulators) per chip as jax 0.10.2's ``tpu_info`` states them, for
#: jax 0.10.0, whose ``TpuInfo`` has neither field (the explicit MXU operations need them).
#: Tested against jax's own values where jax has them (``tests/test_chip_mxu_facts.py``).
MXU_FACTS_OF_JAX_0_10_2: dict[str, tuple[int, int]] = {
    "v2": (1, 0), "v3": (2, 0), "v4": (4, 0), "v4i": (4, 0), "v5e": (4, 0), "v5p": (4, 0),
    "v6e": (2, 0), "v7": (2, 128), "v7x": (2, 128), "v8i": (2, 256),
}


@functools.cache
def chip_facts(name: str) -> ChipFacts:
    """The facts of chip ``name`` (one of :data:`CHIPS`); ``ConfigError`` (a ``ValueError``) for another name."""
    if name not in CHIPS:
        raise ConfigError(f"unknown TPU chip {name!r}; palladium knows {CHIPS}")
    version = _JAX_CHIP_VERSIONS[name]
    info = jc.tpu_info_for_chip(version)
    chip = jc.TpuChipVersion(version)
    return ChipFacts(
        name=name,
        jax_chip_version=version,
        generation=info.generation,
        tensor_cores_per_chip=chip.num_physical_tensor_cores_per_chip,
        megacore=chip.supports_megacore,
        lite=chip.is_lite,
        num_lanes=info.num_lanes,
        num_sublanes=info.num_sublanes,
        mxu_column_size=info.mxu_column_size,
        num_mxus=getattr(info, "num_mxus", MXU_FACTS_OF_JAX_0_10_2[name][0]),
        num_accumulators=getattr(info, "num_accumulators", MXU_FACTS_OF_JAX_0_10_2[name][1]),
        vmem_capacity_bytes=info.vmem_capacity_bytes,
        smem_capacity_bytes=info.smem_capacity_bytes,
        hbm_capacity_bytes=info.hbm_capacity_bytes,
        hbm_bandwidth_bytes_per_second=info.mem_bw_bytes_per_second,
        bf16_ops_per_second=info.bf16_ops_per_second,
        int8_ops_per_second=info.int8_ops_per_second,
        fp8_ops_per_second=info.fp8_ops_per_second,
        int4_ops_per_second=info.int4_ops_per_second,
        default_scoped_vmem_limit_bytes=DEFAULT_SCOPED_VMEM_LIMIT_BYTES[info.generation],
    )


#: Chip name -> TPU generation. Only generations < 4 pad differently (see
#: ``palladium.shared_memory.tpu_facts``).
CHIP_GENERATIONS: dict[str, int] = {name: chip_facts(name).generation for name in CHIPS}

_NAMES_OF_JAX_VERSIONS = {version: name for name, version in _JAX_CHIP_VERSIONS.items()}


def chip_of_device_kind(kind: str | None) -> str | None:
    """The chip name of a jax device kind, or None if it is not a TPU palladium knows."""
    if not kind:
        return None
    version = jc.tpu_chip_version_from_device_kind(kind)
    return None if version is None else _NAMES_OF_JAX_VERSIONS.get(version.value)


def device_kind(chip: str) -> str:
    """The jax device kind of palladium's ``chip`` name (``"v5e"`` -> ``"TPU v5 lite"``)."""
    return _DEVICE_KINDS[chip]


def resolve_chip(chip: str | None) -> str:
    """The chip to simulate, given ``InterpretParams.chip`` (see the module docstring).

    Called when the ``pallas_call`` is lowered, i.e. in the caller's abstract-mesh context.
    """
    if chip is not None:
        return chip
    device = jax.sharding.get_abstract_mesh().abstract_device
    kind = getattr(device, "device_kind", None)
    found = chip_of_device_kind(kind)
    if found is not None:
        return found
    _refuse_unknown_tpu(kind, "the abstract mesh's device")
    default = jax.devices()[0]
    if default.platform == "tpu":
        found = chip_of_device_kind(default.device_kind)
        if found is not None:
            return found
        _refuse_unknown_tpu(default.device_kind, "the default device")
    return DEFAULT_CHIP


def _refuse_unknown_tpu(kind: str | None, whose: str) -> None:
    """A TPU device kind palladium does not simulate is an error, never a silent v5e."""
    if kind and (kind.upper().startswith("TPU")
                 or jc.tpu_chip_version_from_device_kind(kind) is not None):
        raise ConfigError(
            f"{whose} is a {kind!r}, a TPU palladium does not simulate; it knows {CHIPS} "
            "(InterpretParams(chip=...) chooses one).")
# --- What the TPU compiler accepts, per chip (for the approximation) -------------------
#
# jax's Mosaic lowering (the approximation's front end) accepts kernels that libtpu's
# Mosaic passes and allocator then reject. What follows was measured with libtpu 0.0.42.1
# (jax 0.10.2) on ``benchmarks/compiler_agreement.py``'s corpus, and is only what that
# corpus shows: the approximation rejects a kernel by these facts only where the compiler
# rejected it, and chips the corpus did not cover (v2, v3, v4i, v7) have no entry.

_F8 = frozenset({"float8_e4m3fn", "float8_e5m2"})
_I8 = frozenset({"int8", "uint8"})

#: Vector (rank >= 1) operations the compiler rejects on every measured chip: primitive
#: -> element types of its operands. (float16 vectors are rejected by any operation,
#: loads included: :attr:`CompilerFacts.float16_vectors`.)
_VECTOR_REJECTS: dict[str, frozenset[str]] = {
    "add": _I8 | _F8, "sub": _I8 | _F8, "mul": _I8 | _F8, "neg": frozenset({"int8"}) | _F8,
    "abs": frozenset({"int8"}) | _F8, "div": _F8, "exp": _F8, "tanh": _F8,
    "max": _I8 | _F8 | {"int16", "uint32"}, "min": _I8 | _F8 | {"int16", "uint32"},
    "shift_right_arithmetic": frozenset({"int8", "int16"}),
    "shift_right_logical": frozenset({"uint8"}),
    "lt": _I8 | _F8, "gt": _I8 | _F8, "eq": _I8 | _F8,
    "reduce_sum": _F8, "reduce_max": _F8, "reduce_min": _F8,
}

#: Scalar (SMEM, rank 0) arithmetic the compiler rejects on every measured chip: only
#: 32-bit (and bool) scalars have an ALU ("Only i32 arith.addi is supported", "Only i1
#: and i32 scalars are supported", no bf16/f16 arith.addf).
_SCALAR_REJECTS: dict[str, frozenset[str]] = {
    op: frozenset({"int8", "uint8", "int16", "bfloat16", "float16"})
    for op in ("add", "mul", "max")
}


@dataclasses.dataclass(frozen=True)
class CompilerFacts:
    """What the TPU compiler (libtpu's Mosaic passes and allocator) rejects on one chip,
    beyond what jax's Mosaic lowering checks; measured, see the comment above."""

    #: Vector operations rejected by operand element type (primitive -> dtype names).
    vector_rejects: dict[str, frozenset[str]]
    #: Scalar (rank-0) operations rejected by element type.
    scalar_rejects: dict[str, frozenset[str]]
    #: float16 vectors (even a load) are supported ("Invalid vector type for load").
    float16_vectors: bool = False
    #: A comparison of bfloat16 vectors gives a packed 16-bit mask that cannot select
    #: 32-bit values ("Invalid relayout"); int16 compares do so on every chip.
    bf16_compare_packed_mask: bool = False
    #: Dynamic-index alignment the compiler must prove for VMEM accesses: the
    #: second-minor index a multiple of this per element size in bytes, the minor index
    #: a multiple of 128 ("cannot statically prove that index in dimension 0 is a
    #: multiple of 32").
    dynamic_sublane_multiple: dict[int, int] = dataclasses.field(
        default_factory=lambda: {4: 8, 2: 8, 1: 32})
    #: Static second-minor offsets of loads and value slices must be a multiple of this,
    #: per element size in bytes ("Expected mask vector type": int8 rows 3:11 on v4).
    static_row_offset_multiple: dict[int, int] = dataclasses.field(default_factory=dict)
    #: Splitting the minor dimension of a value into a new dimension ((8, 128) ->
    #: (8, 2, 64)) is supported.
    lane_split_into_new_dim: bool = True
    #: MXU: float operands with an integer accumulator ("int acc with float lhs").
    matmul_float_to_int: bool = False
    #: MXU: int8 x int8 (or int32) operands with a float accumulator ("float acc with
    #: int lhs", "Mix int/int - NYI").
    matmul_int8_to_float: bool = False
    #: MXU: int8 or float8 right-hand sides, and float8 left-hand sides.
    matmul_narrow_operands: bool = True
    #: TensorCores a kernel's "core_parallel" grid dimension spreads over: its iteration
    #: bound must be exactly this ("Core-parallel dimension 0 has iteration bound: 2,
    #: which is greater than the number of active cores: 1").
    core_parallel_cores: int = 1
    #: VMEM the compiler keeps of the core's capacity (a kernel using all of it fails
    #: "Used 127.95M of 127.94M vmem"); the scoped limit is not reduced.
    vmem_reserved_bytes: int = 0
    #: SMEM the compiler keeps of the core's capacity ("Exceeded smem capacity by 1.4K").
    smem_reserved_bytes: int = 2048
    #: SMEM buffers are allocated in units of this many bytes.
    smem_allocation_bytes: int = 512


def _measured(**overrides: Any) -> CompilerFacts:
    return dataclasses.replace(
        CompilerFacts(vector_rejects=_VECTOR_REJECTS, scalar_rejects=_SCALAR_REJECTS),
        **overrides)


_COMPILER_FACTS: dict[str, CompilerFacts] = {
    "v4": _measured(lane_split_into_new_dim=False, matmul_narrow_operands=False,
                    smem_reserved_bytes=512, static_row_offset_multiple={1: 8}),
    "v5e": _measured(),
    "v5p": _measured(core_parallel_cores=2, vmem_reserved_bytes=60 * 2**10),
    "v6e": _measured(bf16_compare_packed_mask=True, vmem_reserved_bytes=60 * 2**10),
    "v7x": _measured(bf16_compare_packed_mask=True, matmul_float_to_int=True,
                     matmul_int8_to_float=True),
}


def compiler_facts(chip: str) -> CompilerFacts | None:
    """What the TPU compiler rejects on ``chip`` (see :class:`CompilerFacts`), or None for
    a chip it was not measured on (then the approximation adds no rule of its own)."""
    return _COMPILER_FACTS.get(chip)


#: palladium's chip name -> the topology family libtpu knows it by, and whether its
#: topologies are 3-D. Chips absent here (v4i, v7, TPU8i) are not compiled for by the
#: libtpu jax 0.10.x pins ("Invalid TPU external name"): their verdict is the
#: approximation's.
_COMPILER_TOPOLOGIES: dict[str, tuple[str, bool]] = {
    "v2": ("v2", False), "v3": ("v3", False), "v5e": ("v5e", False), "v6e": ("v6e", False),
    "v4": ("v4", True), "v5p": ("v5p", True), "v7x": ("tpu7x", True),
}


@dataclasses.dataclass(frozen=True)
class Chip:
    """One simulated TPU chip: everything palladium knows of it, asked for by name
    (:func:`chip_record`)."""

    name: str  #: palladium's name: "v5e", "v7x", ...
    facts: ChipFacts  #: jax's ``tpu_info`` facts, per TensorCore
    #: what its compiler rejects beyond jax's lowering; None where it was not measured
    compiler: CompilerFacts | None
    #: TensorCores one jax device of it has: two on a megacore chip, else one (what jax's
    #: tables take, and the cores a megacore kernel's "parallel" dimensions spread over)
    cores_per_device: int
    #: the topology family libtpu compiles for it by, and whether its topologies are 3-D;
    #: None where the installed libtpu does not compile for it
    compiler_topology: tuple[str, bool] | None

    @property
    def generation(self) -> int:
        return self.facts.generation


@functools.cache
def chip_record(name: str) -> Chip:
    """The record of chip ``name`` (one of :data:`CHIPS`); ``ConfigError`` for another."""
    facts = chip_facts(name)
    return Chip(
        name=name,
        facts=facts,
        compiler=compiler_facts(name),
        cores_per_device=facts.tensor_cores_per_chip if facts.megacore else 1,
        compiler_topology=_COMPILER_TOPOLOGIES.get(name),
    )
