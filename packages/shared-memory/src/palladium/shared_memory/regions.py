"""Regions of a buffer: resolving ``tuple[int | slice, ...]`` against its bounds.

A region indexes like numpy basic indexing (ints drop their axis; a region shorter than
the rank covers the rest in full) with one difference: indices are *literal*. A kernel
computes its indices, so ``-1`` is an out-of-bounds index, not "the last element";
``None`` in a slice means the usual default (``0`` / the axis length for a positive
step, the last element / past the first for a negative one).

:func:`resolve` turns a region into an :class:`AccessPlan`: which part of the result is
backed by stored data (the logical shape), which part lies in tile padding (between the
logical and the bound shape, always uninitialised), and whether anything falls outside
the bounds. A plan also carries, made once and only when races are detected, the race
detector's ``PreparedAccess`` of its stored part: resolving a region is the only time
its index tuple is parsed, by this package or the detector.
"""

from __future__ import annotations

from operator import index as _as_int
from typing import Any

from palladium.race_detect import ConfigError, PreparedAccess, prepare

__all__ = ["AccessPlan", "describe_region", "resolve"]

_ALL = slice(None)


class AccessPlan:
    """How one access maps onto a buffer; made by ``resolve`` (``Simulation.plan``).

    ``full``: the whole result is stored data, nothing in padding or out of bounds.
    ``index``: numpy basic index of the stored part (non-negative, explicit), or None
    when no element is stored data. ``shape``: the result's shape. ``pos``: where the
    stored part sits in the result. ``oob``: some element is outside the bounds.
    ``box``: the part of the result inside the bounds (None if nothing is).
    ``region``: the region as given (for messages). ``logical``, ``bound``: the buffer
    shapes it was resolved against (a plan serves any buffer with both the same).
    ``prepared``: the race detector's ``PreparedAccess`` of ``index`` once
    ``race_access`` made it (None before).
    """

    __slots__ = ("bound", "box", "full", "index", "logical", "oob", "pos", "prepared", "region",
                 "shape")

    def __init__(self, region: Any, full: Any, index: Any, shape: Any, pos: Any, oob: Any, box: Any,
                 logical: tuple[int, ...], bound: tuple[int, ...]) -> None:
        self.region = region
        self.full = full
        self.index = index
        self.shape = shape
        self.pos = pos
        self.oob = oob
        self.box = box
        self.logical = logical
        self.bound = bound
        self.prepared: PreparedAccess | None = None

    def race_access(self) -> PreparedAccess:
        """The race detector's view of the stored part (``index`` must not be None), made
        on first use and kept: every access through this plan passes the same value."""
        prepared = self.prepared
        if prepared is None:
            prepared = self.prepared = prepare(self.index, self.logical)
        return prepared


def _span(start: int, step: int, count: int, n: int) -> tuple[int, int]:
    """The positions ``k`` in ``[0, count)`` with ``0 <= start + k * step < n``."""
    if step > 0:
        lo = 0 if start >= 0 else (-start + step - 1) // step
        hi = (n - start + step - 1) // step if start < n else 0
    else:
        s = -step
        lo = 0 if start < n else (start - n) // s + 1
        hi = start // s + 1 if start >= 0 else 0
    hi = min(hi, count)
    lo = min(lo, hi)
    return lo, hi


def resolve(region: Any, logical: tuple[int, ...], bound: tuple[int, ...]) -> AccessPlan:
    """Resolve ``region`` against a buffer of ``logical`` shape and ``bound`` shape."""
    if region is None:
        region = ()
    elif region.__class__ is not tuple:
        region = (region,) if isinstance(region, slice) or hasattr(region, "__index__") else tuple(region)
    nd = len(logical)
    nr = len(region)
    if nr > nd:
        raise ConfigError(f"region {describe_region(region)} indexes {nr} axes of a rank-{nd} buffer")
    index: list = []
    shape: list[int] = []
    pos: list = []
    box: list | None = []
    full = True
    oob = False
    stored = True
    for axis in range(nd):
        n = logical[axis]
        r = region[axis] if axis < nr else _ALL
        if r.__class__ is slice:
            step = 1 if r.step is None else _as_int(r.step)
            if step > 0:
                start = 0 if r.start is None else _as_int(r.start)
                stop = n if r.stop is None else _as_int(r.stop)
                count = (stop - start + step - 1) // step if stop > start else 0
            elif step < 0:
                start = n - 1 if r.start is None else _as_int(r.start)
                stop = -1 if r.stop is None else _as_int(r.stop)
                count = (start - stop - step - 1) // -step if start > stop else 0
            else:
                raise ConfigError(f"slice step cannot be zero in region {describe_region(region)}")
            shape.append(count)
            if step > 0 and start >= 0 and start + count * step - step < n:
                lo, hi = 0, count
            else:
                lo, hi = _span(start, step, count, n)
            if lo == 0 and hi == count:
                if count:
                    end = start + count * step
                    index.append(slice(start, end if end >= 0 else None, step))
                else:
                    index.append(slice(0, 0))
                pos.append(_ALL)
                if box is not None:
                    box.append(_ALL)
                continue
            full = False
            blo, bhi = _span(start, step, count, bound[axis])
            if blo != 0 or bhi != count:
                oob = True
            if box is not None:
                box.append(slice(blo, bhi))
            if hi > lo:
                first = start + lo * step
                end = start + hi * step
                index.append(slice(first, end if end >= 0 else None, step))
                pos.append(slice(lo, hi))
            else:
                stored = False
        else:
            i = _as_int(r)  # type: ignore[arg-type]
            if 0 <= i < n:
                index.append(i)
                continue
            full = False
            stored = False
            if not 0 <= i < bound[axis]:
                oob = True
                box = None
    return AccessPlan(
        region,
        full,
        tuple(index) if stored else None,
        tuple(shape),
        tuple(pos),
        oob,
        tuple(box) if box is not None else None,
        logical,
        bound,
    )


def describe_region(region: Any) -> str:
    """``[0:8, 3]``-style text of a region, for messages."""
    if region is None:
        return "[...]"
    if region.__class__ is not tuple:
        region = (region,)
    parts = []
    for r in region:
        if isinstance(r, slice):
            text = f"{'' if r.start is None else r.start}:{'' if r.stop is None else r.stop}"
            if r.step not in (None, 1):
                text += f":{r.step}"
            parts.append(text)
        else:
            parts.append(str(r))
    return "[" + ", ".join(parts) + "]"
