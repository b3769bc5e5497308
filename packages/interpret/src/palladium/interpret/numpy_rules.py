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
every product rounded). Classes, verified by ``tests/test_numpy_rules.py`` against
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
  float rem/pow with subnormal operands, log of a negative subnormal, and bf16
  subnormals in broadcast_in_dim and tile.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
from jax import lax
from jax.extend.core import Primitive

from palladium.interpret import _jax_compat as jc

Rule = Callable[..., Any]

NUMPY_RULES: dict[Primitive, Rule] = {}
"""The registry: primitive -> numpy rule (see the module docstring for the contract)."""

PREFLUSHED_RULES: dict[Primitive, Rule] = {}
"""Variants of rules for when every floating operand is f32 and known to hold no
subnormals (the evaluator knows it of the results of ``FLUSHING`` and ``PRESERVING``
primitives): they skip flushing their operands. On such operands each gives the same
result as its ``NUMPY_RULES`` rule."""

_F32 = np.dtype(np.float32)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_F16 = np.dtype(np.float16)
_BOOL = np.dtype(np.bool_)
_FLOATS = frozenset({_F32, _BF16, _F16})
_INTS = frozenset(
    np.dtype(t)
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
)
_INTS_BOOL = _INTS | {_BOOL}
_SMALL_INTS = frozenset(t for t in _INTS if t.itemsize <= 4)
_TINY = np.float32(np.finfo(np.float32).tiny)
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)


def _register(
    *primitives: Primitive | None, table: dict[Primitive, Rule] = NUMPY_RULES
) -> Callable[[Rule], Rule]:
    """Registers a rule for ``primitives`` in ``table``; makes 0-d results arrays, not scalars.

    A ``None`` primitive (absent from the installed jax, see ``_jax_compat``) is skipped.
    """
    present = tuple(p for p in primitives if p is not None)

    def wrap(fn: Rule) -> Rule:
        if not present:
            return fn
        multiple = present[0].multiple_results

        @functools.wraps(fn)
        def rule(*args: Any, **params: Any) -> Any:
            out = fn(*args, **params)
            if out is NotImplemented:
                return out
            if multiple:
                return [np.asarray(o) for o in out]
            return np.asarray(out)

        for p in present:
            table[p] = rule
        return fn

    return wrap


def _arr(x: Any) -> np.ndarray:
    """A numpy array of ``x``, keeping the dtype of typed jax literals."""
    if type(x) is np.ndarray:
        return x
    return np.asarray(x, dtype=getattr(x, "dtype", None))


def _flush(x: np.ndarray) -> np.ndarray:
    """Subnormal f32 values -> zeros of the same sign (XLA CPU's DAZ/FTZ)."""
    if x.size == 0:
        return x
    a = np.abs(x)
    if np.fmin.reduce(a, axis=None) >= _TINY:  # the common case: one reduction (NaN ignored)
        return x
    small = a < _TINY
    small &= a != 0  # zeros (common: initialised accumulators) need no rewrite
    if small.any():
        return np.where(small, np.copysign(_ZERO, x), x)
    return x


def _f32(x: np.ndarray) -> np.ndarray:
    """The f32 value XLA computes with for a float input: widened, subnormals flushed."""
    if x.dtype != _F32:
        x = x.astype(_F32)
    return _flush(x)


