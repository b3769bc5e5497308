"""Block specs -> slices: which part of the source array a block covers.

Every block-dim kind of a ``BlockSpec.block_shape`` is handled by one rule in
:data:`_DMA_SLICE_RULES` / :data:`_WINDOW_INDEX_RULES`:

* ``int`` / ``Blocked(n)``: the index map returns a block number; the block starts at
  ``index * n``. A ragged last block (the dimension is not a multiple of ``n``) is
  copied with its size rounded up to the TPU tile, not the full block.
* ``Element(n)``: the index map returns an element offset; ``n`` elements from there,
  clamped at the end of the dimension and rounded up to the tile.
* ``BoundedSlice(n)``: the index map returns ``pl.ds(start, size)`` with ``size <= n``.
* ``None`` / ``Squeezed()``: the dimension is indexed by a scalar and dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline.errors import PipelineConfigError
from palladium.pipeline.grid import align_to, cdiv

ds = jc.ds

_SQUEEZED_KINDS: tuple[type, ...] = (jc.Squeezed,)
_INDIRECT_KINDS: tuple[type, ...] = (jc.Indirect,) if jc.Indirect is not None else ()


def is_squeezed(dim) -> bool:
    """Whether a block dim is dropped from the block (``None`` or ``Squeezed()``)."""
    return dim is None or isinstance(dim, _SQUEEZED_KINDS)


def block_size(dim) -> int:
    """The number of elements a block dim spans (1 for squeezed dims)."""
    if isinstance(dim, int):
        return dim
    if is_squeezed(dim):
        return 1
    return int(dim.block_size)


def window_shape(spec) -> tuple[int, ...]:
    """The shape of one block in the buffer: squeezed dims dropped."""
    if spec.block_shape is None:
        raise PipelineConfigError(f"Block shape must be specified for {spec}.")
    return tuple(block_size(d) for d in spec.block_shape if not is_squeezed(d))


def _blocked_slice(index, size: int, dim_size: int, tile: int | None):
    start = size * index
    remainder = dim_size % size
    if remainder == 0:
        return ds(start, size)
    if tile is None:
        raise PipelineConfigError(
            f"block size {size} must divide the dimension size {dim_size} when the"
            " tiling is unknown"
        )
    if size % tile != 0:
        raise PipelineConfigError(f"Block size must divide tiling: {size=}, {tile=}")
    is_last = index == cdiv(dim_size, size) - 1
    rounded = jnp.where(is_last, jnp.int32(align_to(remainder, tile)), jnp.int32(size))
    return ds(start, jc.multiple_of(rounded, tile))


def _bounded_slice(start, length, size: int, dim_size: int, tile: int | None):
    # The slice is at most one block long and its start is tile-aligned by
    # construction; past the end of the dimension it is clamped, then rounded up.
    if tile is not None and size % tile != 0:
        raise PipelineConfigError(f"Block size must divide tiling: {size=}, {tile=}")
    if tile is None:
        return ds(start, length)
    out_of_bounds = start + length > dim_size
    clamped = jnp.where(out_of_bounds, jnp.int32(dim_size - start), jnp.int32(length))
    return ds(start, jc.multiple_of(align_to(clamped, tile), tile))


def _dma_blocked(dim, index, dim_size, tile):
    return _blocked_slice(index, block_size(dim), dim_size, tile)


def _dma_element(dim, index, dim_size, tile):
    return _bounded_slice(index, dim.block_size, dim.block_size, dim_size, tile)


def _dma_bounded(dim, index, dim_size, tile):
    if not isinstance(index, jc.Slice):
        raise PipelineConfigError(
            "Must return a ds from the index_map for a BoundedSlice dimension."
        )
    return _bounded_slice(index.start, index.size, dim.block_size, dim_size, tile)


def _dma_passthrough(dim, index, dim_size, tile):
    return index


def _window_blocked(dim, index):
    size = block_size(dim)
    return ds(index * size, size)


def _window_element(dim, index):
    if tuple(dim.padding) != (0, 0):
        raise PipelineConfigError(f"Element with padding={dim.padding} is not supported.")
    return ds(index, dim.block_size)


def _window_bounded(dim, index):
    return ds(index.start, dim.block_size)


def _window_passthrough(dim, index):
    return index


_DMA_SLICE_RULES: dict[type, Any] = {
    int: _dma_blocked,
    jc.Blocked: _dma_blocked,
    jc.Element: _dma_element,
    jc.BoundedSlice: _dma_bounded,
    type(None): _dma_passthrough,
    jc.Squeezed: _dma_passthrough,
}
_WINDOW_INDEX_RULES: dict[type, Any] = {
    int: _window_blocked,
    jc.Blocked: _window_blocked,
    jc.Element: _window_element,
    jc.BoundedSlice: _window_bounded,
    type(None): _window_passthrough,
    jc.Squeezed: _window_passthrough,
}
for _kind in _INDIRECT_KINDS:
    _DMA_SLICE_RULES[_kind] = _dma_passthrough


def _rule(table: dict[type, Any], dim):
    for kind in type(dim).__mro__:
        if kind in table and not (kind is int and isinstance(dim, bool)):
            return table[kind]
    raise PipelineConfigError(f"Unsupported block dimension type: {dim!r}")


def dma_slices(block_shape: Sequence, block_indices: Sequence, src_shape, tiles) -> tuple:
    """The indexer of the source array covered by a block (tile-rounded when ragged)."""
    return tuple(
        _rule(_DMA_SLICE_RULES, dim)(dim, idx, size, tile)
        for dim, idx, size, tile in zip(block_shape, block_indices, src_shape, tiles,
                                        strict=True)
    )


def window_slices(block_shape: Sequence, dma: Sequence) -> tuple:
    """The part of a window buffer a (possibly tile-rounded) DMA fills."""
    return tuple(
        ds(0, s.size) for s, dim in zip(dma, block_shape, strict=True) if not is_squeezed(dim)
    )


def block_indexer(block_shape: Sequence, block_indices: Sequence) -> tuple:
    """The indexer of a full block, used to alias a ref already in the right memory."""
    if len(block_shape) != len(block_indices):
        raise PipelineConfigError(
            f"index_map returned {len(block_indices)} indices for a block of rank"
            f" {len(block_shape)}"
        )
    return tuple(_rule(_WINDOW_INDEX_RULES, dim)(dim, idx)
                 for dim, idx in zip(block_shape, block_indices, strict=True))


def has_trivial_windowing(spec, grid, full_shape) -> bool:
    """Whether a spec always selects the whole array, so the pipeline copies it once.

    True when every block dim spans its full dimension and the index map does not
    depend on any grid axis whose size is not 1.
    """
    if spec is None or spec.block_shape is None:
        return True
    windowed = _SQUEEZED_KINDS + _INDIRECT_KINDS + (jc.BoundedSlice, jc.Element)
    for dim, size in zip(spec.block_shape, full_shape, strict=True):
        if dim is None or isinstance(dim, windowed) or block_size(dim) != size:
            return False
    if spec.index_map is None:
        return True
    moving = {i for i, g in enumerate(grid) if not isinstance(g, int) or g != 1}
    if not moving:
        return True
    dummy_grid = tuple(g if isinstance(g, int) else 2 for g in grid)
    with jc.tracing_grid_env(dummy_grid, ()):
        closed = jax.make_jaxpr(spec.index_map)(*[jnp.int32(0)] * len(grid))
    jaxpr = closed.jaxpr
    # A ref read by the index map may change while the pipeline runs.
    if any(isinstance(v.aval, jc.AbstractRef) for v in jaxpr.constvars):
        return False
    moving_vars = {id(jaxpr.invars[i]) for i in moving}
    used = [id(v) for v in jaxpr.outvars]
    used += [id(v) for eqn in jaxpr.eqns for v in eqn.invars]
    return not any(u in moving_vars for u in used)
