"""The TPU facts the simulator needs, as plain data: tiles, packing, padding, fills.

This is the one home of these facts for the jax-free packages. They are Mosaic's, as
jax states them in ``jax._src.pallas.mosaic.tpu_info`` (``infer_tiling``); the
integration tests check every dtype a kernel can hold on every generation jax models
against it (``integration_tests/test_tpu_facts_match_jax.py``). The chip table (VMEM
capacity, cores, bandwidth, ...) is ``palladium.interpret.chip``, read from jax.

A TPU stores the two minor dimensions of an array in tiles of ``(8, 128)`` 32-bit
words; narrower dtypes pack several elements into one word (:func:`packing`). The tile
padding of :func:`padded_shape`:

* scalars (rank 0) are not padded;
* rank 1: the only dimension is rounded up to ``128 * packing`` elements (twice that
  before TPU v4), one row of lanes of packed words;
* rank >= 2: leading dimensions are not padded; the minor dimension is rounded up to
  128 lanes and the second-minor one to the sublane tile. Like Mosaic's tiling-factor
  inference, a small second-minor dimension gets a smaller tile: the tile starts at
  ``packing`` (``2 * packing`` before v4) and doubles while it is smaller than both the
  dimension and 8. So a (20, 130) bfloat16 array pads to (24, 256), like a float32 one.

Dtypes wider than 32 bits (float64 with x64 enabled) are tiled like 32-bit ones. Only
generations before 4 pad differently; the simulator runs on CPU and has no TPU to ask,
so callers pass ``generation`` (default :data:`GENERATION_DEFAULT`).

>>> import numpy as np, ml_dtypes
>>> padded_shape((3, 5), np.float32)
(4, 128)
>>> padded_shape((20, 130), np.float32)
(24, 256)
>>> padded_shape((1, 128), np.float32), padded_shape((1, 128), np.float32, generation=3)
((1, 128), (2, 128))
>>> packing(ml_dtypes.int4), padded_shape((3, 128), ml_dtypes.int4)
(8, (8, 128))
>>> [int(uninitialized_value(t, "nan")) for t in (np.int8, ml_dtypes.int4, ml_dtypes.uint4)]
[127, 7, 15]
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from palladium.race_detect import ConfigError

__all__ = [
    "GENERATIONS",
    "GENERATION_DEFAULT",
    "LANES",
    "SUBLANES",
    "TILING_DEFAULT",
    "packing",
    "padded_shape",
    "tile_shape",
    "uninitialized_value",
]

LANES: int = 128
"""Lanes of a vector register: the minor-dimension tile of every dtype."""

SUBLANES: int = 8
"""Sublanes of a vector register: the second-minor tile of 32-bit data."""

TILING_DEFAULT: tuple[int, int] = (SUBLANES, LANES)
"""The (sublane, lane) tile of 32-bit data on a TPU."""

GENERATIONS: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8)
"""The TensorCore generations whose tiles these facts describe (v2 .. TPU8i)."""

GENERATION_DEFAULT: int = 5
"""The TPU generation padded for when the caller names none (tiles are the same for
every generation >= 4)."""

# Mosaic's tiling inference packs only int4 by its bit width; every other dtype of one
# byte or less (uint4, int2, float4, bool ...) packs 4 // itemsize = 4 per word, as jax's
# ``tpu_info.infer_tiling`` says (the integration test holds us to it).
_PACKED_BY_BITS = frozenset({"int4"})


def packing(dtype: Any) -> int:
    """Elements of ``dtype`` per 32-bit word in a TPU tile (1 for 32 bits and wider)."""
    try:
        return _packing(dtype)  # (a dtype's name costs ~5 us: memory counts ask per value)
    except TypeError:  # an unhashable dtype-like: not kept
        return _packing.__wrapped__(dtype)


@functools.lru_cache(maxsize=256)
def _packing(dtype: Any) -> int:
    dt = np.dtype(dtype)
    return 8 if dt.name in _PACKED_BY_BITS else max(1, 4 // max(1, dt.itemsize))


def _min_tile_factor(generation: int) -> int:
    # TPU v2/v3 tiles are twice as tall at the small end (Mosaic's tiling factor).
    return 2 if generation < 4 else 1


def tile_shape(
    shape: tuple[int, ...], dtype: Any, tiling: tuple[int, int] = TILING_DEFAULT,
    *, generation: int = GENERATION_DEFAULT,
) -> tuple[int, ...]:
    """The tile of every dimension of an array of ``shape`` and ``dtype``: 1 for the
    leading dimensions, the sublane and lane tiles for the two minor ones (rank 1: one
    row of lanes of packed words). Rank 0 has no tile: ``()``."""
    if not shape:
        return ()
    pack = packing(dtype)
    sublanes, lanes = tiling
    factor = _min_tile_factor(generation)
    if len(shape) == 1:
        return (factor * lanes * pack,)
    second = int(shape[-2])
    tile = factor * pack
    while tile < min(second, sublanes):
        tile *= 2
    return (*(1,) * (len(shape) - 2), tile, lanes)


def padded_shape(
    shape: tuple[int, ...], dtype: Any, tiling: tuple[int, int] = TILING_DEFAULT,
    *, generation: int = GENERATION_DEFAULT,
) -> tuple[int, ...]:
    """The tile-padded shape of an array of ``shape`` and ``dtype`` on a TPU of
    ``generation`` (see the module docs)."""
    dims = tuple(int(d) for d in shape)
    tiles = tile_shape(dims, dtype, tiling, generation=generation)
    return tuple(-(-d // t) * t for d, t in zip(dims, tiles))


def uninitialized_value(dtype: Any, mode: str) -> Any:
    """The fill of uninitialised memory of ``dtype``: for ``mode="nan"`` NaN for floats
    (a float type without NaN: what NaN converts to), the maximum for integers
    (int4, uint4 ... included), True for bool; for ``"zero"`` 0."""
    dt = np.dtype(dtype)
    if mode == "zero":
        return dt.type(0)
    if mode != "nan":
        raise ConfigError(f"uninitialized must be 'nan' or 'zero', got {mode!r}")
    if dt.kind == "b":
        return np.True_
    if dt.kind in "iu":
        return dt.type(np.iinfo(dt).max)
    if dt.kind in "fc":
        return dt.type(np.nan)
    return _ml_dtypes_fill(dt)


def _ml_dtypes_fill(dtype: np.dtype) -> Any:
    # ml_dtypes' types (bfloat16, float8_*, int4) have kind "V": ask ml_dtypes.
    import ml_dtypes

    try:
        ml_dtypes.finfo(dtype)
        return dtype.type(np.nan)
    except (ValueError, TypeError):
        pass
    try:
        return dtype.type(ml_dtypes.iinfo(dtype).max)
    except (ValueError, TypeError):
        return dtype.type(0)
