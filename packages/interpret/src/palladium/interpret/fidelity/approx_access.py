"""The approximation's rules over ref accesses (loads and stores of VMEM refs):
strides, dynamic indices the compiler cannot prove aligned, static offsets it cannot
mask (see ``approx_registry``; facts per chip in ``palladium.interpret.chip``).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.primitive_groups import INDEXED_ACCESSES
from palladium.interpret.fidelity.approx_registry import Site, rule
from palladium.interpret.kernel.blocks import memory_space_of
from palladium.shared_memory import MemorySpace

__all__ = ["static_row_offset", "strided_access", "unproven_alignment"]


def _indexers(eqn: Any) -> tuple[Any, Any] | None:
    """(ref aval, the NDIndexer of a get/swap) when it has one (the rules calling this
    are registered for loads and stores, never ``addupdate``)."""
    skip = INDEXED_ACCESSES.get(eqn.primitive)
    if skip is None:
        return None
    try:
        transforms = jax.tree_util.tree_unflatten(eqn.params["tree"], eqn.invars[skip:])
    except (KeyError, ValueError, TypeError):
        return None
    found = [t for t in transforms if isinstance(t, jc.NDIndexer)]
    if len(found) != 1 or len(transforms) != 1:
        return None  # bitcasts, reshapes: the ref seen is not the buffer
    return eqn.invars[0].aval, found[0]


def _in_vmem(ref_aval: Any) -> bool:
    return memory_space_of(getattr(ref_aval, "memory_space", None)) == MemorySpace.VMEM


def _vmem_itemsize(dtype: Any) -> int:
    """Bytes per element in VMEM: bool is kept as 32-bit words."""
    dt = np.dtype(dtype)
    return 4 if dt == np.bool_ else dt.itemsize


@rule("get", "swap")
def strided_access(site: Site) -> str | None:
    """Strided VMEM loads and stores: only of 32-bit data, with a stride only on leading
    dimensions, in refs whose minor dimension is 128."""
    found = _indexers(site.eqn)
    if found is None or not _in_vmem(found[0]):
        return None
    ref, indexer = found
    strided = [d for d, i in enumerate(indexer.indices)
               if isinstance(i, jc.Slice) and i.stride > 1]
    if not strided or np.dtype(ref.dtype) == np.bool_:
        return None  # bool: not measured
    what = "load" if site.eqn.primitive.name == "get" else "store"
    dtype = np.dtype(ref.dtype).name
    if np.dtype(ref.dtype).itemsize != 4:
        return (f"the TPU compiler has no strided {what} of {dtype} data on TPU {site.chip} "
                f"(\"Strided {what} with non 32-bit data\"). Access the rows contiguously and "
                "select them from the value, or keep this operand in 32 bits.")
    if strided[-1] == len(ref.shape) - 1:
        return (f"the TPU compiler has no strided {what} along the minor (lane) dimension on "
                f"TPU {site.chip} (\"Stride on last dim is not 1\"). Access the lanes "
                "contiguously and select them from the value.")
    if len(ref.shape) >= 2 and ref.shape[-1] != 128:
        return (f"the TPU compiler {what}s with a stride only from refs whose minor "
                f"dimension is 128 on TPU {site.chip} (\"The last dim size is not 128 in "
                f"original base memref\"; this one is {tuple(ref.shape)}). Use blocks of "
                "128 lanes for the strided operand.")
    return None


@rule("get", "slice")
def static_row_offset(site: Site) -> str | None:
    """Static second-minor offsets of narrow data the compiler cannot mask (v4, int8)."""
    eqn = site.eqn
    if eqn.primitive.name == "get":
        found = _indexers(eqn)
        if found is None or not _in_vmem(found[0]) or len(found[0].shape) < 2:
            return None
        ref, indexer = found
        shape, dtype = tuple(ref.shape), np.dtype(ref.dtype)
        index = indexer.indices[len(shape) - 2]
        if not isinstance(index, jc.Slice) or not isinstance(index.start, int | np.integer):
            return None
        start, size = int(index.start), index.size
    else:
        shape = tuple(eqn.invars[0].aval.shape)
        dtype = np.dtype(eqn.invars[0].aval.dtype)
        if len(shape) < 2 or (eqn.params.get("strides") or None) is not None:
            return None
        start = int(eqn.params["start_indices"][-2])
        size = int(eqn.params["limit_indices"][-2]) - start
    need = site.facts.static_row_offset_multiple.get(_vmem_itemsize(dtype))
    if need is None or size == shape[-2] or start % need == 0:
        return None
    return (f"the TPU compiler cannot take {dtype.name} rows from offset {start} on TPU "
            f"{site.chip} (\"Expected mask vector type\"): the offset must be a multiple of "
            f"{need}. Start at a multiple of {need} and select the rows from the value.")


def _sublane_index_checked(itemsize: int, lanes: int) -> bool:
    """Whether the compiler needs a proven-aligned dynamic second-minor index: for 32-bit
    data only when the ref is wider than one tile of 128 lanes (a dynamic row of a
    128-lane float32 ref is fine), for narrower data from 128 lanes on (measured)."""
    return lanes > 128 if itemsize == 4 else lanes >= 128


def _multiple(var: Any, site: Site, depth: int = 0) -> int | None:
    """What ``var`` is provably a multiple of, as Mosaic proves it (constants, products
    by constants, sums, pl.multiple_of), or None when the rule cannot tell."""
    if isinstance(var, jc.Literal | int | np.integer):
        value = int(var.val if isinstance(var, jc.Literal) else var)
        return abs(value) if value else 0
    made = site.producer(var)
    if made is None or depth > 8:
        return None
    name = made.primitive.name
    if name in ("program_id", "get"):  # a grid index or a loaded scalar: anything
        return 1
    if name == "multiple_of":
        inner = _multiple(made.invars[0], site, depth + 1)
        return math.lcm(int(made.params["values"][0]), inner or 1)
    if name == "convert_element_type":
        return _multiple(made.invars[0], site, depth + 1)
    parts = [_multiple(v, site, depth + 1) for v in made.invars]
    if any(p is None for p in parts):
        return None
    a, b = parts[0], parts[-1]
    assert a is not None and b is not None
    if name == "mul":
        return a * b
    if name in ("add", "sub"):
        return math.gcd(a, b)
    return None


@rule("get", "swap")
def unproven_alignment(site: Site) -> str | None:
    """A load or store at a dynamic start in one of a VMEM ref's two minor dimensions
    that the compiler cannot prove aligned (E2003; an index loaded from SMEM proves
    nothing)."""
    found = _indexers(site.eqn)
    if found is None or not _in_vmem(found[0]):
        return None
    ref, indexer = found
    rank = len(ref.shape)
    if rank < 2:
        return None
    itemsize = _vmem_itemsize(ref.dtype)
    lanes = ref.shape[-1]
    for dim in (rank - 2, rank - 1):
        if dim == rank - 2 and not _sublane_index_checked(itemsize, lanes):
            continue
        index = indexer.indices[dim]
        if not isinstance(index, jc.Slice) or not isinstance(index.start, jc.Var):
            continue
        if index.size == ref.shape[dim]:
            continue
        need = 128 if dim == rank - 1 else site.facts.dynamic_sublane_multiple.get(itemsize)
        proven = _multiple(index.start, site)
        if need is None or proven is None or proven == 0 or proven % need == 0:
            continue
        which = rank - 1 - dim
        return (f"the TPU compiler cannot prove that the dynamic index in dimension "
                f"{dim} of this {np.dtype(ref.dtype).name} {tuple(ref.shape)} ref is a "
                f"multiple of {need} on TPU {site.chip} (\"E2003: "
                "CompileTimeMosaicUnprovenMemoryAccessAlignment\"). "
                f"Make it one and say so: pl.ds(pl.multiple_of(i * {need}, {need}), ...)"
                + (" (the minor dimension needs 128-lane alignment)" if which == 0 else "")
                + ".")
    return None
