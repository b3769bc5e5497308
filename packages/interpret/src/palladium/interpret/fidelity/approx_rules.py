"""The approximation's rules over values: vector and scalar dtypes per operation,
float16, 16-bit compare masks, lane-splitting reshapes, MXU dtype pairs, the grid's
"core_parallel" dimension and float16 SMEM operands (see ``approx_registry``; the facts
per chip are ``palladium.interpret.chip.CompilerFacts``, measured with libtpu).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.chip import CompilerFacts
from palladium.interpret.fidelity.approx_registry import (
    Site,
    dtype_name,
    kernel_rule,
    rank,
    rule,
)
from palladium.interpret.kernel.blocks import memory_space_of
from palladium.interpret.kernel.prepared_kernel import PreparedKernel
from palladium.shared_memory import MemorySpace

__all__ = ["core_parallel_grid", "float16_vectors", "lane_split_reshape", "matmul_dtypes",
           "narrow_mask_selects_words", "scalar_dtype", "smem_float16_operands",
           "vector_dtype"]


# --- vector and scalar dtypes per operation -------------------------------------------

_COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")


def _from_smem(var: Any, site: Site) -> bool:
    """``var`` is a constant or was loaded from an SMEM ref."""
    if not isinstance(var, jc.Var):
        return True
    made = site.producer(var)
    if made is None or made.primitive.name != "get":
        return False
    space = getattr(made.invars[0].aval, "memory_space", None)
    return memory_space_of(space) == MemorySpace.SMEM

_VECTOR_WORDS = {
    "int8": "\"Only vector<i16> and vector<i32> are supported, but got 'i8'\"",
    "uint8": "\"Only vector<i16> and vector<i32> are supported, but got 'i8'\"",
}


@rule("add", "sub", "mul", "neg", "abs", "div", "exp", "tanh", "max", "min",
      "shift_right_arithmetic", "shift_right_logical", "lt", "gt", "eq", "reduce_sum",
      "reduce_max", "reduce_min")
def vector_dtype(site: Site) -> str | None:
    """Vector operations the compiler has no instruction for at that element type
    (int8/uint8 arithmetic, float8 arithmetic and reductions, int16 max/min/shift,
    uint32 max/min)."""
    eqn = site.eqn
    name = eqn.primitive.name
    for var in eqn.invars:
        dtype = dtype_name(var)
        if dtype is None or rank(var) == 0:
            continue
        if dtype in site.facts.vector_rejects.get(name, ()):
            words = ("\"Target does not support this comparison\"" if name in _COMPARISONS
                     else _VECTOR_WORDS.get(dtype, "\"failed to legalize operation\""))
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
        if dtype_name(var) == "float16" and rank(var) > 0:
            return (f"the TPU compiler has no float16 vectors on TPU {site.chip} (\"Invalid "
                    "vector type for load\"). Use bfloat16 (or float32) in the kernel; "
                    "convert float16 arrays outside the pallas_call.")
    return None


@rule("add", "mul", "max")
def scalar_dtype(site: Site) -> str | None:
    """Scalar (SMEM) arithmetic exists for 32-bit values only."""
    name = site.eqn.primitive.name
    if any(rank(var) for var in (*site.eqn.invars, *site.eqn.outvars)):
        return None  # a vector operation (perhaps with a scalar operand)
    if not all(_from_smem(var, site) for var in site.eqn.invars):
        return None  # e.g. a vector reduced to a scalar: not measured
    for var in site.eqn.invars:
        dtype = dtype_name(var)
        if (dtype is not None and rank(var) == 0
                and dtype in site.facts.scalar_rejects.get(name, ())):
            return (f"the TPU compiler's scalar unit has no {dtype} '{name}' on TPU "
                    f"{site.chip} (\"Only i32 arith.addi is supported\", \"Only i1 and i32 "
                    "scalars are supported\"). Compute scalars as int32 or float32: "
                    "x.astype(jnp.int32) (or jnp.float32) before the operation.")
    return None


@rule("select_n")
def narrow_mask_selects_words(site: Site) -> str | None:
    """A mask from comparing 16-bit vectors selecting 32-bit values: Mosaic cannot
    relayout the packed mask."""
    pred, *cases = site.eqn.invars
    made = site.producer(pred)
    if made is None or made.primitive.name not in _COMPARISONS or rank(pred) == 0:
        return None
    compared = dtype_name(made.invars[0])
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


# --- the MXU ----------------------------------------------------------------------------

_F8 = ("float8_e4m3fn", "float8_e5m2")


def _is_int(dtype: str) -> bool:
    return np.issubdtype(np.dtype(dtype), np.integer)


@rule("dot_general")
def matmul_dtypes(site: Site) -> str | None:
    """Operand and accumulator dtype combinations the MXU lowering rejects."""
    eqn = site.eqn
    lhs, rhs = (dtype_name(v) for v in eqn.invars[:2])
    acc = eqn.params.get("preferred_element_type")
    out = np.dtype(acc).name if acc is not None else dtype_name(eqn.outvars[0])
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
            rhs in _F8 or lhs in _F8 or (lhs == "int8" and rhs == "int8")):
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
