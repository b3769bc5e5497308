"""The structure of a DMA equation's operand tree, as palladium's DMA rules read it: part
of ``palladium.interpret._jax_compat`` (every ``jax._src`` name palladium uses),
re-exported there."""

from __future__ import annotations

import inspect
from typing import Any

from jax._src.pallas.mosaic import primitives as mosaic_primitives
from jax._src.state import indexing
from jax._src.state import types as state_types

__all__ = ["dma_index_layout", "dma_placing_leaves"]

# jax after 0.10.2 flattens a DMA's transforms beside its refs: another layout of operands.
_SPLIT = "src_transforms" in inspect.signature(mosaic_primitives._dma_flatten).parameters


def dma_placing_leaves(tree: Any) -> frozenset[int]:
    """The operands (flat positions) of a ``dma_start``/``dma_wait`` equation with tree
    ``tree`` that only place its source and destination regions: the dynamic slice starts
    and scalar indices of refs indexed by indexers alone, whose slices' sizes are static
    (so the regions' shapes, the DMA's size, do not depend on them); empty where
    ``dma_index_layout`` shows nothing."""
    layout = dma_index_layout(tree)
    if layout is None:
        return frozenset()
    return frozenset(entry[1] for side in layout if side is not None
                     for entries in side for entry in entries if entry[1] is not None)


def dma_index_layout(tree: Any) -> tuple[Any, Any] | None:
    """How a ``dma_start``'s source and destination regions follow from its operands,
    where each is a ref indexed by indexers of scalar indices and slices of static size
    (``x.at[h].at[pl.ds(p, n)]``): per side, None for a bare ref (the whole buffer), else
    one tuple per indexer with one entry per index, ``("index", position)`` or
    ``("slice", position or None, start, size, stride)`` (a static start when the
    position is None). None where the tree is of another shape (nothing is shown)."""
    if _SPLIT:
        return None
    try:
        parts = tree.children()
        if len(parts) != 5:
            return None
        sides: list[Any] = []
        offset = 0
        for part in parts[:2]:
            if part.num_leaves == 1 and part.node_data() is None:
                sides.append(None)
            else:
                side = _side_layout(part, offset)
                if side is None:
                    return None
                sides.append(side)
            offset += part.num_leaves
        return sides[0], sides[1]
    except Exception:  # noqa: BLE001 - another jax's trees: nothing shown
        return None


def _side_layout(part: Any, offset: int) -> tuple[Any, ...] | None:
    data = part.node_data()
    if data is None or data[0] is not state_types.TransformedRef:
        return None
    ref, transforms = part.children()
    if ref.num_leaves != 1 or ref.node_data() is not None:
        return None
    indexers: list[Any] = []
    at = offset + 1
    for indexer in transforms.children():
        i_data = indexer.node_data()
        if (i_data is None or i_data[0] is not indexing.NDIndexer or len(i_data[1]) != 3
                or tuple(i_data[1][2]) != ()):
            return None
        entries: list[Any] = []
        for index in i_data[1][0].children():
            d = index.node_data()
            if d is None:
                entries.append(("index", at))
                at += 1
            elif d[0] is indexing.Slice and d[1][1] is not None:
                start, size, stride = d[1]
                if start is None:
                    entries.append(("slice", at, 0, size, stride))
                    at += 1
                else:
                    entries.append(("slice", None, start, size, stride))
            else:
                return None
        indexers.append(tuple(entries))
    if not indexers or at != offset + part.num_leaves:
        return None
    return tuple(indexers)
