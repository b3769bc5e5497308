"""Uniform boxes of a buffer's shadow state: their geometry and the pair encoding.

A box is a rectangle of the buffer, per dimension ``[start, stop)``; its elements share
one pair ``w << 32 | r`` (write id, read-set id; see ``shadow``).
"""

from __future__ import annotations

from typing import Any

from palladium.race_detect.regions import Region

# An actor's clock times: its ``VectorClock.array`` (int64), or any sequence of ints.
Times = Any


def precedes(event: Any, times: Times) -> bool:
    """Whether ``event`` happens-before an access whose clock is ``times``."""
    slot = event.slot
    return slot < len(times) and event.time <= times[slot]


R_MASK = (1 << 32) - 1

Box = tuple[tuple[int, int], ...]  # per dimension [start, stop)


def box_size(box: Box) -> int:
    n = 1
    for lo, hi in box:
        n *= hi - lo
    return n


def box_of(region: Region, shape: tuple[int, ...]) -> Box | None:
    """The normalised ``region`` as a box, or None (strided, or empty)."""
    box = []
    for index, n in zip(region, shape):
        if index.__class__ is slice:
            start, stop, step = index.indices(n)
            if step != 1 or stop <= start:
                return None
            box.append((start, stop))
        else:
            i = int(index)
            i = i + n if i < 0 else i
            box.append((i, i + 1))
    return tuple(box)


def contains(outer: Box, inner: Box) -> bool:
    for (a, b), (c, d) in zip(outer, inner):  # noqa: SIM110 (~2x faster than all(<genexpr>))
        if c < a or b < d:
            return False
    return True


def overlaps(a: Box, b: Box) -> bool:
    for (lo1, hi1), (lo2, hi2) in zip(a, b):  # noqa: SIM110 (a loop: ~2x faster than all())
        if hi2 <= lo1 or hi1 <= lo2:
            return False
    return True


def subtract(outer: Box, inner: Box) -> list[Box]:
    """``outer`` minus ``inner`` (inside it) as disjoint boxes."""
    pieces = []
    rest = list(outer)
    for axis, ((lo, hi), (ilo, ihi)) in enumerate(zip(outer, inner)):
        if lo < ilo:
            pieces.append(tuple(rest[:axis] + [(lo, ilo)] + rest[axis + 1 :]))
        if ihi < hi:
            pieces.append(tuple(rest[:axis] + [(ihi, hi)] + rest[axis + 1 :]))
        rest[axis] = (ilo, ihi)
    return pieces
