"""The approximation's own rules: what the TPU compiler rejects after jax's Mosaic
lowering accepted the kernel (libtpu's Mosaic passes: vector dtypes per operation,
layouts, alignment it cannot prove, MXU dtypes, grid semantics).

A registry, as the evaluator's: one small function per rule, registered for the
primitives it looks at (:func:`rule`) or for the whole kernel (:func:`kernel_rule`),
each returning what the compiler would say, or None. :func:`first_violation` walks the
kernel's equations (nested jaxprs included) and returns the first message; the lowering
check raises it as ``TpuLoweringError`` at the equation's kernel line.

Every rule is conservative: it rejects only what the compiler rejected on that chip in
``benchmarks/compiler_agreement.py``'s corpus (its facts are
``palladium.interpret.chip.CompilerFacts``, per chip); when unsure, it accepts. Chips
without measured facts get no rule.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.blocks import memory_space_of
from palladium.interpret.chip import CompilerFacts, compiler_facts
from palladium.interpret.kernel import PreparedKernel, sub_jaxprs
from palladium.shared_memory import MemorySpace

__all__ = ["Site", "Violation", "first_violation", "kernel_rule", "rule"]


@dataclasses.dataclass(frozen=True)
class Site:
    """One equation as a rule sees it: the chip, its facts, and the equations that
    produced its operands (followed into nested ``jit`` jaxprs)."""

    eqn: Any
    chip: str
    facts: CompilerFacts
    producers: dict[Any, Any]

    def producer(self, var: Any) -> Any | None:
        """The equation that computed ``var``, when the walk saw it."""
        return self.producers.get(var) if isinstance(var, jc.Var) else None


@dataclasses.dataclass(frozen=True)
class Violation:
    """The first rule a kernel breaks: the equation (None for a kernel-wide rule), what
    the compiler says, and the rule's name."""

    eqn: Any | None
    message: str
    rule: str


Rule = Callable[[Site], "str | None"]
KernelRule = Callable[[PreparedKernel, str, CompilerFacts], "str | None"]

_RULES: dict[str, list[Rule]] = {}
_KERNEL_RULES: list[KernelRule] = []


def rule(*primitives: str) -> Callable[[Rule], Rule]:
    """Register a rule for the equations of these primitives (by name)."""

    def register(fn: Rule) -> Rule:
        for name in primitives:
            _RULES.setdefault(name, []).append(fn)
        return fn

    return register


def kernel_rule(fn: KernelRule) -> KernelRule:
    """Register a rule over the whole kernel (its grid, operands, compiler params)."""
    _KERNEL_RULES.append(fn)
    return fn


def first_violation(kernel: PreparedKernel, chip: str) -> Violation | None:
    """The first rule ``kernel`` breaks on ``chip``, or None."""
    facts = compiler_facts(chip)
    if facts is None:
        return None
    for krule in _KERNEL_RULES:
        message = krule(kernel, chip, facts)
        if message is not None:
            return Violation(None, message, krule.__name__)
    producers: dict[Any, Any] = {}
    for eqn in _walk(kernel.jaxpr, producers):
        for fn in _RULES.get(eqn.primitive.name, ()):
            message = fn(Site(eqn, chip, facts, producers))
            if message is not None:
                return Violation(eqn, message, fn.__name__)
    return None


def _walk(jaxpr: Any, producers: dict[Any, Any]) -> Iterator[Any]:
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            producers[var] = eqn
        inner = eqn.params.get("jaxpr")
        if eqn.primitive is jc.jit_p and inner is not None:
            # A jit's operands are its jaxpr's inputs: follow them in (jnp.where is one).
            body = inner.jaxpr if isinstance(inner, jc.ClosedJaxpr) else inner
            for outer, var in zip(eqn.invars, body.invars):
                if isinstance(outer, jc.Var) and outer in producers:
                    producers[var] = producers[outer]
        yield eqn
        for value in eqn.params.values():
            for sub in sub_jaxprs(value):
                yield from _walk(sub, producers)


