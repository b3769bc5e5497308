"""VMEM and SMEM accounting: what the compiled kernel certainly holds per core, against
the simulated chip's limits, computed from the ``pallas_call`` before it runs.

Counted per core, each buffer padded to its TPU tiles
(``palladium.shared_memory.padded_shape``; SMEM is not padded):

* every ``BlockSpec`` operand in VMEM (or SMEM): its block times its buffer count, 2 by
  default or ``pipeline_mode=pl.Buffered(n)``'s n. Blocks whose index never changes count
  too (Mosaic allocates them); only a *trivial window* (the block is the whole array and
  the index map returns literal zeros) or a kernel without a grid counts one buffer, as
  Mosaic then buffers once;
* ``scratch_shapes``;
* ``pl.run_scoped`` allocations at their deepest nesting (allocations of sequential
  scopes do not add up; the branches of a ``cond`` count as the largest one). The
  buffers palladium.pipeline's inlined ``emit_pipeline`` allocates are such scopes;
* SMEM: scalar-prefetch operands, SMEM blocks and SMEM scratch.

Left out, so that the count never exceeds what Mosaic allocates: Mosaic's internal
scratch, the VMEM that values (vector registers spilled, large temporaries) take
(reported as ``intermediates_peak_bytes``, never checked), the buffers that the
``emit_pipeline`` *primitive* path (``use_primitive=True``) allocates when Mosaic expands
it, ``VMEM_SHARED`` (v7x's shared VMEM) and semaphores.

On the chips where the TPU compiler was measured (``chip.compiler_facts``: v4, v5e, v5p,
v6e, v7x), the count also follows what it does there: bool buffers in VMEM take 32-bit
words; SMEM buffers are allocated in 512-byte units and a 2-D SMEM buffer of 32-bit
words in whole rows of 128; the compiler keeps part of SMEM (2 KiB, 512 bytes on v4) and
of VMEM (60 KiB on v5p and v6e) for itself.

The VMEM limit is ``pltpu.CompilerParams(vmem_limit_bytes=...)`` when given, else XLA's
default scoped limit for the chip (``palladium.interpret.chip``), never above the core's
VMEM capacity less what the compiler keeps; SMEM's is its capacity less what the
compiler keeps.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.chip import CompilerFacts, chip_record
from palladium.interpret.errors import TpuResourceError
from palladium.interpret.eval.jaxprs import jaxprs_in
from palladium.interpret.fidelity.confidence import uncertainty
from palladium.interpret.fidelity.lowering_check import approximation_note
from palladium.interpret.kernel.blocks import BlockSpecInfo, memory_space_of
from palladium.interpret.kernel.prepared_kernel import PreparedKernel
from palladium.shared_memory import MemorySpace, padded_shape

__all__ = ["Buffer", "MemoryUse", "SpaceUse", "check_fits", "measure"]

MiB = 2**20


def _mib(n: int) -> str:
    return f"{n / MiB:.2f} MiB" if n >= MiB // 100 else f"{n} bytes"


@dataclasses.dataclass(frozen=True)
class Buffer:
    """One counted buffer: ``kind`` is "input", "output", "scratch", "run_scoped" or
    "scalar prefetch"; ``bytes`` is one buffer's tile-padded size."""

    kind: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    count: int = 1

    @property
    def total_bytes(self) -> int:
        return self.bytes * self.count

    def describe(self) -> str:
        shape = "(" + ", ".join(str(d) for d in self.shape) + ("," if len(self.shape) == 1 else "") + ")"
        what = "block " if self.kind in ("input", "output") else ""
        line = f"{self.kind} '{self.name}' {what}{shape} {self.dtype}: {_mib(self.bytes)}"
        if self.count != 1:
            line += f" x {self.count} buffers = {_mib(self.total_bytes)}"
        return line


