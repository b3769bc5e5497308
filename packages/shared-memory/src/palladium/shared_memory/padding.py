"""TPU tile padding of buffer shapes.

A TPU stores the two minor dimensions of a VMEM/HBM array in tiles of ``(8, 128)``
32-bit words; narrower dtypes pack several elements into one 32-bit word. The rules
implemented by :func:`padded_shape` are those of Mosaic's tiling inference as the TPU
interpreter's ``buffer_bounds="padded"`` applies them (``tpu_info.infer_tiling``; the
integration tests check the two agree):

* scalars (rank 0) are not padded;
* rank 1: the only dimension is rounded up to ``128 * packing`` elements
  (``packing = 4 // itemsize``), one row of lanes of packed words;
* rank >= 2: leading dimensions are not padded; the minor dimension is rounded up to
  ``tiling[1]`` (128) and the second-minor one to the sublane tile. Like Mosaic's
  tiling-factor inference, a small second-minor dimension gets a smaller tile: the tile
  starts at ``packing`` and doubles while it is smaller than both the dimension and
  ``tiling[0]`` (8). So a (20, 130) bfloat16 array pads to (24, 256), like a float32 one.

Dtypes wider than 32 bits (float64 with x64 enabled) are tiled like 32-bit ones.

The TPU generation matters only before v4: TPU v2 and v3 start the second-minor tile at
``2 * packing`` and pad rank-1 arrays to ``2 * 128 * packing`` elements. The simulator
runs on CPU and has no TPU to ask, so callers pass ``generation`` (default
:data:`GENERATION_DEFAULT`, any v4-or-newer TensorCore).

>>> import numpy as np
>>> padded_shape((3, 5), np.float32)
(4, 128)
>>> padded_shape((20, 130), np.float32)
(24, 256)
>>> padded_shape((1, 128), np.float32), padded_shape((1, 128), np.float32, generation=3)
((1, 128), (2, 128))
"""

from __future__ import annotations

import numpy as np

__all__ = ["GENERATION_DEFAULT", "TILING_DEFAULT", "padded_shape", "uninitialized_value"]

TILING_DEFAULT: tuple[int, int] = (8, 128)
"""The (sublane, lane) tile of 32-bit data on a TPU."""

GENERATION_DEFAULT: int = 5
"""The TPU generation padded for when the caller names none (tiles are the same for
every generation >= 4)."""


def _packing(dtype: np.dtype) -> int:
    return max(1, 4 // max(1, dtype.itemsize))


def padded_shape(
    shape: tuple[int, ...], dtype, tiling: tuple[int, int] = TILING_DEFAULT,
    *, generation: int = GENERATION_DEFAULT,
) -> tuple[int, ...]:
    """The tile-padded shape of an array of ``shape`` and ``dtype`` on a TPU of
    ``generation`` (see module docs)."""
    shape = tuple(int(d) for d in shape)
    if not shape:
        return ()
    packing = _packing(np.dtype(dtype))
    sublanes, lanes = tiling
    # TPU v2/v3 tiles are twice as tall at the small end (Mosaic's tiling factor).
    min_factor = 2 if generation < 4 else 1
    if len(shape) == 1:
        return (_round_up(shape[0], min_factor * lanes * packing),)
    *leading, second, minor = shape
    tile = min_factor * packing
    while tile < min(second, sublanes):
        tile *= 2
    return (*leading, _round_up(second, tile), _round_up(minor, lanes))


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def uninitialized_value(dtype: np.dtype, mode: str):
    """The fill of uninitialised memory: NaN / max int / True for ``"nan"``, else 0."""
    dtype = np.dtype(dtype)
    if mode == "zero":
        return dtype.type(0)
    if mode != "nan":
        raise ValueError(f"uninitialized must be 'nan' or 'zero', got {mode!r}")
    if dtype.kind == "b":
        return np.True_
    if dtype.kind in "iu":
        return dtype.type(np.iinfo(dtype).max)
    if dtype.kind in "fc":
        return dtype.type(np.nan)
    return _ml_dtypes_fill(dtype)


def _ml_dtypes_fill(dtype: np.dtype):
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
