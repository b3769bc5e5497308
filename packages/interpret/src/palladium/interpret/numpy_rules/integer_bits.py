"""Integer bit operations: shifts with XLA's out-of-range amounts, population count, clz, mulhi.

See the package docstring for the rule contract and the accuracy classes."""

from __future__ import annotations

from typing import Any

import numpy as np
from jax import lax

from palladium.interpret import _jax_compat as jc
from palladium.interpret.numpy_rules.common import (
    INTS,
    SMALL_INTS,
    Rule,
    arr,
    register,
    same_dtype,
)


def _unsigned(dt: np.dtype) -> np.dtype:
    return np.dtype(f"u{dt.itemsize}")


def _shift(kind: str) -> Rule:
    def rule(x: Any, y: Any) -> Any:
        x, y = arr(x), arr(y)
        dt = same_dtype([x, y])
        if dt not in INTS:
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


register(lax.shift_left_p)(_shift("left"))
register(lax.shift_right_logical_p)(_shift("logical"))
register(lax.shift_right_arithmetic_p)(_shift("arithmetic"))


@register(lax.population_count_p)
def _population_count(x: Any) -> Any:
    x = arr(x)
    if x.dtype not in INTS:
        return NotImplemented
    return np.bitwise_count(x.astype(_unsigned(x.dtype))).astype(x.dtype)


@register(lax.clz_p)
def _clz(x: Any) -> Any:
    x = arr(x)
    if x.dtype not in SMALL_INTS:
        return NotImplemented
    # frexp's exponent of a float64 is the bit length of an integer below 2**53.
    _, bit_length = np.frexp(x.astype(_unsigned(x.dtype)).astype(np.float64))
    return (x.dtype.itemsize * 8 - bit_length).astype(x.dtype)


@register(jc.mulhi_p)
def _mulhi(x: Any, y: Any) -> Any:
    x, y = arr(x), arr(y)
    dt = same_dtype([x, y])
    if dt not in SMALL_INTS:
        return NotImplemented
    wide = np.int64 if dt.kind == "i" else np.uint64
    return ((x.astype(wide) * y.astype(wide)) >> (dt.itemsize * 8)).astype(dt)