@dataclasses.dataclass(frozen=True)
class SpaceUse:
    """One memory space per core: what is counted, its peak, the limit and capacity."""

    space: str  # "VMEM" | "SMEM"
    buffers: tuple[Buffer, ...]
    peak_bytes: int
    limit_bytes: int
    capacity_bytes: int
    requested_limit_bytes: int | None = None  # vmem_limit_bytes as given (may exceed capacity)
    #: What the TPU compiler keeps of the capacity for itself (the limit is at most the rest).
    reserved_bytes: int = 0

    @property
    def over(self) -> bool:
        return self.peak_bytes > self.limit_bytes


@dataclasses.dataclass(frozen=True)
class MemoryUse:
    """A kernel's VMEM and SMEM use per core on ``chip``, counted before it runs.

    ``intermediates_peak_bytes``: the largest total of (tile-padded) array values live
    at once in the kernel body, a rough guide to the VMEM Mosaic's temporaries may take;
    reported, never checked.
    """

    chip: str
    vmem: SpaceUse
    smem: SpaceUse
    intermediates_peak_bytes: int
    #: Who decided whether the kernel compiles and fits: the TPU compiler
    #: ("libtpu 0.0.42.1 (jax 0.10.2)") or "approximation".
    checker: str = "approximation"
    #: The scoped VMEM the TPU compiler allocated for the kernel (its own figure, which
    #: includes Mosaic's internal scratch and may leave out buffers it proved dead), when
    #: the compiler accepted it.
    compiler_vmem_bytes: int | None = None

    @property
    def uncertain(self) -> str | None:
        """Why the approximation's verdict on this count may not be the TPU compiler's
        (``uncertainty``); None when the compiler decided or the count is clear of the
        limit."""
        if self.checker != "approximation":
            return None
        return uncertainty(self.vmem.peak_bytes, self.vmem.limit_bytes)

    def summary(self) -> str:
        """``VMEM 6.00 MiB of 16.00 MiB, SMEM 8 bytes of 1.00 MiB per core (v5e)``."""
        text = (f"VMEM {_mib(self.vmem.peak_bytes)} of {_mib(self.vmem.limit_bytes)}, "
                f"SMEM {_mib(self.smem.peak_bytes)} of {_mib(self.smem.limit_bytes)} per "
                f"core ({self.chip}); intermediates up to "
                f"{_mib(self.intermediates_peak_bytes)}")
        if self.compiler_vmem_bytes is not None:
            text += (f"; the TPU compiler ({self.checker}) allocates "
                     f"{_mib(self.compiler_vmem_bytes)} of scoped VMEM")
        return text


@dataclasses.dataclass(frozen=True)
class _Layout:
    """How buffers are laid out on the chip: its generation's tiles, and what the TPU
    compiler is measured to do there (None: not measured)."""

    generation: int
    compiler: CompilerFacts | None