def _back(r: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """An f32 result flushed and rounded to ``dtype``."""
    r = _flush(np.asarray(r, _F32))
    return r if dtype == _F32 else r.astype(dtype)


_MIXED = np.dtype(object)  # in none of the dtype sets: mixed operands are declined


def _same_dtype(xs: Sequence[np.ndarray]) -> np.dtype:
    dt = xs[0].dtype
    return dt if all(x.dtype == dt for x in xs) else _MIXED


# ----------------------------------------------------------------------------- elementwise


def _xla_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """max with NaN propagation and -0 < +0 (f32, already flushed)."""
    r = np.maximum(a, b)
    # np.maximum differs from XLA only on ties of zeros of opposite signs (equal nonzero
    # values have equal bits): fix those, when there are zeros at all.
    zero = r == 0
    if zero.any():
        r = np.where(zero & (a == b), np.where(np.signbit(a), b, a), r)
    return r


def _xla_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    r = np.minimum(a, b)
    zero = r == 0
    if zero.any():
        r = np.where(zero & (a == b), np.where(np.signbit(a), a, b), r)
    return r


def _f32_flushed(x: np.ndarray) -> np.ndarray:
    """``_f32`` of an operand known to hold no subnormals when it is f32."""
    return x if x.dtype == _F32 else _f32(x)


def _back_flushed(r: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``_back`` of a result that cannot hold subnormals (max/min of flushed values)."""
    return r if dtype == _F32 else _back(r, dtype)


def _elementwise(
    float_fn: Callable[..., np.ndarray] | None,
    int_fn: Callable[..., np.ndarray] | None,
    *,
    bools: bool = False,
    flushed_inputs: bool = False,
    exact_output: bool = False,
) -> Rule:
    """An n-ary rule: floats in f32 with flushing, integers (and bools) with ``int_fn``.

    ``flushed_inputs``: the variant for f32 operands known to hold no subnormals (their
    flush is skipped); ``exact_output``: with those, ``float_fn`` returns one of its
    operands' values (max, min), so its result needs no flush either.
    """
    widen = _f32_flushed if flushed_inputs else _f32
    back = _back_flushed if flushed_inputs and exact_output else _back

    def rule(*args: Any, accuracy: Any = None, out_dtype: Any = None) -> Any:
        if accuracy is not None:
            return NotImplemented
        xs = [_arr(a) for a in args]
        dt = _same_dtype(xs)
        if out_dtype is not None and dt != _MIXED and np.dtype(out_dtype) != dt:
            xs = [x.astype(out_dtype) for x in xs]
            dt = np.dtype(out_dtype)
        if dt in _FLOATS and float_fn is not None:
            with np.errstate(all="ignore"):
                return back(float_fn(*[widen(x) for x in xs]), dt)
        if int_fn is not None and (dt in _INTS or (bools and dt == _BOOL)):
            return int_fn(*xs)
        return NotImplemented

    return rule


def _int_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # XLA: quotient truncated toward zero, x / 0 == -1 (all bits set), MIN / -1 == MIN.
    zero = y == 0
    one = np.ones((), y.dtype)
    safe = np.where(zero, one, y)
    if x.dtype.kind == "i":
        safe = np.where((y == -1) & (x == np.iinfo(x.dtype).min), one, safe)
        q = np.floor_divide(x, safe)
        q = q + ((np.remainder(x, safe) != 0) & ((x < 0) != (safe < 0))).astype(x.dtype)
    else:
        q = np.floor_divide(x, safe)
    return np.where(zero, np.array(-1).astype(x.dtype), q)


def _int_rem(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # C semantics (sign of the dividend); XLA: x % 0 == x, MIN % -1 == 0.
    zero = y == 0
    safe = np.where(zero, np.ones((), y.dtype), y)
    if x.dtype.kind == "i":
        safe = np.where(safe == -1, np.ones((), y.dtype), safe)
    return np.where(zero, x, np.fmod(x, safe))


def has_subnormal_f32(x: np.ndarray) -> bool:
    """Whether the f32 array ``x`` holds a subnormal value (that ``_flush`` rewrites)."""
    a = np.abs(x)
    return bool(((a < _TINY) & (a > 0)).any())


def _has_subnormal(x: np.ndarray) -> bool:
    a = np.abs(x.astype(_F32))
    return bool(((a < _TINY) & (a > 0)).any())


@_register(lax.pow_p)
def _pow(x: Any, y: Any) -> Any:
    x, y = _arr(x), _arr(y)
    dt = _same_dtype([x, y])
    # XLA tests the raw inputs for the sign/integer cases but takes the log of the
    # flushed base; subnormal operands are left to bind.
    if dt not in _FLOATS or _has_subnormal(x) or _has_subnormal(y):
        return NotImplemented
    with np.errstate(all="ignore"):
        return _back(np.power(x.astype(_F32), y.astype(_F32)), dt)


def _has_bf16_subnormal(x: np.ndarray) -> bool:
    bits = x.view(np.uint16)
    return bool((((bits & 0x7F80) == 0) & ((bits & 0x007F) != 0)).any())


@_register(lax.rem_p)
def _rem(x: Any, y: Any) -> Any:
    x, y = _arr(x), _arr(y)
    dt = _same_dtype([x, y])
    if dt in _INTS:
        return _int_rem(x, y)
    if dt in _FLOATS:
        # XLA's fmod neither flushes its result nor reads subnormals consistently.
        if _has_subnormal(x) or _has_subnormal(y):
            return NotImplemented
        with np.errstate(all="ignore"):
            return np.fmod(x.astype(_F32), y.astype(_F32)).astype(dt)
    return NotImplemented


def _sign(x: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(x) | (x == 0), x, np.copysign(_ONE, x))


def _round_away(x: np.ndarray) -> np.ndarray:
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= _HALF, t + np.copysign(_ONE, x), t)


_LN2 = np.float32(np.log(2.0))


@_register(lax.exp2_p)
def _exp2(x: Any, *, accuracy: Any = None) -> Any:
    x = _arr(x)
    dt = x.dtype
    # XLA computes exp2(x) as exp(x * ln 2) (np.exp2 differs by up to ~70 ulp near
    # underflow). For f16/bf16 its intermediate rounding varies: left to bind.
    if accuracy is not None or dt != _F32:
        return NotImplemented
    with np.errstate(all="ignore"):
        return _back(np.exp(_f32(x) * _LN2), dt)


@_register(lax.log_p)
def _log(x: Any, *, accuracy: Any = None) -> Any:
    x = _arr(x)
    dt = x.dtype
    if accuracy is not None or dt not in _FLOATS:
        return NotImplemented
    # XLA CPU's log of a negative subnormal is -inf in its vector loop and NaN in its
    # scalar tail: left to bind.
    f = x.astype(_F32)
    if ((f < 0) & (f > -_TINY)).any():
        return NotImplemented
    # float64 log rounded once is within 1 ulp of XLA's (f32 np.log: 3 ulp).
    with np.errstate(all="ignore"):
        return _back(np.log(_flush(f).astype(np.float64)), dt)


@_register(lax.logistic_p)
def _logistic(x: Any, *, accuracy: Any = None) -> Any:
    x = _arr(x)
    dt = x.dtype
    if accuracy is not None or dt not in _FLOATS:
        return NotImplemented
    # XLA expands logistic into 1 / (1 + exp(-x)), rounding each step to the input type.
    with np.errstate(all="ignore"):
        e = _back(np.exp(-_f32(x)), dt)
        d = _back(_ONE + _f32(e), dt)
        return _back(_ONE / _f32(d), dt)


def _rsqrt(x: np.ndarray) -> np.ndarray:
    return _ONE / np.sqrt(x)


def _mul_flushed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _flush(np.multiply(a, b))


def _mul_rounded(a: np.ndarray, b: np.ndarray, *, dtype: np.dtype) -> np.ndarray:
    return _f32(_back(np.multiply(a, b), dtype))


def _div_rule(flushed_inputs: bool) -> Rule:
    widen = _f32_flushed if flushed_inputs else _f32

    def rule(x: Any, y: Any) -> Any:
        return _div(x, y, widen)

    return rule


def _div(x: Any, y: Any, widen: Callable[[np.ndarray], np.ndarray]) -> Any:
    x, y = _arr(x), _arr(y)
    dt = _same_dtype([x, y])
    if dt in _INTS:
        return _int_div(x, y)
    if dt not in _FLOATS:
        return NotImplemented
    with np.errstate(all="ignore"):
        fx, fy = widen(x), widen(y)
        if y.ndim == 0 and x.ndim > 0 and jc.xla_divides_by_scalar_reciprocal():
            # XLA rewrites a division by a broadcast scalar into a multiplication by its
            # reciprocal; for f16 the reciprocal is rounded to f16 first.
            recip = _flush(_ONE / fy)
            if dt == _F16:
                recip = recip.astype(_F16).astype(_F32)
            return _back(np.multiply(fx, recip), dt)
        return _back(np.divide(fx, fy), dt)


_register(lax.div_p)(_div_rule(flushed_inputs=False))
_register(lax.div_p, table=PREFLUSHED_RULES)(_div_rule(flushed_inputs=True))

_ARITH: dict[Primitive, tuple[Any, Any]] = {
    lax.add_p: (np.add, np.add),
    lax.sub_p: (np.subtract, np.subtract),
    lax.mul_p: (np.multiply, np.multiply),
    lax.max_p: (_xla_max, np.maximum),
    lax.min_p: (_xla_min, np.minimum),
    lax.square_p: (lambda x: x * x, lambda x: x * x),
    lax.sign_p: (_sign, np.sign),
    lax.sqrt_p: (np.sqrt, None),
    lax.rsqrt_p: (_rsqrt, None),
    lax.exp_p: (np.exp, None),
    lax.log1p_p: (np.log1p, None),
    lax.expm1_p: (np.expm1, None),
    lax.tanh_p: (np.tanh, None),
    lax.sin_p: (np.sin, None),
    lax.cos_p: (np.cos, None),
    lax.floor_p: (np.floor, None),
    lax.ceil_p: (np.ceil, None),
}
for _prim, (_ffn, _ifn) in _ARITH.items():
    _register(_prim)(_elementwise(_ffn, _ifn))
    _register(_prim, table=PREFLUSHED_RULES)(
        _elementwise(_ffn, _ifn, flushed_inputs=True, exact_output=_prim in (lax.max_p, lax.min_p))
    )

_BITWISE: dict[Primitive, Any] = {
    lax.and_p: np.bitwise_and,
    lax.or_p: np.bitwise_or,
    lax.xor_p: np.bitwise_xor,
    lax.not_p: np.invert,
}
for _prim, _fn in _BITWISE.items():
    _register(_prim)(_elementwise(None, _fn, bools=True))


def _bitwise_move(np_fn: Callable[[np.ndarray], np.ndarray]) -> Rule:
    """neg/abs: sign-bit operations on floats, no flushing, any float dtype."""

    def rule(x: Any) -> Any:
        x = _arr(x)
        if x.dtype in _FLOATS or x.dtype in _INTS:
            return np_fn(x)
        return NotImplemented

    return rule


_register(lax.neg_p)(_bitwise_move(np.negative))
_register(lax.abs_p)(_bitwise_move(np.abs))


@_register(lax.round_p)
def _round(x: Any, *, rounding_method: Any) -> Any:
    x = _arr(x)
    if x.dtype not in _FLOATS:
        return NotImplemented
    fn = np.rint if int(rounding_method) == int(lax.RoundingMethod.TO_NEAREST_EVEN) else _round_away
    return _back(fn(_f32(x)), x.dtype)


@_register(lax.is_finite_p)
def _is_finite(x: Any) -> Any:
    x = _arr(x)
    return np.isfinite(x.astype(_F32)) if x.dtype in _FLOATS else NotImplemented


@_register(lax.nextafter_p)
def _nextafter(x: Any, y: Any) -> Any:
    x, y = _arr(x), _arr(y)
    if _same_dtype([x, y]) != _F32:
        return NotImplemented
    # XLA steps the raw bits of x, but returns y when x == y compares equal with
    # subnormals flushed.
    return np.where(_f32(x) == _f32(y), y, np.nextafter(x, y))


@_register(lax.integer_pow_p)
def _integer_pow(x: Any, *, y: int) -> Any:
    x = _arr(x)
    dt = x.dtype
    if dt in _INTS:
        mul: Callable[[np.ndarray, np.ndarray], np.ndarray] = np.multiply
        base = x
    elif dt in _FLOATS:
        # Every multiplication rounds to the input type, as separate XLA multiplies do.
        mul = _mul_flushed if dt == _F32 else functools.partial(_mul_rounded, dtype=dt)
        base = _f32(x) if y != 1 else x
    else:
        return NotImplemented
    if y == 0:
        return np.ones_like(x)
    if y == 1:
        return x
    # Square-and-multiply in the order of jax's lowering, so floats round identically.
    n, acc = abs(y), None
    with np.errstate(all="ignore"):
        if n == 3:
            acc = mul(mul(base, base), base)
        else:
            while n > 0:
                if n & 1:
                    acc = base if acc is None else mul(acc, base)
                n >>= 1
                if n > 0:
                    base = mul(base, base)
        assert acc is not None
        if y < 0:
            acc = _flush(_ONE / acc)
    return acc if dt in _INTS else _back(acc, dt)


# ----------------------------------------------------------------------------- comparisons


def _comparison(
    np_fn: Callable[[np.ndarray, np.ndarray], np.ndarray], flushed_inputs: bool = False
) -> Rule:
    widen = _f32_flushed if flushed_inputs else _f32

    def rule(x: Any, y: Any) -> Any:
        x, y = _arr(x), _arr(y)
        dt = _same_dtype([x, y])
        if dt in _FLOATS:
            return np_fn(widen(x), widen(y))
        if dt in _INTS_BOOL:
            return np_fn(x, y)
        return NotImplemented

    return rule


for _prim, _fn in {
    lax.eq_p: np.equal,
    lax.ne_p: np.not_equal,
    lax.lt_p: np.less,
    lax.le_p: np.less_equal,
    lax.gt_p: np.greater,
    lax.ge_p: np.greater_equal,
}.items():
    _register(_prim)(_comparison(_fn))
    _register(_prim, table=PREFLUSHED_RULES)(_comparison(_fn, flushed_inputs=True))


# ----------------------------------------------------------------------------- integer bits


def _unsigned(dt: np.dtype) -> np.dtype:
    return np.dtype(f"u{dt.itemsize}")


def _shift(kind: str) -> Rule:
    def rule(x: Any, y: Any) -> Any:
        x, y = _arr(x), _arr(y)
        dt = _same_dtype([x, y])
        if dt not in _INTS:
            return NotImplemented
        bits = dt.itemsize * 8
        out_of_range = y.astype(_unsigned(dt)) >= bits
        amount = np.where(out_of_range, np.zeros((), dt), y)
        if kind == "left":
            shifted = np.left_shift(x, amount)
            return np.where(out_of_range, np.zeros((), dt), shifted)
        if kind == "logical":
            u = _unsigned(dt)
            shifted = np.right_shift(x.astype(u), amount.astype(u)).astype(dt)
            return np.where(out_of_range, np.zeros((), dt), shifted)
        # Arithmetic (on the signed view, also for unsigned types): an out-of-range
        # shift fills with the sign bit.
        s = np.dtype(f"i{dt.itemsize}")
        amount = np.where(out_of_range, np.array(bits - 1, dt), y).astype(s)
        return np.right_shift(x.astype(s), amount).astype(dt)

    return rule


_register(lax.shift_left_p)(_shift("left"))
_register(lax.shift_right_logical_p)(_shift("logical"))
_register(lax.shift_right_arithmetic_p)(_shift("arithmetic"))


@_register(lax.population_count_p)
def _population_count(x: Any) -> Any:
    x = _arr(x)
    if x.dtype not in _INTS:
        return NotImplemented
    return np.bitwise_count(x.astype(_unsigned(x.dtype))).astype(x.dtype)


@_register(lax.clz_p)
def _clz(x: Any) -> Any:
    x = _arr(x)
    if x.dtype not in _SMALL_INTS:
        return NotImplemented
    # frexp's exponent of a float64 is the bit length of an integer below 2**53.
    _, bit_length = np.frexp(x.astype(_unsigned(x.dtype)).astype(np.float64))
    return (x.dtype.itemsize * 8 - bit_length).astype(x.dtype)


@_register(jc.mulhi_p)
def _mulhi(x: Any, y: Any) -> Any:
    x, y = _arr(x), _arr(y)
    dt = _same_dtype([x, y])
    if dt not in _SMALL_INTS:
        return NotImplemented
    wide = np.int64 if dt.kind == "i" else np.uint64
    return ((x.astype(wide) * y.astype(wide)) >> (dt.itemsize * 8)).astype(dt)


# ----------------------------------------------------------------------------- selection


@_register(lax.select_n_p)
def _select_n(which: Any, *cases: Any) -> Any:
    which = _arr(which)
    cs = [_arr(c) for c in cases]
    if len(cs) == 1:
        return cs[0]
    if which.dtype == _BOOL and len(cs) == 2:
        return np.where(which, cs[1], cs[0])
    shape = np.broadcast_shapes(which.shape, *(c.shape for c in cs))
    return np.choose(which, [np.broadcast_to(c, shape) for c in cs], mode="clip")


@_register(lax.clamp_p)
def _clamp(lo: Any, x: Any, hi: Any) -> Any:
    lo, x, hi = _arr(lo), _arr(x), _arr(hi)
    dt = _same_dtype([lo, x, hi])
    if dt in _FLOATS:
        with np.errstate(all="ignore"):
            return _back(_xla_min(_xla_max(_f32(x), _f32(lo)), _f32(hi)), dt)
    if dt in _INTS:
        return np.minimum(np.maximum(x, lo), hi)
    return NotImplemented


# ----------------------------------------------------------------------------- conversions


def _float_to_int(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    # XLA: truncate toward zero, saturate at the integer range, NaN -> 0.
    info = np.iinfo(dt)
    t = np.trunc(x.astype(np.float64))
    t = np.where(np.isnan(t), 0.0, t)
    return np.clip(t, float(info.min), float(info.max)).astype(dt)


@_register(lax.convert_element_type_p)
def _convert_element_type(
    x: Any, *, new_dtype: Any, weak_type: bool = False, sharding: Any = None
) -> Any:
    x = _arr(x)
    src, dst = x.dtype, np.dtype(new_dtype)
    known = _FLOATS | _INTS_BOOL
    if src not in known or dst not in known:
        return NotImplemented
    if src == dst:
        return x
    if src in _FLOATS:
        if dst == _BOOL:
            # f32 compares with subnormals flushed; bf16 tests its raw bits.
            return (_f32(x) if src == _F32 else x.astype(_F32)) != 0
        if dst in _INTS:
            if dst.itemsize > 4:
                return NotImplemented
            return _float_to_int(x, dst)
        if src == _F32 or dst == _F32:
            return x.astype(dst)
        return x.astype(_F32).astype(dst)  # f16 <-> bf16 through f32 (exact widening)
    if dst in _FLOATS and src.itemsize > 4:
        return NotImplemented
    return x.astype(dst)


@_register(lax.bitcast_convert_type_p)
def _bitcast_convert_type(x: Any, *, new_dtype: Any) -> Any:
    x = _arr(x)
    dst = np.dtype(new_dtype)
    if x.dtype.itemsize == dst.itemsize:
        return x.view(dst)
    c = np.ascontiguousarray(x)
    if x.dtype.itemsize > dst.itemsize:
        ratio = x.dtype.itemsize // dst.itemsize
        return c.reshape(*x.shape, 1).view(dst).reshape(*x.shape, ratio)
    if x.ndim == 0:
        return NotImplemented
    return c.view(dst).reshape(x.shape[:-1])


# ----------------------------------------------------------------------------- structure


@_register(lax.iota_p)
def _iota(*dyn: Any, dtype: Any, shape: Sequence[int], dimension: int, sharding: Any = None) -> Any:
    dt = np.dtype(dtype)
    if dyn or dt not in _FLOATS | _INTS:
        return NotImplemented
    line = np.arange(shape[dimension]).astype(dt)
    view = [1] * len(shape)
    view[dimension] = shape[dimension]
    return np.broadcast_to(line.reshape(view), tuple(shape))


@_register(lax.broadcast_in_dim_p)
def _broadcast_in_dim(
    x: Any,
    *dyn: Any,
    shape: Sequence[int],
    broadcast_dimensions: Sequence[int],
    sharding: Any = None,
) -> Any:
    if dyn:
        return NotImplemented
    x = _arr(x)
    if x.dtype == _BF16 and _has_bf16_subnormal(x):
        # XLA CPU flushes bf16 subnormals in some broadcasts (depending on the shapes)
        # and keeps them in others; bind knows which.
        return NotImplemented
    view = [1] * len(shape)
    for i, d in enumerate(broadcast_dimensions):
        view[d] = x.shape[i]
    return np.broadcast_to(x.reshape(view), tuple(shape))


@_register(lax.reshape_p)
def _reshape(
    x: Any, *dyn: Any, new_sizes: Sequence[int], dimensions: Any, sharding: Any = None
) -> Any:
    if dyn or dimensions is not None:
        return NotImplemented
    return _arr(x).reshape(tuple(new_sizes))


@_register(lax.squeeze_p)
def _squeeze(x: Any, *, dimensions: Sequence[int]) -> Any:
    return np.squeeze(_arr(x), axis=tuple(dimensions))


@_register(lax.transpose_p)
def _transpose(x: Any, *, permutation: Sequence[int]) -> Any:
    return np.transpose(_arr(x), tuple(permutation))


@_register(lax.rev_p)
def _rev(x: Any, *, dimensions: Sequence[int]) -> Any:
    x = _arr(x)
    return np.flip(x, axis=tuple(dimensions)) if dimensions else x


@_register(lax.concatenate_p)
def _concatenate(*xs: Any, dimension: int) -> Any:
    return np.concatenate([_arr(x) for x in xs], axis=dimension)


@_register(lax.pad_p)
def _pad(x: Any, padding_value: Any, *, padding_config: Sequence[tuple[int, int, int]]) -> Any:
    x = _arr(x)
    grown, place, crop = [], [], []
    for n, (lo, hi, interior) in zip(x.shape, padding_config):
        inner = n + max(n - 1, 0) * interior
        size = max(lo, 0) + inner + max(hi, 0)
        grown.append(size)
        place.append(slice(max(lo, 0), max(lo, 0) + inner, interior + 1))
        crop.append(slice(max(-lo, 0), size - max(-hi, 0)))
    out = np.full(grown, _arr(padding_value), dtype=x.dtype)
    out[tuple(place)] = x
    return out[tuple(crop)]


@_register(lax.slice_p)
def _slice(
    x: Any,
    *,
    start_indices: Sequence[int],
    limit_indices: Sequence[int],
    strides: Sequence[int] | None,
) -> Any:
    steps = strides if strides is not None else (1,) * len(start_indices)
    return _arr(x)[tuple(slice(s, e, st) for s, e, st in zip(start_indices, limit_indices, steps))]


def _clamped_starts(
    shape: Sequence[int], sizes: Sequence[int], starts: Sequence[Any]
) -> tuple[slice, ...]:
    # XLA clamps each start into [0, dim - size] instead of reading out of bounds.
    out = []
    for dim, size, s in zip(shape, sizes, starts):
        start = min(max(int(s), 0), dim - size)
        out.append(slice(start, start + size))
    return tuple(out)


@_register(lax.dynamic_slice_p)
def _dynamic_slice(x: Any, *starts: Any, slice_sizes: Sequence[int]) -> Any:
    x = _arr(x)
    if len(starts) != x.ndim:
        return NotImplemented
    return x[_clamped_starts(x.shape, slice_sizes, starts)]


@_register(lax.dynamic_update_slice_p)
def _dynamic_update_slice(x: Any, update: Any, *starts: Any) -> Any:
    x, update = _arr(x), _arr(update)
    out = x.copy()
    out[_clamped_starts(x.shape, update.shape, starts)] = update
    return out


@_register(lax.tile_p)
def _tile(x: Any, *, reps: Sequence[int]) -> Any:
    x = _arr(x)
    if x.dtype == _BF16 and _has_bf16_subnormal(x):
        return NotImplemented  # flushed by XLA for some shapes, as in broadcast_in_dim
    return np.tile(x, tuple(reps))


@_register(lax.split_p)
def _split(x: Any, *, sizes: Sequence[int], axis: int) -> Any:
    cuts = np.cumsum([int(s) for s in sizes])[:-1]
    return np.split(_arr(x), cuts, axis=axis)


@_register(lax.copy_p)
def _copy(x: Any) -> Any:
    return _arr(x).copy()


@_register(lax.optimization_barrier_p)
def _optimization_barrier(*xs: Any) -> Any:
    return [_arr(x) for x in xs]


# ----------------------------------------------------------------------------- reductions


def _reduce_extreme(is_max: bool, flushed_inputs: bool = False) -> Rule:
    widen = _f32_flushed if flushed_inputs else _f32

    def rule(x: Any, *, axes: Sequence[int], out_sharding: Any = None) -> Any:
        x = _arr(x)
        axes = tuple(axes)
        if any(x.shape[a] == 0 for a in axes):
            return NotImplemented
        if x.dtype in _INTS_BOOL:
            return np.max(x, axis=axes) if is_max else np.min(x, axis=axes)
        if x.dtype not in _FLOATS:
            return NotImplemented
        f = widen(x)
        r = np.max(f, axis=axes) if is_max else np.min(f, axis=axes)
        zero = np.asarray(r == 0)
        if zero.any():
            # XLA's max ranks -0 below +0; numpy returns whichever zero it met.
            want_neg = (
                np.all(np.signbit(f) | (f != 0), axis=axes)
                if is_max
                else np.any(np.signbit(f) & (f == 0), axis=axes)
            )
            r = np.where(zero, np.where(want_neg, -_ZERO, _ZERO), r)
        return np.asarray(r).astype(x.dtype)

    return rule


_register(lax.reduce_max_p)(_reduce_extreme(True))
_register(lax.reduce_min_p)(_reduce_extreme(False))
_register(lax.reduce_max_p, table=PREFLUSHED_RULES)(_reduce_extreme(True, flushed_inputs=True))
_register(lax.reduce_min_p, table=PREFLUSHED_RULES)(_reduce_extreme(False, flushed_inputs=True))


def _reduce_arith(np_fn: Callable[..., np.ndarray], flushed_inputs: bool = False) -> Rule:
    widen = _f32_flushed if flushed_inputs else _f32

    def rule(x: Any, *, axes: Sequence[int], out_sharding: Any = None) -> Any:
        x = _arr(x)
        axes = tuple(axes)
        if x.dtype in _INTS:
            return np_fn(x, axis=axes, dtype=x.dtype)
        if x.dtype in _FLOATS:
            with np.errstate(all="ignore"):
                return _back(np_fn(widen(x), axis=axes, dtype=_F32), x.dtype)
        return NotImplemented

    return rule


_register(lax.reduce_sum_p)(_reduce_arith(np.sum))
_register(lax.reduce_prod_p)(_reduce_arith(np.prod))
_register(lax.reduce_sum_p, table=PREFLUSHED_RULES)(_reduce_arith(np.sum, flushed_inputs=True))
_register(lax.reduce_prod_p, table=PREFLUSHED_RULES)(_reduce_arith(np.prod, flushed_inputs=True))


def _reduce_bits(ufunc: np.ufunc) -> Rule:
    def rule(x: Any, *, axes: Sequence[int], out_sharding: Any = None) -> Any:
        x = _arr(x)
        if x.dtype not in _INTS_BOOL:
            return NotImplemented
        return ufunc.reduce(x, axis=tuple(axes))

    return rule


_register(lax.reduce_and_p)(_reduce_bits(np.bitwise_and))
_register(lax.reduce_or_p)(_reduce_bits(np.bitwise_or))
_register(lax.reduce_xor_p)(_reduce_bits(np.bitwise_xor))


def _arg_extreme(np_fn: Callable[..., np.ndarray]) -> Rule:
    def rule(x: Any, *, axes: Sequence[int], index_dtype: Any) -> Any:
        x = _arr(x)
        if len(axes) != 1 or x.shape[axes[0]] == 0:
            return NotImplemented
        if x.dtype in _FLOATS:
            x = _f32(x)  # NaN wins and ties go to the first index, as in numpy
        elif x.dtype not in _INTS_BOOL:
            return NotImplemented
        return np_fn(x, axis=axes[0]).astype(index_dtype)

    return rule


_register(lax.argmax_p)(_arg_extreme(np.argmax))
_register(lax.argmin_p)(_arg_extreme(np.argmin))


def _ordered_key(f: np.ndarray) -> np.ndarray:
    """int32 keys of f32 values in XLA's max order (-0 < +0); NaN handled by callers."""
    bits = f.view(np.int32)
    return bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF))