def _dtype(var: Any) -> str | None:
    try:
        return np.dtype(var.aval.dtype).name
    except (AttributeError, TypeError):
        return None


def _rank(var: Any) -> int:
    return len(getattr(var.aval, "shape", ()))


# --- vector and scalar dtypes per operation -------------------------------------------

_VECTOR_WORDS = {
    "int8": "\"Only vector<i16> and vector<i32> are supported, but got 'i8'\"",
    "uint8": "\"Only vector<i16> and vector<i32> are supported, but got 'i8'\"",
}


@rule("add", "sub", "mul", "neg", "abs", "div", "exp", "tanh", "max", "min",
      "shift_right_arithmetic", "shift_right_logical", "lt", "eq", "reduce_sum",
      "reduce_max", "reduce_min")
def vector_dtype(site: Site) -> str | None:
    """Vector operations the compiler has no instruction for at that element type
    (int8/uint8 arithmetic, float8 arithmetic and reductions, int16 max/min/shift,
    uint32 max/min)."""
    eqn = site.eqn
    name = eqn.primitive.name
    for var in eqn.invars:
        dtype = _dtype(var)
        if dtype is None or _rank(var) == 0:
            continue
        if dtype in site.facts.vector_rejects.get(name, ()):
            words = _VECTOR_WORDS.get(dtype, "\"failed to legalize operation\"")
            wide = "int32" if np.issubdtype(np.dtype(dtype), np.integer) else "float32"
            return (f"the TPU compiler has no {dtype} vector '{name}' on TPU {site.chip} "
                    f"({words}). Compute in {wide}: x.astype(jnp.{wide}) before the "
                    f"operation, .astype(jnp.{dtype}) after it.")
    return None


@rule("get", "load", "convert_element_type", "swap")
def float16_vectors(site: Site) -> str | None:
    """float16 vectors: the compiler loads, stores and converts none."""
    if site.facts.float16_vectors:
        return None
    for var in (*site.eqn.outvars, *site.eqn.invars[1:]):
        if _dtype(var) == "float16" and _rank(var) > 0:
            return (f"the TPU compiler has no float16 vectors on TPU {site.chip} (\"Invalid "
                    "vector type for load\"). Use bfloat16 (or float32) in the kernel; "
                    "convert float16 arrays outside the pallas_call.")
    return None


@rule("add", "mul", "max")
def scalar_dtype(site: Site) -> str | None:
    """Scalar (SMEM) arithmetic exists for 32-bit values only."""
    name = site.eqn.primitive.name
    if any(_rank(var) for var in (*site.eqn.invars, *site.eqn.outvars)):
        return None  # a vector operation (perhaps with a scalar operand)
    for var in site.eqn.invars:
        dtype = _dtype(var)
        if (dtype is not None and _rank(var) == 0
                and dtype in site.facts.scalar_rejects.get(name, ())):
            return (f"the TPU compiler's scalar unit has no {dtype} '{name}' on TPU "
                    f"{site.chip} (\"Only i32 arith.addi is supported\", \"Only i1 and i32 "
                    "scalars are supported\"). Compute scalars as int32 or float32: "
                    "x.astype(jnp.int32) (or jnp.float32) before the operation.")
    return None


_COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")


@rule("select_n")
def narrow_mask_selects_words(site: Site) -> str | None:
    """A mask from comparing 16-bit vectors selecting 32-bit values: Mosaic cannot
    relayout the packed mask."""
    pred, *cases = site.eqn.invars
    made = site.producer(pred)
    if made is None or made.primitive.name not in _COMPARISONS or _rank(pred) == 0:
        return None
    compared = _dtype(made.invars[0])
    narrow = compared == "int16" or (compared == "bfloat16"
                                     and site.facts.bf16_compare_packed_mask)
    if narrow and any(np.dtype(c.aval.dtype).itemsize == 4 for c in cases):
        return (f"on TPU {site.chip} the TPU compiler cannot use the mask of a {compared} "
                "comparison to select 32-bit values (\"Invalid relayout: Non-singleton "
                "logical dimension is replicated in destination but not in source\"). "
                f"Compare in 32 bits (x.astype(jnp.float32) or jnp.int32) or select "
                f"{compared} values.")
    return None