def measure(kernel: PreparedKernel, chip: str) -> MemoryUse:
    """Count ``kernel``'s VMEM and SMEM per core on ``chip`` (see the module docs)."""
    record = chip_record(chip)
    facts, compiler = record.facts, record.compiler
    generation = _Layout(record.generation, compiler)
    vmem: list[Buffer] = []
    smem: list[Buffer] = []
    pipelined = bool(tuple(kernel.grid_mapping.grid))
    bms = kernel.grid_mapping.block_mappings
    for kind, infos, offset in (("input", kernel.inputs, 0),
                                ("output", kernel.outputs, len(kernel.inputs))):
        for i, info in enumerate(infos):
            buf = _block_buffer(kind, info, bms[offset + i], pipelined, generation)
            if buf is not None:
                (vmem if info.space == MemorySpace.VMEM else smem).append(buf)
    n_idx = kernel.grid_mapping.num_index_operands
    for i, var in enumerate(kernel.jaxpr.invars[:n_idx]):
        smem.append(_array_buffer("scalar prefetch", kernel.scalar_names[i], var.aval,
                                  MemorySpace.SMEM, generation))
    for scratch in kernel.scratch:
        space = _space(scratch.aval)
        if space is not None:
            buf = _array_buffer("scratch", scratch.name, scratch.aval, space, generation)
            (vmem if space == MemorySpace.VMEM else smem).append(buf)
    scoped = _ScopedPeak(kernel, generation)
    scoped_vmem, scoped_smem = scoped.peak(kernel.jaxpr)
    vmem.extend(scoped_vmem[1])
    smem.extend(scoped_smem[1])
    params = kernel.compiler_params
    requested = getattr(params, "vmem_limit_bytes", None) if params is not None else None
    capacity = facts.vmem_capacity_bytes
    vmem_kept = compiler.vmem_reserved_bytes if compiler is not None else 0
    smem_kept = compiler.smem_reserved_bytes if compiler is not None else 0
    limit = min(requested if requested is not None else facts.default_scoped_vmem_limit_bytes,
                capacity - vmem_kept)
    return MemoryUse(
        chip=chip,
        vmem=SpaceUse("VMEM", tuple(vmem), sum(b.total_bytes for b in vmem), limit, capacity,
                      requested, reserved_bytes=vmem_kept),
        smem=SpaceUse("SMEM", tuple(smem), sum(b.total_bytes for b in smem),
                      facts.smem_capacity_bytes - smem_kept, facts.smem_capacity_bytes,
                      reserved_bytes=smem_kept),
        intermediates_peak_bytes=_intermediates_peak(kernel.jaxpr, generation, {}),
    )


def _nbytes(shape: tuple[int, ...], dtype: Any, space: MemorySpace, layout: _Layout) -> int:
    dt = np.dtype(dtype)
    compiler = layout.compiler
    if space == MemorySpace.VMEM:
        if dt == np.bool_ and compiler is not None:
            dt = np.dtype(np.int32)  # the compiler keeps bool buffers as 32-bit words
        return math.prod(padded_shape(shape, dt, generation=layout.generation)) * dt.itemsize
    nbytes = math.prod(shape) * dt.itemsize
    if compiler is not None and space == MemorySpace.SMEM:
        if len(shape) >= 2 and dt.itemsize == 4:
            # A 2-D SMEM buffer of words takes whole rows of 128 ((2048, 2) int32: 1 MiB).
            nbytes = math.prod(shape[:-1]) * _round_up(shape[-1], 128) * 4
        nbytes = _round_up(nbytes, compiler.smem_allocation_bytes)
    return nbytes


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def _block_buffer(kind: str, info: BlockSpecInfo, bm: Any, pipelined: bool,
                  generation: _Layout) -> Buffer | None:
    if info.space not in (MemorySpace.VMEM, MemorySpace.SMEM):
        return None
    if _is_vmem_shared(getattr(bm.block_aval, "memory_space", None)):
        return None
    window = tuple(1 if d.kind == "squeezed" else d.size for d in info.dims)
    trivial = bm.has_trivial_window()
    count = 1 if (not pipelined or trivial or info.space == MemorySpace.SMEM) else (
        info.buffer_count)
    return Buffer(kind, info.name, window, _label(info.dtype, info.space, generation),
                  _nbytes(window, info.dtype, info.space, generation), count)


def _is_vmem_shared(space: Any) -> bool:
    return jc.VMEM_SHARED is not None and space is jc.VMEM_SHARED


def _space(aval: Any) -> MemorySpace | None:
    """VMEM or SMEM for a buffer palladium counts; None for HBM, semaphores and
    VMEM_SHARED."""
    raw = getattr(aval, "memory_space", None)
    if _is_vmem_shared(raw):
        return None
    space = memory_space_of(raw)
    if space in (MemorySpace.VMEM, MemorySpace.SMEM) and _is_array(aval):
        return space  # type: ignore[return-value]
    return None


def _is_array(aval: Any) -> bool:
    try:
        np.dtype(aval.dtype)
    except TypeError:
        return False  # semaphores
    return hasattr(aval, "shape")