def _cumulative(kind: str) -> Rule:
    def rule(x: Any, *, axis: int, reverse: bool) -> Any:
        x = _arr(x)
        dt = x.dtype
        if dt not in _INTS and dt not in _FLOATS:
            return NotImplemented
        if reverse:
            x = np.flip(x, axis)
        if dt in _INTS:
            if kind == "sum":
                r = np.cumsum(x, axis=axis, dtype=dt)
            elif kind == "prod":
                r = np.cumprod(x, axis=axis, dtype=dt)
            else:
                r = (np.maximum if kind == "max" else np.minimum).accumulate(x, axis=axis)
        else:
            f = _f32(x)
            with np.errstate(all="ignore"):
                if kind == "sum":
                    r = _back(np.cumsum(f, axis=axis, dtype=_F32), dt)
                elif kind == "prod":
                    r = _back(np.cumprod(f, axis=axis, dtype=_F32), dt)
                else:
                    acc = (np.maximum if kind == "max" else np.minimum).accumulate
                    keys = acc(_ordered_key(np.ascontiguousarray(f)), axis=axis)
                    back = keys ^ ((keys >> 31) & np.int32(0x7FFFFFFF))
                    nan = np.logical_or.accumulate(np.isnan(f), axis=axis)
                    r = np.where(nan, np.float32(np.nan), back.view(_F32)).astype(dt)
        return np.flip(r, axis) if reverse else r

    return rule


