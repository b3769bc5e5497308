"""A region prepared once for the detector: the one seam from a simulator to it.

A simulator resolves an access of a buffer once (into its own plan of the region) and
keeps the ``PreparedAccess`` of the region with that plan; every later read or write of
the region hands the prepared value to ``RaceDetector.read`` / ``write``, which then
neither normalises nor validates the region again and keeps no cache of its own. A
prepared access is a plain immutable value of the region and the buffer's shape, so it
can serve every buffer of that shape.
"""

from __future__ import annotations

from typing import Any

from palladium.race_detect.boxes import Box, box_of, box_size
from palladium.race_detect.regions import Region, format_region, normalise

__all__ = ["PreparedAccess", "prepare"]


class PreparedAccess:
    """``region`` of a buffer of ``shape``, checked and normalised, as the detector needs it.

    ``region``: one index per dimension (what race reports show); ``box``: the region as
    a rectangle ``((start, stop), ...)``, or None when it is strided or empty; ``size``:
    the box's number of elements (0 without a box). Made by ``prepare``.
    """

    __slots__ = ("box", "region", "shape", "size")

    def __init__(self, region: Region, shape: tuple[int, ...], box: Box | None, size: int) -> None:
        self.region = region
        self.shape = shape
        self.box = box
        self.size = size

    def __repr__(self) -> str:
        return f"PreparedAccess({format_region(self.region)} of shape {self.shape})"

    def __eq__(self, other: object) -> bool:
        # Equal when nothing can tell them apart, not even a report's repr: the same
        # shape, the same indices of the same types (the memo's call logs compare
        # accesses by this; the same object, the usual case, is equal without a call).
        if other.__class__ is not PreparedAccess:
            return NotImplemented
        return (self.shape == other.shape  # type: ignore[attr-defined]
                and _same(self.region, other.region))  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self.shape, self.box))


def _same(a: Region, b: Region) -> bool:
    """Whether two regions hold equal indices of the same types (slices: their parts)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.__class__ is not y.__class__:
            return False
        if x.__class__ is slice:
            if not _same((x.start, x.stop, x.step), (y.start, y.stop, y.step)):
                return False
        elif x != y:
            return False
    return True


def prepare(region: Any, shape: tuple[int, ...], name: str = "buffer") -> PreparedAccess:
    """``region`` (see ``RaceDetector.read``) of a buffer of ``shape``, prepared once.

    A bad region raises ``RegionError`` naming the buffer ``name``.

    >>> prepare((slice(0, 2),), (4, 4)).box
    ((0, 2), (0, 4))
    """
    shape = tuple(int(d) for d in shape)
    full = normalise(region, shape, name)
    box = box_of(full, shape)
    return PreparedAccess(full, shape, box, box_size(box) if box is not None else 0)