def _array_buffer(kind: str, name: str, aval: Any, space: MemorySpace,
                  generation: _Layout) -> Buffer:
    shape = tuple(int(d) for d in aval.shape)
    return Buffer(kind, name, shape, _label(aval.dtype, space, generation),
                  _nbytes(shape, aval.dtype, space, generation))


def _label(dtype: Any, space: MemorySpace, layout: _Layout) -> str:
    dt = np.dtype(dtype)
    if dt == np.bool_ and space == MemorySpace.VMEM and layout.compiler is not None:
        return "bool (as 32-bit words)"
    return str(dt)


_Peak = tuple[int, list[Buffer]]


class _ScopedPeak:
    """The ``run_scoped`` allocations alive together at their deepest nesting."""

    def __init__(self, kernel: PreparedKernel, generation: _Layout) -> None:
        self.kernel = kernel
        self.generation = generation
        self._memo: dict[int, tuple[_Peak, _Peak]] = {}

    def peak(self, jaxpr: Any) -> tuple[_Peak, _Peak]:
        """(VMEM, SMEM) peaks of ``jaxpr``: bytes and the buffers making them up."""
        key = id(jaxpr)
        if key in self._memo:
            return self._memo[key]
        best_v: _Peak = (0, [])
        best_s: _Peak = (0, [])
        for eqn in jaxpr.eqns:
            own_v, own_s = self._own(eqn)
            sub_v: _Peak = (0, [])
            sub_s: _Peak = (0, [])
            for value in eqn.params.values():
                for sub in jaxprs_in(value):
                    v, s = self.peak(sub)
                    sub_v = max(sub_v, v, key=lambda p: p[0])
                    sub_s = max(sub_s, s, key=lambda p: p[0])
            total_v = (sum(b.total_bytes for b in own_v) + sub_v[0], own_v + sub_v[1])
            total_s = (sum(b.total_bytes for b in own_s) + sub_s[0], own_s + sub_s[1])
            best_v = max(best_v, total_v, key=lambda p: p[0])
            best_s = max(best_s, total_s, key=lambda p: p[0])
        self._memo[key] = (best_v, best_s)
        return best_v, best_s

    def _own(self, eqn: Any) -> tuple[list[Buffer], list[Buffer]]:
        if eqn.primitive is not jc.run_scoped_p:
            return [], []
        body = eqn.params["jaxpr"]
        names = getattr(body.debug_info, "arg_names", None) if body.debug_info else None
        frame = jc.user_frame(self.kernel.inherited_sources.get(id(eqn), eqn.source_info))
        at = f" at {os.path.basename(frame[0])}:{frame[1]}" if frame else ""
        vmem: list[Buffer] = []
        smem: list[Buffer] = []
        for i, var in enumerate(body.invars):
            space = _space(var.aval)
            if space is None:
                continue
            name = str(names[i]) if names and i < len(names) and names[i] else f"[{i}]{at}"
            buf = _array_buffer("run_scoped", name, var.aval, space, self.generation)
            (vmem if space == MemorySpace.VMEM else smem).append(buf)
        return vmem, smem



def _value_bytes(aval: Any, generation: _Layout) -> int:
    shape = getattr(aval, "shape", None)
    if not shape or not _is_array(aval) or isinstance(aval, jc.AbstractRef):
        return 0  # scalars live in scalar registers; refs are buffers, counted above
    return _nbytes(tuple(int(d) for d in shape), aval.dtype, MemorySpace.VMEM, generation)


