"""Structural operations that move values without arithmetic (broadcast, reshape, slices, pad, ...).

See the package docstring for the rule contract and the accuracy classes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from jax import lax

from palladium.interpret.numpy_rules.common import (
    BF16,
    FLOATS,
    INTS,
    arr,
    has_bf16_subnormal,
    register,
)


@register(lax.iota_p)
def _iota(*dyn: Any, dtype: Any, shape: Sequence[int], dimension: int, sharding: Any = None) -> Any:
    dt = np.dtype(dtype)
    if dyn or dt not in FLOATS | INTS:
        return NotImplemented
    line = np.arange(shape[dimension]).astype(dt)
    view = [1] * len(shape)
    view[dimension] = shape[dimension]
    return np.broadcast_to(line.reshape(view), tuple(shape))


@register(lax.broadcast_in_dim_p)
def _broadcast_in_dim(
    x: Any,
    *dyn: Any,
    shape: Sequence[int],
    broadcast_dimensions: Sequence[int],
    sharding: Any = None,
) -> Any:
    if dyn:
        return NotImplemented
    x = arr(x)
    if x.dtype == BF16 and has_bf16_subnormal(x):
        # Some broadcasts go through f32 in XLA CPU: on AVX512_BF16 CPUs the conversion
        # back flushes bf16 subnormals, elsewhere it keeps them; bind knows which.
        return NotImplemented
    view = [1] * len(shape)
    for i, d in enumerate(broadcast_dimensions):
        view[d] = x.shape[i]
    return np.broadcast_to(x.reshape(view), tuple(shape))


@register(lax.reshape_p)
def _reshape(
    x: Any, *dyn: Any, new_sizes: Sequence[int], dimensions: Any, sharding: Any = None
) -> Any:
    if dyn or dimensions is not None:
        return NotImplemented
    return arr(x).reshape(tuple(new_sizes))


@register(lax.squeeze_p)
def _squeeze(x: Any, *, dimensions: Sequence[int]) -> Any:
    return np.squeeze(arr(x), axis=tuple(dimensions))


@register(lax.transpose_p)
def _transpose(x: Any, *, permutation: Sequence[int]) -> Any:
    return np.transpose(arr(x), tuple(permutation))


@register(lax.rev_p)
def _rev(x: Any, *, dimensions: Sequence[int]) -> Any:
    x = arr(x)
    return np.flip(x, axis=tuple(dimensions)) if dimensions else x


@register(lax.concatenate_p)
def _concatenate(*xs: Any, dimension: int) -> Any:
    return np.concatenate([arr(x) for x in xs], axis=dimension)


@register(lax.pad_p)
def _pad(x: Any, padding_value: Any, *, padding_config: Sequence[tuple[int, int, int]]) -> Any:
    x = arr(x)
    grown, place, crop = [], [], []
    for n, (lo, hi, interior) in zip(x.shape, padding_config):
        inner = n + max(n - 1, 0) * interior
        size = max(lo, 0) + inner + max(hi, 0)
        grown.append(size)
        place.append(slice(max(lo, 0), max(lo, 0) + inner, interior + 1))
        crop.append(slice(max(-lo, 0), size - max(-hi, 0)))
    out = np.full(grown, arr(padding_value), dtype=x.dtype)
    out[tuple(place)] = x
    return out[tuple(crop)]


@register(lax.slice_p)
def _slice(
    x: Any,
    *,
    start_indices: Sequence[int],
    limit_indices: Sequence[int],
    strides: Sequence[int] | None,
) -> Any:
    steps = strides if strides is not None else (1,) * len(start_indices)
    return arr(x)[tuple(slice(s, e, st) for s, e, st in zip(start_indices, limit_indices, steps))]


def _clamped_starts(
    shape: Sequence[int], sizes: Sequence[int], starts: Sequence[Any]
) -> tuple[slice, ...]:
    # XLA clamps each start into [0, dim - size] instead of reading out of bounds.
    out = []
    for dim, size, s in zip(shape, sizes, starts):
        start = min(max(int(s), 0), dim - size)
        out.append(slice(start, start + size))
    return tuple(out)


@register(lax.dynamic_slice_p)
def _dynamic_slice(x: Any, *starts: Any, slice_sizes: Sequence[int]) -> Any:
    x = arr(x)
    if len(starts) != x.ndim:
        return NotImplemented
    return x[_clamped_starts(x.shape, slice_sizes, starts)]


@register(lax.dynamic_update_slice_p)
def _dynamic_update_slice(x: Any, update: Any, *starts: Any) -> Any:
    x, update = arr(x), arr(update)
    out = x.copy()
    out[_clamped_starts(x.shape, update.shape, starts)] = update
    return out


@register(lax.tile_p)
def _tile(x: Any, *, reps: Sequence[int]) -> Any:
    x = arr(x)
    if x.dtype == BF16 and has_bf16_subnormal(x):
        return NotImplemented  # CPU-dependent, as in broadcast_in_dim
    return np.tile(x, tuple(reps))


@register(lax.split_p)
def _split(x: Any, *, sizes: Sequence[int], axis: int) -> Any:
    cuts = np.cumsum([int(s) for s in sizes])[:-1]
    return np.split(arr(x), cuts, axis=axis)


@register(lax.copy_p)
def _copy(x: Any) -> Any:
    return arr(x).copy()


@register(lax.optimization_barrier_p)
def _optimization_barrier(*xs: Any) -> Any:
    return [arr(x) for x in xs]
