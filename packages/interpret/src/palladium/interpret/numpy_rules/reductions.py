"""Reductions and cumulative operations (XLA's -0 < +0 order for max/min, f32 accumulation).

See the package docstring for the rule contract and the accuracy classes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax import lax

from palladium.interpret.numpy_rules.common import (
    F32,
    FLOATS,
    HARDWARE_FLUSHES,
    INTS,
    INTS_BOOL,
    PREFLUSHED_RULES,
    ZERO,
    Rule,
    arr,
    back,
    f32,
    f32_flushed,
    quiet,
    register,
)


def _reduce_extreme(is_max: bool, flushed_inputs: bool = False) -> Rule:
    widen = f32_flushed if flushed_inputs else f32

    def rule(x: Any, *, axes: Sequence[int], out_sharding: Any = None) -> Any:
        x = arr(x)
        axes = tuple(axes)
        if any(x.shape[a] == 0 for a in axes):
            return NotImplemented
        if x.dtype in INTS_BOOL:
            return np.max(x, axis=axes) if is_max else np.min(x, axis=axes)
        if x.dtype not in FLOATS:
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
            r = np.where(zero, np.where(want_neg, -ZERO, ZERO), r)
        return np.asarray(r).astype(x.dtype)

    return rule


register(lax.reduce_max_p)(_reduce_extreme(True))
register(lax.reduce_min_p)(_reduce_extreme(False))
register(lax.reduce_max_p, table=PREFLUSHED_RULES)(_reduce_extreme(True, flushed_inputs=True))
register(lax.reduce_min_p, table=PREFLUSHED_RULES)(_reduce_extreme(False, flushed_inputs=True))


def _reduce_arith(np_fn: Callable[..., np.ndarray], flushed_inputs: bool = False) -> Rule:
    widen = f32_flushed if flushed_inputs else f32

    def rule(x: Any, *, axes: Sequence[int], out_sharding: Any = None) -> Any:
        x = arr(x)
        axes = tuple(axes)
        if x.dtype in INTS:
            return np_fn(x, axis=axes, dtype=x.dtype)
        if x.dtype == F32 and HARDWARE_FLUSHES.get():  # IEEE sums: flushed (see the flag)
            with quiet():
                return np_fn(x, axis=axes, dtype=F32)
        if x.dtype in FLOATS:
            with quiet():
                return back(np_fn(widen(x), axis=axes, dtype=F32), x.dtype)
        return NotImplemented

    return rule


register(lax.reduce_sum_p)(_reduce_arith(np.sum))
register(lax.reduce_prod_p)(_reduce_arith(np.prod))
register(lax.reduce_sum_p, table=PREFLUSHED_RULES)(_reduce_arith(np.sum, flushed_inputs=True))
register(lax.reduce_prod_p, table=PREFLUSHED_RULES)(_reduce_arith(np.prod, flushed_inputs=True))


def _reduce_bits(ufunc: np.ufunc) -> Rule:
    def rule(x: Any, *, axes: Sequence[int], out_sharding: Any = None) -> Any:
        x = arr(x)
        if x.dtype not in INTS_BOOL:
            return NotImplemented
        return ufunc.reduce(x, axis=tuple(axes))

    return rule


register(lax.reduce_and_p)(_reduce_bits(np.bitwise_and))
register(lax.reduce_or_p)(_reduce_bits(np.bitwise_or))
register(lax.reduce_xor_p)(_reduce_bits(np.bitwise_xor))


def _arg_extreme(np_fn: Callable[..., np.ndarray]) -> Rule:
    def rule(x: Any, *, axes: Sequence[int], index_dtype: Any) -> Any:
        x = arr(x)
        if len(axes) != 1 or x.shape[axes[0]] == 0:
            return NotImplemented
        if x.dtype in FLOATS:
            x = f32(x)  # NaN wins and ties go to the first index, as in numpy
        elif x.dtype not in INTS_BOOL:
            return NotImplemented
        return np_fn(x, axis=axes[0]).astype(index_dtype)

    return rule


register(lax.argmax_p)(_arg_extreme(np.argmax))
register(lax.argmin_p)(_arg_extreme(np.argmin))


def _ordered_key(f: np.ndarray) -> np.ndarray:
    """int32 keys of f32 values in XLA's max order (-0 < +0); NaN handled by callers."""
    bits = f.view(np.int32)
    return bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF))


def _cumulative(kind: str) -> Rule:
    def rule(x: Any, *, axis: int, reverse: bool) -> Any:
        x = arr(x)
        dt = x.dtype
        if dt not in INTS and dt not in FLOATS:
            return NotImplemented
        if reverse:
            x = np.flip(x, axis)
        if dt in INTS:
            if kind == "sum":
                r = np.cumsum(x, axis=axis, dtype=dt)
            elif kind == "prod":
                r = np.cumprod(x, axis=axis, dtype=dt)
            else:
                r = (np.maximum if kind == "max" else np.minimum).accumulate(x, axis=axis)
        else:
            f = f32(x)
            with quiet():
                if kind == "sum":
                    r = back(np.cumsum(f, axis=axis, dtype=F32), dt)
                elif kind == "prod":
                    r = back(np.cumprod(f, axis=axis, dtype=F32), dt)
                else:
                    acc = (np.maximum if kind == "max" else np.minimum).accumulate
                    keys = acc(_ordered_key(np.ascontiguousarray(f)), axis=axis)
                    unkeyed = keys ^ ((keys >> 31) & np.int32(0x7FFFFFFF))
                    nan = np.logical_or.accumulate(np.isnan(f), axis=axis)
                    r = np.where(nan, np.float32(np.nan), unkeyed.view(F32)).astype(dt)
        return np.flip(r, axis) if reverse else r

    return rule


register(lax.cumsum_p)(_cumulative("sum"))
register(lax.cumprod_p)(_cumulative("prod"))
register(lax.cummax_p)(_cumulative("max"))
register(lax.cummin_p)(_cumulative("min"))