def _intermediates_peak(jaxpr: Any, generation: _Layout, memo: dict[int, int]) -> int:
    """The largest total of array values live at once in ``jaxpr`` (nested jaxprs add
    their own peak to what is live around them)."""
    key = id(jaxpr)
    if key in memo:
        return memo[key]
    last_use: dict[Any, int] = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if isinstance(v, jc.Var):
                last_use[v] = i
    for v in jaxpr.outvars:
        if isinstance(v, jc.Var):
            last_use[v] = len(jaxpr.eqns)
    live: dict[Any, int] = {}
    peak = 0
    for i, eqn in enumerate(jaxpr.eqns):
        inner = max((_intermediates_peak(sub, generation, memo)
                     for value in eqn.params.values() for sub in jaxprs_in(value)),
                    default=0)
        outs = {v: _value_bytes(v.aval, generation) for v in eqn.outvars
                if isinstance(v, jc.Var) and not isinstance(v, jc.DropVar)}
        peak = max(peak, sum(live.values()) + inner + sum(outs.values()))
        live.update(outs)
        for v in [v for v in live if last_use.get(v, -1) <= i]:
            del live[v]
    memo[key] = peak
    return peak


def check_fits(kernel: PreparedKernel, use: MemoryUse) -> None:
    """Raise ``TpuResourceError`` if ``use`` exceeds the VMEM limit or SMEM capacity
    (``.uncertain``: why the approximation may be wrong, or None)."""
    for space in (use.vmem, use.smem):
        if space.over:
            doubt = use.uncertain if space is use.vmem else None
            text = _over_message(kernel, use.chip, space)
            error = TpuResourceError(text if doubt is None else f"{text}\nThis verdict is {doubt}.")
            error.uncertain = doubt  # type: ignore[attr-defined]
            raise error


def _kept(space: SpaceUse) -> str:
    if not space.reserved_bytes:
        return ""
    return (f" less the {space.reserved_bytes} bytes the TPU compiler keeps "
            f"({space.capacity_bytes - space.reserved_bytes} bytes for the kernel)")


def _over_message(kernel: PreparedKernel, chip: str, space: SpaceUse) -> str:
    where = kernel.named("pallas_call at ")
    name = space.space
    if name == "VMEM":
        if space.requested_limit_bytes is None:
            limit = f"its scoped VMEM limit of {_mib(space.limit_bytes)} (XLA's default on {chip})"
        elif space.requested_limit_bytes > space.limit_bytes:
            limit = (f"the core's VMEM capacity of {_mib(space.capacity_bytes)}{_kept(space)} "
                     f"(vmem_limit_bytes={space.requested_limit_bytes} is more than there is)")
        else:
            limit = f"its vmem_limit_bytes={space.limit_bytes} ({_mib(space.limit_bytes)})"
    else:
        limit = f"the core's SMEM capacity of {_mib(space.capacity_bytes)}{_kept(space)}"
    lines = [
        f"{where} needs {_mib(space.peak_bytes)} ({space.peak_bytes} bytes) of {name} per "
        f"core on TPU {chip}, more than {limit}. A TPU fails to compile it: \"Ran out of "
        f"memory in memory space {name.lower()}\". Counted per core"
        + (", tile-padded" if name == "VMEM" else "")
        + ":",
    ]
    lines += [f"  {b.describe()}" for b in space.buffers if b.total_bytes]
    if name == "VMEM" and space.peak_bytes <= space.capacity_bytes - space.reserved_bytes:
        lines.append(
            f"Raise pltpu.CompilerParams(vmem_limit_bytes=...) to at least {space.peak_bytes} "
            f"(up to the core's {_mib(space.capacity_bytes)}), or use fewer buffers "
            "(pipeline_mode=pl.Buffered(1) for a block whose index rarely changes) or "
            "smaller blocks.")
    elif name == "VMEM":
        lines.append(
            f"Even the core's whole VMEM ({_mib(space.capacity_bytes)}{_kept(space)}) is too "
            "small: use "
            "smaller blocks or fewer buffers (pipeline_mode=pl.Buffered(1)).")
    else:
        lines.append("Use smaller scalar-prefetch operands, SMEM blocks or SMEM scratch.")
    lines.append(approximation_note(chip))
    return "\n".join(lines)