_register(lax.cumsum_p)(_cumulative("sum"))
_register(lax.cumprod_p)(_cumulative("prod"))
_register(lax.cummax_p)(_cumulative("max"))
_register(lax.cummin_p)(_cumulative("min"))


# ----------------------------------------------------------------------------- dot_general


def _dot_general_rule(flushed_inputs: bool) -> Rule:
    widen = _f32_flushed if flushed_inputs else _f32

    def rule(
        lhs: Any,
        rhs: Any,
        *,
        dimension_numbers: Any,
        precision: Any = None,
        preferred_element_type: Any = None,
        out_sharding: Any = None,
    ) -> Any:
        return _dot_general(lhs, rhs, dimension_numbers, preferred_element_type, widen)

    return rule


def _dot_general(
    lhs: Any,
    rhs: Any,
    dimension_numbers: Any,
    preferred_element_type: Any,
    widen: Callable[[np.ndarray], np.ndarray],
) -> Any:
    lhs, rhs = _arr(lhs), _arr(rhs)
    (lc, rc), (lb, rb) = dimension_numbers
    lc, rc, lb, rb = tuple(lc), tuple(rc), tuple(lb), tuple(rb)
    if lhs.dtype != rhs.dtype:
        return NotImplemented
    out_dt = np.dtype(preferred_element_type) if preferred_element_type is not None else lhs.dtype
    if lhs.dtype in _FLOATS and out_dt in _FLOATS:
        compute: np.dtype = _F32
    elif lhs.dtype in _INTS and out_dt in _INTS:
        compute = np.dtype(np.int64 if lhs.dtype.kind == "i" else np.uint64)
    else:
        return NotImplemented
    lf = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
    rf = [d for d in range(rhs.ndim) if d not in rc and d not in rb]

    def size(a: np.ndarray, dims: Sequence[int]) -> int:
        return math.prod(a.shape[d] for d in dims)  # np.prod costs ~5 us per call

    batch = size(lhs, lb)
    a = np.transpose(lhs, (*lb, *lf, *lc)).reshape(batch, size(lhs, lf), size(lhs, lc))
    b = np.transpose(rhs, (*rb, *rc, *rf)).reshape(batch, size(rhs, rc), size(rhs, rf))
    if compute == _F32:
        a, b = widen(a), widen(b)
    else:
        a, b = a.astype(compute), b.astype(compute)
    with np.errstate(all="ignore"):
        r = np.matmul(a, b)
    shape = (*(lhs.shape[d] for d in lb), *(lhs.shape[d] for d in lf), *(rhs.shape[d] for d in rf))
    r = r.reshape(shape)
    return _back(r, out_dt) if compute == _F32 else r.astype(out_dt)


_register(lax.dot_general_p)(_dot_general_rule(flushed_inputs=False))
_register(lax.dot_general_p, table=PREFLUSHED_RULES)(_dot_general_rule(flushed_inputs=True))


# ----------------------------------------------------------------------------- known-flushed values

FLUSHING: frozenset[Primitive] = frozenset({*_ARITH, lax.div_p, lax.dot_general_p,
                                            lax.reduce_sum_p, lax.reduce_prod_p})
"""Primitives whose rule flushes every f32 result, whenever all operands are f32 and no
``accuracy`` is asked for (their rules then never return ``NotImplemented``)."""

PRESERVING: frozenset[Primitive] = frozenset({
    lax.broadcast_in_dim_p, lax.reshape_p, lax.squeeze_p, lax.transpose_p, lax.rev_p,
    lax.concatenate_p, lax.slice_p, lax.dynamic_slice_p, lax.tile_p, lax.copy_p,
    lax.neg_p, lax.abs_p, lax.select_n_p, lax.reduce_max_p, lax.reduce_min_p,
})
"""Primitives whose f32 results hold only values (or negated values) of their operands:
subnormal-free when every floating operand is an f32 value free of subnormals."""
