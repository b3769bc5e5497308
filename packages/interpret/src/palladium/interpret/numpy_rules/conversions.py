"""Dtype conversions: ``convert_element_type`` (float -> int truncates and saturates, NaN -> 0)
and ``bitcast_convert_type``.

See the package docstring for the rule contract and the accuracy classes."""

from __future__ import annotations

from typing import Any

import numpy as np
from jax import lax

from palladium.interpret.numpy_rules.common import (
    BF16,
    BOOL,
    F16,
    F32,
    FLOATS,
    INTS,
    INTS_BOOL,
    arr,
    f32,
    has_subnormal_f32,
    is_nonzero,
    register,
)

_F16_TINY = np.float32(np.finfo(np.float16).tiny)


def _cpu_dependent(x: np.ndarray, src: np.dtype, dst: np.dtype) -> bool:
    """Whether XLA CPU's result for this float -> float conversion depends on the CPU.

    The hardware conversions to and from the narrow types treat subnormals differently:
    x86's AVX512_BF16 ``vcvtneps2bf16`` always flushes them (other x86 CPUs convert in
    integer code and keep them), and arm64's ``bfcvt`` / ``fcvt`` follow the FPCR flush
    bits XLA sets. Measured on x86 (AVX, AVX2, AVX512_BF16) these conversions keep
    subnormals, but the rules cannot know every CPU: such inputs are left to ``bind``.
    (bf16 -> f32 is a bit shift everywhere, and f32 subnormals never reach f16's range.)
    """
    if src == F32 and dst == BF16:
        return has_subnormal_f32(x)
    if src == F32 and dst == F16:  # results that are f16 subnormals
        a = np.abs(x)
        return bool(((a < _F16_TINY) & (a >= np.float32(2.0**-25))).any())
    if src == F16:  # f16 subnormal inputs
        a = np.abs(x)
        return bool(((a < np.float16(np.finfo(np.float16).tiny)) & (a > 0)).any())
    return False


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
        if dst in FLOATS and _cpu_dependent(x, src, dst):
            return NotImplemented
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