# --- value reshapes -------------------------------------------------------------------

@rule("reshape")
def lane_split_reshape(site: Site) -> str | None:
    """Splitting the minor (lane) dimension of a value below 128: Mosaic's layout
    inference rejects (8, 128) -> (16, 64) everywhere, and (8, 128) -> (8, 2, 64) on v4."""
    src = tuple(site.eqn.invars[0].aval.shape)
    dst = tuple(site.eqn.outvars[0].aval.shape)
    if len(src) < 2 or len(dst) < 2 or src[-1] % 128 or dst[-1] >= 128 or src[-1] % dst[-1]:
        return None
    folded = (len(dst) == len(src) and dst[:-2] == src[:-2]
              and dst[-2] == src[-2] * (src[-1] // dst[-1]))
    new_dim = (not site.facts.lane_split_into_new_dim and len(dst) == len(src) + 1
               and dst[:-2] == src[:-1] and dst[-2] * dst[-1] == src[-1])
    if folded or new_dim:
        return (f"the TPU compiler cannot lay out the reshape {src} -> {dst} on TPU "
                f"{site.chip} (\"infer-vector-layout: unsupported shape cast\"): it splits "
                "the minor dimension of 128 lanes. Keep the minor dimension a multiple of "
                "128 (reshape leading dimensions only), or read the parts from the ref "
                "with slices.")
    return None


# --- ref accesses: strides and alignment ----------------------------------------------

def _indexers(eqn: Any) -> tuple[Any, Any] | None:
    """(ref aval, the NDIndexer of a get/swap) when it has one."""
    skip = {"get": 1, "swap": 2}.get(eqn.primitive.name)
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


@rule("get")
def strided_access(site: Site) -> str | None:
    """Strided VMEM loads: only of 32-bit data, from refs whose minor dimension is 128."""
    found = _indexers(site.eqn)
    if found is None or not _in_vmem(found[0]):
        return None
    ref, indexer = found
    if not any(isinstance(i, jc.Slice) and i.stride > 1 for i in indexer.indices):
        return None
    if np.dtype(ref.dtype) == np.bool_:
        return None  # not measured
    itemsize = np.dtype(ref.dtype).itemsize
    if itemsize != 4:
        return (f"the TPU compiler has no strided access to {np.dtype(ref.dtype).name} data "
                f"on TPU {site.chip} (\"Strided load with non 32-bit data\"). Load the "
                "rows contiguously and select them from the value, or keep this operand "
                "in 32 bits.")
    if len(ref.shape) >= 2 and ref.shape[-1] != 128:
        return (f"the TPU compiler accesses a ref with a stride only when its minor "
                f"dimension is 128 on TPU {site.chip} (\"The last dim size is not 128 in "
                f"original base memref\"; this one is {tuple(ref.shape)}). Use blocks of "
                "128 lanes for the strided operand.")
    return None


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


@rule("get")
def unproven_alignment(site: Site) -> str | None:
    """A load at a dynamic start in one of a VMEM ref's two minor dimensions that the
    compiler cannot prove aligned (E2003)."""
    found = _indexers(site.eqn)
    if found is None or not _in_vmem(found[0]):
        return None
    ref, indexer = found
    rank = len(ref.shape)
    if rank < 2:
        return None
    itemsize = _vmem_itemsize(ref.dtype)
    for dim in (rank - 2, rank - 1):
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


# --- the MXU ----------------------------------------------------------------------------

def _is_int(dtype: str) -> bool:
    return np.issubdtype(np.dtype(dtype), np.integer)


@rule("dot_general")
def matmul_dtypes(site: Site) -> str | None:
    """Operand and accumulator dtype combinations the MXU lowering rejects."""
    eqn = site.eqn
    lhs, rhs = (_dtype(v) for v in eqn.invars[:2])
    acc = eqn.params.get("preferred_element_type")
    out = np.dtype(acc).name if acc is not None else _dtype(eqn.outvars[0])
    if lhs is None or rhs is None or out is None:
        return None
    facts = site.facts
    wide_int = ("int16", "int32")
    what = None
    if lhs in wide_int and rhs in wide_int:
        what = f"no {lhs} x {rhs} matmul (\"Bad lhs/rhs type\")"
    elif (not _is_int(lhs) and not _is_int(rhs) and out == "int32"
          and not facts.matmul_float_to_int):
        what = f"no {lhs} matmul with an {out} accumulator (\"int acc with float lhs\")"
    elif (lhs == "int8" and rhs in ("int8", "int32") and out == "float32"
          and not facts.matmul_int8_to_float):
        what = (f"no {lhs} x {rhs} matmul with a {out} accumulator (\"float acc with int "
                "lhs\", \"Mix int/int - NYI\")")
    elif not facts.matmul_narrow_operands and (
            rhs in ("int8", "float8_e4m3fn", "float8_e5m2")
            or lhs in ("float8_e4m3fn", "float8_e5m2")):
        what = (f"no {lhs} x {rhs} matmul (\"Unsupported matmul RHS type on target\")")
    if what is None:
        return None
    return (f"the TPU compiler has {what} on TPU {site.chip}. Use bfloat16 or float32 "
            "operands with a float32 accumulator, or int8 x int8 with an int32 one "
            "(preferred_element_type=...), converting operands before the dot.")


# --- the grid ---------------------------------------------------------------------------

def _is_core_parallel(semantics: Any) -> bool:
    return "core_parallel" in str(getattr(semantics, "value", semantics)).lower()


@kernel_rule
def core_parallel_grid(kernel: PreparedKernel, chip: str, facts: CompilerFacts) -> str | None:
    """A "core_parallel" grid dimension spreads over the chip's active TensorCores: one
    such dimension at most, with exactly that many iterations."""
    params = kernel.compiler_params
    semantics = tuple(getattr(params, "dimension_semantics", None) or ())
    if kernel.is_core_map or not semantics:
        return None
    grid = tuple(kernel.grid_mapping.grid)
    offset = len(grid) - len(semantics)  # vmap prepends batch dimensions
    core = [i for i, s in enumerate(semantics) if _is_core_parallel(s)]
    if len(core) > 1:
        return ("a pallas_call may have one \"core_parallel\" grid dimension (the compiler: "
                "\"A single Mosaic subkernel cannot contain multiple core sharding "
                "dimensions\"); make the others \"parallel\".")
    for i in core:
        bound = grid[offset + i] if 0 <= offset + i < len(grid) else None
        if isinstance(bound, int) and bound != facts.core_parallel_cores:
            cores = facts.core_parallel_cores
            return (f"grid dimension {offset + i} is \"core_parallel\" with {bound} "
                    f"iterations, but TPU {chip} gives a kernel {cores} active "
                    f"TensorCore{'s' if cores != 1 else ''} (the compiler: \"Core-parallel "
                    "dimension has iteration bound greater than the number of active "
                    f"cores\"). Make that dimension {cores} long, or \"parallel\".")
    return None


@kernel_rule
def smem_float16_operands(kernel: PreparedKernel, chip: str,
                          facts: CompilerFacts) -> str | None:
    """SMEM operands of float16."""
    for info in (*kernel.inputs, *kernel.outputs):
        if info.space == MemorySpace.SMEM and np.dtype(info.dtype).name == "float16":
            return (f"SMEM operand '{info.name}' is float16, which the TPU compiler does not "
                    f"pass in SMEM on TPU {chip} (\"Only arguments with float8e5m2, "
                    "float8e4m3fn, ..., bfloat16 or 32-bit element types are supported\"). "
                    "Pass it as float32 or bfloat16.")
    return None
