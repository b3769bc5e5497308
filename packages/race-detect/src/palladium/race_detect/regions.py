"""Regions of a buffer: tuples of ``int | slice`` (any step), ``None``, and masks."""

from __future__ import annotations

from typing import Any

import numpy as np

from palladium.race_detect.errors import RegionError

Region = tuple[Any, ...]


def normalise(region: Any, shape: tuple[int, ...], buffer: str) -> Region:
    """Validate ``region`` against ``shape`` and pad it to one index per dimension.

    ``None`` is the whole buffer; a bare int or slice is a 1-tuple; missing trailing
    dimensions are full slices. Ints may be negative (Python semantics).
    """
    if region is None:
        region = ()
    elif not isinstance(region, tuple):
        region = (region,)
    if len(region) > len(shape):
        raise RegionError(
            f"buffer {buffer!r} of shape {shape}: region {format_region(region)} has "
            f"{len(region)} indices for {len(shape)} dimensions"
        )
    for axis, (index, dim) in enumerate(zip(region, shape)):
        if isinstance(index, slice):
            if index.step == 0:
                raise RegionError(f"buffer {buffer!r}: slice step cannot be zero (axis {axis})")
            continue
        if isinstance(index, bool | np.bool_) or not isinstance(index, int | np.integer):
            raise RegionError(
                f"buffer {buffer!r}: region index {index!r} on axis {axis} is not an int or a slice"
            )
        if not -dim <= index < dim:
            raise RegionError(
                f"buffer {buffer!r} of shape {shape}: index {int(index)} is out of "
                f"bounds on axis {axis} (size {dim})"
            )
    if len(region) < len(shape):
        region = region + (slice(None),) * (len(shape) - len(region))
    return region


def region_shape(region: Region, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of ``buffer[region]`` (ints drop their dimension)."""
    return tuple(
        len(range(*index.indices(dim)))
        for index, dim in zip(region, shape)
        if isinstance(index, slice)
    )


def check_mask(mask: Any, region: Region, shape: tuple[int, ...], buffer: str) -> np.ndarray:
    """``mask`` as a boolean array of the region's shape (or a ``RegionError``)."""
    array = np.asarray(mask)
    expected = region_shape(region, shape)
    if array.dtype != np.bool_ or array.shape != expected:
        raise RegionError(
            f"buffer {buffer!r}: mask of dtype {array.dtype} and shape {array.shape} "
            f"does not match region {format_region(region)} (a boolean array of shape "
            f"{expected} is needed)"
        )
    return array


def flat_elements(region: Region, shape: tuple[int, ...], mask: np.ndarray | None) -> np.ndarray:
    """The flat (C-order) element numbers of ``buffer[region][mask]``, in region order."""
    grid = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)
    selected = grid[region]
    if mask is not None:
        selected = selected[mask]
    return np.ravel(selected)


def element_at(
    region: Region, shape: tuple[int, ...], mask: np.ndarray | None, position: int
) -> tuple[int, ...]:
    """The buffer index of the ``position``-th element of ``buffer[region][mask]``.

    Costs O(number of dimensions) (plus O(mask) with a mask), not O(buffer size).
    """
    if mask is not None:
        position = int(np.flatnonzero(mask)[position])
    inner = np.unravel_index(position, region_shape(region, shape)) if shape else ()
    axes = iter(int(i) for i in inner)
    index = []
    for item, dim in zip(region, shape):
        if isinstance(item, slice):
            start, _, step = item.indices(dim)
            index.append(start + next(axes) * step)
        else:
            index.append(int(item) % dim)
    return tuple(index)


def _format_index(index: Any) -> str:
    if not isinstance(index, slice):
        return str(int(index)) if isinstance(index, int | np.integer) else repr(index)
    text = ("" if index.start is None else str(index.start)) + ":"
    text += "" if index.stop is None else str(index.stop)
    if index.step is not None and index.step != 1:  # a unit step says nothing
        text += f":{index.step}"
    return text


def format_region(region: Region) -> str:
    """``region`` in indexing syntax: ``[0:8, ::2]`` (``[...]`` for a 0-d buffer)."""
    if not region:
        return "[...]"
    return "[" + ", ".join(_format_index(i) for i in region) + "]"
