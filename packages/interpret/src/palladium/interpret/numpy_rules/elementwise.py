"""Elementwise float and integer arithmetic: XLA CPU's f32 computation with flushing, its rewrites
(division by a scalar's reciprocal, square-and-multiply ``integer_pow``) and its integer edge cases.

See the package docstring for the rule contract and the accuracy classes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from jax import lax
from jax.extend.core import Primitive

from palladium.interpret import _jax_compat as jc
from palladium.interpret.numpy_rules.common import (
    BOOL,
    F16,
    F32,
    FLOATS,
    HALF,
    HARDWARE_FLUSHES,
    INTS,
    MIXED,
    ONE,
    PREFLUSHED_RULES,
    Rule,
    arr,
    back,
    back_flushed,
    f32,
    f32_flushed,
    flush,
    has_negative_subnormal,
    has_subnormal,
    quiet,
    register,
    same_dtype,
    xla_max,
    xla_min,
)


def _elementwise(
    float_fn: Callable[..., np.ndarray] | None,
    int_fn: Callable[..., np.ndarray] | None,
    *,
    bools: bool = False,
    flushed_inputs: bool = False,
    exact_output: bool = False,
    subnormals_to_bind: bool = False,
    ieee: bool = False,
) -> Rule:
    """An n-ary rule: floats in f32 with flushing, integers (and bools) with ``int_fn``.

    ``flushed_inputs``: the variant for f32 operands known to hold no subnormals (their
    flush is skipped); ``exact_output``: with those, ``float_fn`` returns one of its
    operands' values (max, min), so its result needs no flush either;
    ``subnormals_to_bind``: a float operand holding a subnormal is left to ``bind``;
    ``ieee``: ``float_fn`` is IEEE arithmetic alone, so where the FP environment flushes
    as XLA does (``HARDWARE_FLUSHES``) f32 operands need neither flush.
    """
    widen = f32_flushed if flushed_inputs else f32
    narrow = back_flushed if flushed_inputs and exact_output else back

    def rule(*args: Any, accuracy: Any = None, out_dtype: Any = None) -> Any:
        if accuracy is not None:
            return NotImplemented
        xs = [arr(a) for a in args]
        dt = same_dtype(xs)
        if out_dtype is not None and dt != MIXED and np.dtype(out_dtype) != dt:
            xs = [x.astype(out_dtype) for x in xs]
            dt = np.dtype(out_dtype)
        if ieee and dt == F32 and HARDWARE_FLUSHES.get():
            with quiet():  # the FP environment flushes operands and result (see the flag)
                return float_fn(*xs)  # type: ignore[misc]
        if dt in FLOATS and float_fn is not None:
            if subnormals_to_bind and any(
                has_subnormal(x) for x in xs if not (flushed_inputs and x.dtype == F32)
            ):
                return NotImplemented
            with quiet():
                return narrow(float_fn(*[widen(x) for x in xs]), dt)
        if int_fn is not None and (dt in INTS or (bools and dt == BOOL)):
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




@register(lax.pow_p)
def _pow(x: Any, y: Any) -> Any:
    x, y = arr(x), arr(y)
    dt = same_dtype([x, y])
    # XLA tests the raw inputs for the sign/integer cases but takes the log of the
    # flushed base; subnormal operands are left to bind.
    if dt not in FLOATS or has_subnormal(x) or has_subnormal(y):
        return NotImplemented
    with quiet():
        return back(np.power(x.astype(F32), y.astype(F32)), dt)



@register(lax.rem_p)
def _rem(x: Any, y: Any) -> Any:
    x, y = arr(x), arr(y)
    dt = same_dtype([x, y])
    if dt in INTS:
        return _int_rem(x, y)
    if dt in FLOATS:
        # XLA's fmod neither flushes its result nor reads subnormals consistently.
        if has_subnormal(x) or has_subnormal(y):
            return NotImplemented
        with quiet():
            return np.fmod(x.astype(F32), y.astype(F32)).astype(dt)
    return NotImplemented


def _sign(x: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(x) | (x == 0), x, np.copysign(ONE, x))


def _round_away(x: np.ndarray) -> np.ndarray:
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= HALF, t + np.copysign(ONE, x), t)


_LN2 = np.float32(np.log(2.0))


@register(lax.exp2_p)
def _exp2(x: Any, *, accuracy: Any = None) -> Any:
    x = arr(x)
    dt = x.dtype
    # XLA computes exp2(x) as exp(x * ln 2) (np.exp2 differs by up to ~70 ulp near
    # underflow). For f16/bf16 its intermediate rounding varies: left to bind.
    if accuracy is not None or dt != F32:
        return NotImplemented
    with quiet():
        return back(np.exp(f32(x) * _LN2), dt)


@register(lax.log_p)
def _log(x: Any, *, accuracy: Any = None) -> Any:
    x = arr(x)
    dt = x.dtype
    if accuracy is not None or dt not in FLOATS:
        return NotImplemented
    # XLA CPU's log of a negative subnormal is -inf in its vector loop and NaN in its
    # scalar tail: left to bind.
    if has_negative_subnormal(x):
        return NotImplemented
    f = x.astype(F32)
    # float64 log rounded once is within 1 ulp of XLA's (f32 np.log: 3 ulp).
    with quiet():
        return back(np.log(flush(f).astype(np.float64)), dt)


@register(lax.logistic_p)
def _logistic(x: Any, *, accuracy: Any = None) -> Any:
    x = arr(x)
    dt = x.dtype
    if accuracy is not None or dt not in FLOATS:
        return NotImplemented
    # XLA expands logistic into 1 / (1 + exp(-x)), rounding each step to the input type.
    with quiet():
        e = back(np.exp(-f32(x)), dt)
        d = back(ONE + f32(e), dt)
        return back(ONE / f32(d), dt)


def _rsqrt(x: np.ndarray) -> np.ndarray:
    return ONE / np.sqrt(x)


def _mul_flushed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return flush(np.multiply(a, b))


def _mul_rounded(a: np.ndarray, b: np.ndarray, *, dtype: np.dtype) -> np.ndarray:
    return f32(back(np.multiply(a, b), dtype))


def _div_rule(flushed_inputs: bool) -> Rule:
    widen = f32_flushed if flushed_inputs else f32

    def rule(x: Any, y: Any) -> Any:
        return _div(x, y, widen)

    return rule


def _div(x: Any, y: Any, widen: Callable[[np.ndarray], np.ndarray]) -> Any:
    x, y = arr(x), arr(y)
    dt = same_dtype([x, y])
    if dt in INTS:
        return _int_div(x, y)
    if dt not in FLOATS:
        return NotImplemented
    if dt == F32 and HARDWARE_FLUSHES.get():  # the FP environment flushes (see the flag)
        widen = _same
        flush_f32, back_f32 = _same, _same_of
    else:
        flush_f32, back_f32 = flush, back
    with quiet():
        fx, fy = widen(x), widen(y)
        if y.ndim == 0 and x.ndim > 0 and jc.xla_divides_by_scalar_reciprocal():
            # XLA rewrites a division by a broadcast scalar into a multiplication by its
            # reciprocal; for f16 the reciprocal is rounded to f16 first.
            recip = flush_f32(ONE / fy)
            if dt == F16:
                recip = recip.astype(F16).astype(F32)
            return back_f32(np.multiply(fx, recip), dt)
        return back_f32(np.divide(fx, fy), dt)


def _same(x: np.ndarray) -> np.ndarray:
    return x


def _same_of(r: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return r


register(lax.div_p)(_div_rule(flushed_inputs=False))
register(lax.div_p, table=PREFLUSHED_RULES)(_div_rule(flushed_inputs=True))

ARITH: dict[Primitive, tuple[Any, Any]] = {
    lax.add_p: (np.add, np.add),
    lax.sub_p: (np.subtract, np.subtract),
    lax.mul_p: (np.multiply, np.multiply),
    lax.max_p: (xla_max, np.maximum),
    lax.min_p: (xla_min, np.minimum),
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

PASS_THROUGH: frozenset[Primitive] = frozenset({
    lax.tanh_p, lax.sin_p, lax.expm1_p, lax.log1p_p,
})
"""Functions with f(x) ~ x near 0 whose XLA CPU approximation may return a subnormal
input unchanged rather than read it as zero (XLA's own code decides, not the FP
environment): a subnormal operand is left to ``bind``, and their results may hold
subnormals (so they are not in ``FLUSHING``)."""

EXACT_OUTPUT: frozenset[Primitive] = frozenset({lax.max_p, lax.min_p})
"""Functions whose float result is one of their operands' values (no flush of it needed
when the operands hold no subnormals)."""

IEEE: frozenset[Primitive] = frozenset({lax.add_p, lax.sub_p, lax.mul_p, lax.square_p})
"""Operations whose float function is IEEE arithmetic alone (see ``HARDWARE_FLUSHES``)."""

for _prim, (_ffn, _ifn) in ARITH.items():
    _defer = _prim in PASS_THROUGH
    register(_prim)(_elementwise(_ffn, _ifn, subnormals_to_bind=_defer, ieee=_prim in IEEE))
    register(_prim, table=PREFLUSHED_RULES)(
        _elementwise(_ffn, _ifn, flushed_inputs=True,
                     exact_output=_prim in EXACT_OUTPUT, subnormals_to_bind=_defer,
                     ieee=_prim in IEEE)
    )

_BITWISE: dict[Primitive, Any] = {
    lax.and_p: np.bitwise_and,
    lax.or_p: np.bitwise_or,
    lax.xor_p: np.bitwise_xor,
    lax.not_p: np.invert,
}
for _prim, _fn in _BITWISE.items():
    register(_prim)(_elementwise(None, _fn, bools=True))


def _bitwise_move(np_fn: Callable[[np.ndarray], np.ndarray]) -> Rule:
    """neg/abs: sign-bit operations on floats, no flushing, any float dtype."""

    def rule(x: Any) -> Any:
        x = arr(x)
        if x.dtype in FLOATS or x.dtype in INTS:
            return np_fn(x)
        return NotImplemented

    return rule


register(lax.neg_p)(_bitwise_move(np.negative))
register(lax.abs_p)(_bitwise_move(np.abs))


@register(lax.round_p)
def _round(x: Any, *, rounding_method: Any) -> Any:
    x = arr(x)
    if x.dtype not in FLOATS:
        return NotImplemented
    fn = np.rint if int(rounding_method) == int(lax.RoundingMethod.TO_NEAREST_EVEN) else _round_away
    return back(fn(f32(x)), x.dtype)


@register(lax.is_finite_p)
def _is_finite(x: Any) -> Any:
    x = arr(x)
    return np.isfinite(x.astype(F32)) if x.dtype in FLOATS else NotImplemented


@register(lax.nextafter_p)
def _nextafter(x: Any, y: Any) -> Any:
    x, y = arr(x), arr(y)
    if same_dtype([x, y]) != F32:
        return NotImplemented
    # XLA steps the raw bits of x, but returns y when x == y compares equal with
    # subnormals flushed.
    return np.where(f32(x) == f32(y), y, np.nextafter(x, y))


@register(lax.integer_pow_p)
def _integer_pow(x: Any, *, y: int) -> Any:
    x = arr(x)
    dt = x.dtype
    if dt in INTS:
        mul: Callable[[np.ndarray, np.ndarray], np.ndarray] = np.multiply
        base = x
    elif dt in FLOATS:
        # Every multiplication rounds to the input type, as separate XLA multiplies do.
        mul = _mul_flushed if dt == F32 else functools.partial(_mul_rounded, dtype=dt)
        base = f32(x) if y != 1 else x
    else:
        return NotImplemented
    if y == 0:
        return np.ones_like(x)
    if y == 1:
        return x
    # Square-and-multiply in the order of jax's lowering, so floats round identically.
    n, acc = abs(y), None
    with quiet():
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
            acc = flush(ONE / acc)
    return acc if dt in INTS else back(acc, dt)
