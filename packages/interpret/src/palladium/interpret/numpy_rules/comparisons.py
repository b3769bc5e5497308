"""Comparisons (f32 with subnormals flushed) and selection (``select_n``, ``clamp``).

See the package docstring for the rule contract and the accuracy classes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from jax import lax

from palladium.interpret.numpy_rules.common import (
    BOOL,
    FLOATS,
    INTS,
    INTS_BOOL,
    PREFLUSHED_RULES,
    Rule,
    arr,
    back,
    f32,
    f32_flushed,
    quiet,
    register,
    same_dtype,
    xla_max,
    xla_min,
)


def _comparison(
    np_fn: Callable[[np.ndarray, np.ndarray], np.ndarray], flushed_inputs: bool = False
) -> Rule:
    widen = f32_flushed if flushed_inputs else f32

    def rule(x: Any, y: Any) -> Any:
        x, y = arr(x), arr(y)
        dt = same_dtype([x, y])
        if dt in FLOATS:
            return np_fn(widen(x), widen(y))
        if dt in INTS_BOOL:
            return np_fn(x, y)
        return NotImplemented

    return rule


COMPARISONS: dict[Any, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    lax.eq_p: np.equal,
    lax.ne_p: np.not_equal,
    lax.lt_p: np.less,
    lax.le_p: np.less_equal,
    lax.gt_p: np.greater,
    lax.ge_p: np.greater_equal,
}
"""The comparison primitives and their numpy functions (on integers and bools, and
on f32 flushed operands)."""

for _prim, _fn in COMPARISONS.items():
    register(_prim)(_comparison(_fn))
    register(_prim, table=PREFLUSHED_RULES)(_comparison(_fn, flushed_inputs=True))




@register(lax.select_n_p)
def _select_n(which: Any, *cases: Any) -> Any:
    which = arr(which)
    cs = [arr(c) for c in cases]
    if len(cs) == 1:
        return cs[0]
    if which.dtype == BOOL and len(cs) == 2:
        return np.where(which, cs[1], cs[0])
    shape = np.broadcast_shapes(which.shape, *(c.shape for c in cs))
    return np.choose(which, [np.broadcast_to(c, shape) for c in cs], mode="clip")


@register(lax.clamp_p)
def _clamp(lo: Any, x: Any, hi: Any) -> Any:
    lo, x, hi = arr(lo), arr(x), arr(hi)
    dt = same_dtype([lo, x, hi])
    if dt in FLOATS:
        with quiet():
            return back(xla_min(xla_max(f32(x), f32(lo)), f32(hi)), dt)
    if dt in INTS:
        return np.minimum(np.maximum(x, lo), hi)
    return NotImplemented
