"""Dtype conversions: ``convert_element_type`` (float -> int truncates and saturates, NaN -> 0)
and ``bitcast_convert_type``.

See the package docstring for the rule contract and the accuracy classes."""

from __future__ import annotations

from typing import Any

import numpy as np
from jax import lax

from palladium.interpret.numpy_rules.common import (
    BOOL,
    F32,
    FLOATS,
    INTS,
    INTS_BOOL,
    arr,
    f32,
    is_nonzero,
    register,
)


def _float_to_int(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    # XLA: truncate toward zero, saturate at the integer range, NaN -> 0.
    info = np.iinfo(dt)
    t = np.trunc(x.astype(np.float64))
    t = np.where(np.isnan(t), 0.0, t)
    return np.clip(t, float(info.min), float(info.max)).astype(dt)


@register(lax.convert_element_type_p)
def _convert_element_type(
    x: Any, *, new_dtype: Any, weak_type: bool = False, sharding: Any = None
) -> Any:
    x = arr(x)
    src, dst = x.dtype, np.dtype(new_dtype)
    known = FLOATS | INTS_BOOL
    if src not in known or dst not in known:
        return NotImplemented
    if src == dst:
        return x
    if src in FLOATS:
        if dst == BOOL:
            # f32 compares with subnormals flushed; bf16 tests its raw bits.
            return f32(x) != 0 if src == F32 else is_nonzero(x)
        if dst in INTS:
            if dst.itemsize > 4:
                return NotImplemented
            return _float_to_int(x, dst)
        if src == F32 or dst == F32:
            return x.astype(dst)
        return x.astype(F32).astype(dst)  # f16 <-> bf16 through f32 (exact widening)
    if dst in FLOATS and src.itemsize > 4:
        return NotImplemented
    return x.astype(dst)


@register(lax.bitcast_convert_type_p)
def _bitcast_convert_type(x: Any, *, new_dtype: Any) -> Any:
    x = arr(x)
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
