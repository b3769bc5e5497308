"""NumPy implementations of jax primitives, the evaluator's fast path before ``bind``.

``primitive.bind`` compiles every new (primitive, shapes, dtypes, params) combination
on first use; a kernel with twenty distinct operations pays ~0.6 s of compilation on
its first call. The rules here compute the same values with numpy, without compiling.

Contract of a rule: ``rule(*invals, **eqn.params)``, where the invals are numpy arrays
or numpy/typed scalars (bf16 and f16 through ml_dtypes). It returns a numpy array (a
list of arrays iff ``primitive.multiple_results``) with exactly the dtype and shape that
``bind`` gives, or ``NotImplemented`` when it cannot handle these dtypes or params (the
evaluator then falls back to ``bind``). Results may be read-only views of the inputs
(``reshape``, ``transpose``, ``slice``, ``broadcast_in_dim``, ...): values are immutable
to the evaluator, which must copy before writing into memory it owns.

What "the same values" means. XLA on CPU computes f16/bf16 elementwise ops in f32 and
rounds the result back, and runs with denormals flushed: float arithmetic and f32
comparisons read a subnormal input as a zero of the same sign and write a subnormal
result as a zero (``neg``, ``abs``, ``select_n``, conversions, bitcasts and structural
ops move bits and do not flush). The rules reproduce both, and match XLA's rewrites
(``x / scalar`` is ``x * (1 / scalar)``; ``integer_pow`` is square-and-multiply with
every product rounded). Classes, verified by ``tests/numpy_rules/test_numpy_rules.py`` against
``bind`` on the CPU backend:

- **exact** -- bit-identical to ``bind``, NaN payloads aside (any NaN equals any NaN):
  add, sub, mul, div, rem, neg, abs, sign, max, min (NaN-propagating, -0 < +0), clamp,
  sqrt, square, floor, ceil, round (both methods), is_finite, nextafter (f32),
  integer_pow, eq/ne/lt/le/gt/ge, and/or/xor/not, shift_left, shift_right_logical,
  shift_right_arithmetic (out-of-range amounts as XLA), population_count, clz, mulhi,
  select_n, convert_element_type (float->int truncates and saturates, NaN->0),
  bitcast_convert_type, iota, broadcast_in_dim, reshape, squeeze, transpose, rev,
  concatenate, pad (negative and interior), slice, dynamic_slice and
  dynamic_update_slice (starts clamped into bounds), tile, split, copy,
  optimization_barrier, reduce_max/min/and/or/xor, argmax, argmin, cummax, cummin; and
  reduce_sum, reduce_prod, cumsum, cumprod, dot_general on integers.
- **approximate** -- XLA CPU uses its own polynomial approximations: exp (6 ulp),
  exp2 (f32 only, 8), log (3), log1p (3), expm1 (8), tanh (6), logistic (5), sin and
  cos (2, tested for |x| <= 1e4), rsqrt (2), pow (8); f16/bf16 results within 2 ulp of
  their type. Float reduce_sum, reduce_prod, cumsum, cumprod and dot_general differ in
  accumulation order (f16/bf16 operands: XLA accumulates in the narrow type, we in
  f32): within n * eps * sum|terms|.
- **left to bind** (absent from the table, or the rule returns ``NotImplemented``): gather, scatter, sort, erf and
  the other special functions, cbrt, float64 and float8, float <-> 64-bit integer
  conversions, dynamic shapes, a non-None ``accuracy``, mixed operand dtypes; and inputs
  where XLA CPU itself is inconsistent (its vector loop and scalar tail disagree):
  float rem/pow with subnormal operands, log of a negative subnormal; tanh, sin, expm1,
  log1p of subnormal operands (XLA's approximations may return such an input unchanged:
  its code decides); and inputs where XLA's result depends on the CPU: bf16 subnormals in
  broadcast_in_dim and tile (some go through f32, and AVX512_BF16's f32 -> bf16
  instruction flushes them; AVX2 keeps them), float conversions with bf16/f16 subnormals
  in or f16 subnormals out (see ``conversions._cpu_dependent``).

Subnormals are recognised from the raw bits, never by float comparison: XLA runs host
callbacks, and so every launch, with denormals-are-zero set, where ``x != 0`` is False
for a subnormal ``x`` (tests/numpy_rules/test_subnormals_in_launch.py checks the rules inside that
environment against ``jax.jit``).
"""

from __future__ import annotations

from jax import lax
from jax.extend.core import Primitive

from palladium.interpret.numpy_rules import (  # noqa: F401  (each registers its rules)
    comparisons,
    conversions,
    dot,
    integer_bits,
    reductions,
    structural,
)
from palladium.interpret.numpy_rules.common import (
    DETERMINISTIC_RULES,
    NUMPY_RULES,
    PREFLUSHED_RULES,
    Rule,
    flush,
    has_subnormal_f32,
)
from palladium.interpret.numpy_rules.elementwise import ARITH, PASS_THROUGH

__all__ = [
    "FLUSHING",
    "DETERMINISTIC_RULES",
    "NUMPY_RULES",
    "PREFLUSHED_RULES",
    "PRESERVING",
    "Rule",
    "flush",
    "has_subnormal_f32",
]

FLUSHING: frozenset[Primitive] = frozenset({*ARITH, lax.div_p, lax.dot_general_p,
                                            lax.reduce_sum_p, lax.reduce_prod_p}) - PASS_THROUGH
"""Primitives whose rule flushes every f32 result, whenever all operands are f32 and no
``accuracy`` is asked for (their rules then never return ``NotImplemented``)."""

PRESERVING: frozenset[Primitive] = frozenset({
    lax.broadcast_in_dim_p, lax.reshape_p, lax.squeeze_p, lax.transpose_p, lax.rev_p,
    lax.concatenate_p, lax.slice_p, lax.dynamic_slice_p, lax.tile_p, lax.copy_p,
    lax.neg_p, lax.abs_p, lax.select_n_p, lax.reduce_max_p, lax.reduce_min_p,
})
"""Primitives whose f32 results hold only values (or negated values) of their operands:
subnormal-free when every floating operand is an f32 value free of subnormals."""
