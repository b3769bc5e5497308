"""What an out-of-bounds block copy says: the index map's answer against the valid
blocks, and where that index map is.

A block copy past its array is an index map (or a grid) asking for a block that does
not exist. The buffer's own message names the region and the shape; these name the
likely bug: which index map returned which block in which dimension, the range of
blocks that exist (a partial last block counts), and the index map's source line, not
the ``pallas_call``'s. They are made per copy and formatted only when an error needs
them (``str()``), like ``eval.site.Site``.
"""

from __future__ import annotations

import math

from palladium.interpret._jax_compat import call_site
from palladium.interpret.errors import jax_block_index_phrase
from palladium.interpret.kernel.blocks import BlockSpecInfo

__all__ = ["BlockIndexHeadline", "BlockIndexHint", "first_block_out_of_range"]


def first_block_out_of_range(info: BlockSpecInfo,
                             block: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(dimension, index, number of valid blocks) of the first dimension whose block
    index lies outside the array; None where every checkable one is inside (element and
    bounded dimensions index elements, and are left to the buffer's own check)."""
    if len(block) != len(info.dims):
        return None
    for dim, (d, index, n) in enumerate(zip(info.dims, block, info.array_shape)):
        if d.kind == "blocked" and d.size:
            count = math.ceil(n / d.size)
        elif d.kind == "squeezed":
            count = n
        else:
            continue
        if not 0 <= index < count:
            return dim, int(index), count
    return None


class BlockIndexHeadline:
    """The first words of an out-of-bounds block copy's error: the index map's answer
    against the valid blocks, then jax's phrase (tests written against jax match it)."""

    __slots__ = ("block", "info", "kind", "point")

    def __init__(self, info: BlockSpecInfo, block: tuple[int, ...], kind: str,
                 point: tuple[int, ...]) -> None:
        self.info, self.block, self.kind, self.point = info, block, kind, point

    def __str__(self) -> str:
        phrase = jax_block_index_phrase(self.block, self.kind, self.info.name, self.point)
        miss = first_block_out_of_range(self.info, self.block)
        if miss is None:
            return phrase
        dim, index, count = miss
        where = call_site.function_location(self.info.index_map)
        return (
            f"index_map returned block {index} for {self.kind} '{self.info.name}' "
            f"(dimension {dim} of block index {self.block} at grid point {self.point}); "
            f"valid blocks are 0..{count - 1}"
            + (f" (index_map {where})" if where else "") + f".\n{phrase}"
        )


class BlockIndexHint:
    """What to do about an out-of-bounds block copy: fix the index map or the grid
    (the switches that read past an array would hide this bug, so they are not
    offered); empty for element and bounded dimensions (the simulation's hint then)."""

    __slots__ = ("block", "info")

    def __init__(self, info: BlockSpecInfo, block: tuple[int, ...]) -> None:
        self.info, self.block = info, block

    def __str__(self) -> str:
        miss = first_block_out_of_range(self.info, self.block)
        if miss is None:
            return ""
        dim, _, count = miss
        d, n = self.info.dims[dim], self.info.array_shape[dim]
        size = (f"pl.cdiv({n}, {d.size}) = {count} blocks of {d.size}" if d.kind == "blocked"
                else f"{count} indices")
        return (
            f"Fix the index_map (or the grid) so that every grid point maps to an existing "
            f"block: dimension {dim} of '{self.info.name}' ({n} elements) has {size} (a "
            f"partial last block is allowed)."
        )
