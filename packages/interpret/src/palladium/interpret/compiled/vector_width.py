"""Which compiled launches XLA compiles for the host's widest vectors: those whose every
floating-point operation gives the same bits at any vector width.

XLA's CPU compiler vectorizes for 256-bit registers unless told otherwise
(``xla_cpu_prefer_vector_width``). On a host with 512-bit ones (AVX-512) a loop of
elementwise transcendental functions runs much faster with 512: the RG-LRU scan's
executable took 0.31 against 0.43 ms (benchmarks/LOG.md, 2026-12-07). Not every
executable keeps its bits: a dot XLA emits itself tiles its sums by the register width
(paged attention's 1x128 q.k, 8 elements 1 ulp apart), a float reduction may too, and
``atan`` takes another polynomial. So the wider vectors are asked for only where every
equation of the traced launch (at any depth) that reads or makes a float is either
data movement or a primitive of ``LANE_WISE`` on f32, bf16 or f16, each of which
``tests/compiled/test_vector_width.py`` compiles at both widths and compares bit for
bit (random, special and subnormal values). An equation of integers and booleans alone
(block indices, flags, the DMA table) is exact at any width. Those checks were made on
an x86-64 host with AVX-512 (where the wider vectors pay): on any other host (arm64,
x86-64 without AVX-512) ``WIDE`` is None and every launch keeps XLA's default width.
"""

from __future__ import annotations

import platform
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from palladium.interpret.eval.jaxprs import any_equation
from palladium.interpret.eval.primitive_groups import NESTED_CALLS

__all__ = ["CONTAINERS", "DATA_MOVEMENT", "LANE_WISE", "WIDE", "lane_wise"]



def host_has_512_bit_vectors(machine: str | None = None, cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this host is x86-64 with AVX-512 (``avx512f`` among its CPU flags)."""
    if (machine or platform.machine()).lower() not in ("x86_64", "amd64"):
        return False
    try:
        with open(cpuinfo) as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return False


#: The compile options of a launch that ``lane_wise`` admits (None: XLA's default
#: width, on a host without 512-bit vectors).
WIDE = {"xla_cpu_prefer_vector_width": 512} if host_has_512_bit_vectors() else None

#: Elementwise arithmetic whose bits XLA computes alike at 256 and 512 bits (tested).
LANE_WISE = frozenset({
    "abs", "acos", "acosh", "add", "asin", "asinh", "atan2", "atanh", "cbrt", "ceil",
    "clamp", "convert_element_type", "cos", "cosh", "digamma", "div", "eq", "erf",
    "erf_inv", "erfc", "exp", "exp2", "expm1", "floor", "ge", "gt", "integer_pow",
    "is_finite", "le", "lgamma", "log", "log1p", "logistic", "lt", "max", "min", "mul",
    "ne", "neg", "nextafter", "pow", "reduce_precision", "rem", "round", "rsqrt",
    "select_n", "sign", "sin", "sinh", "sqrt", "square", "sub", "tan", "tanh",
})
#: Primitives that move floats without arithmetic.
DATA_MOVEMENT = frozenset({
    "bitcast_convert_type", "broadcast_in_dim", "concatenate", "copy", "copy_p",
    "dynamic_slice", "dynamic_update_slice", "expand_dims", "iota", "pad", "reshape",
    "rev", "slice", "squeeze", "transpose",
})
#: Primitives whose arithmetic is that of the jaxprs they hold (checked in turn).
CONTAINERS = frozenset({"cond", "scan", "while", *(p.name for p in NESTED_CALLS)})


#: The float types ``LANE_WISE`` is tested on (others: f64, complex, float8 keep the default).
_TESTED = frozenset(np.dtype(d) for d in (np.float32, jnp.bfloat16, np.float16))


def _inexact(eqn: Any) -> list[np.dtype]:
    """The floating-point and complex types ``eqn`` reads or makes (bf16 included)."""
    dtypes = (getattr(getattr(v, "aval", None), "dtype", None) for v in (*eqn.invars, *eqn.outvars))
    return [np.dtype(d) for d in dtypes if d is not None and jax.dtypes.issubdtype(d, jnp.inexact)]


def _varies(eqn: Any) -> bool:
    """Whether ``eqn`` may give other bits at another vector width."""
    name = eqn.primitive.name
    if name in CONTAINERS or name in DATA_MOVEMENT:
        return False
    inexact = _inexact(eqn)
    return bool(inexact) and (name not in LANE_WISE or any(d not in _TESTED for d in inexact))


def lane_wise(jaxpr: Any) -> bool:
    """Whether the traced launch ``jaxpr`` (closed or open) computes the same bits at
    any vector width (the module's docstring)."""
    return not any_equation(jaxpr, _varies)
