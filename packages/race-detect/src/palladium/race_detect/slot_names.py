"""Who made each time of each clock slot: the names a vector clock's entries carry.

A slot is a chain of actors: each new occupant starts one past its predecessor's final
time, and only the occupant advances the slot's time. So a time of a slot names exactly
one actor, the occupant whose run of times holds it, and a clock needs no name per entry:
``SlotNames`` keeps, per slot, the times at which a name starts (``set``), and the name
of ``(slot, time)`` is the one starting last at or before ``time`` (``name``). Clocks are
then plain int64 arrays: a copy or a join moves no Python objects, and the names are
looked up only when a report (or an export to another process) shows them.

A race detector's clocks share one ``SlotNames`` (``shared``: a copy of a clock keeps
it). A clock made from explicit names (``VectorClock(times, names)``) gets its own
(copied with the clock), so the names its user gave are what it shows.

>>> names = SlotNames()
>>> names.set(0, 1, "DMA #1"); names.set(0, 4, "DMA #2")
>>> [names.name(0, t) for t in range(6)]
['', 'DMA #1', 'DMA #1', 'DMA #1', 'DMA #2', 'DMA #2']
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

__all__ = ["SlotNames"]


class SlotNames:
    """Per slot, the times at which a name starts, and those names (see the module)."""

    __slots__ = ("_names", "_starts", "shared")

    def __init__(self, shared: bool = False) -> None:
        self._starts: list[list[int]] = []
        self._names: list[list[str]] = []
        # True: the detector's, kept by copies of its clocks; False: one clock's own.
        self.shared = shared

    @classmethod
    def of(cls, times: Sequence[int], names: Sequence[str]) -> SlotNames:
        """The names of one clock given explicitly (``names[i]`` made ``times[i]``)."""
        table = cls()
        for slot, (time, name) in enumerate(zip(times, names)):
            if name:
                table.set(slot, int(time), name)
        return table

    def set(self, slot: int, time: int, name: str) -> None:
        """``name`` made ``time`` of ``slot`` and the times after it (until the next
        name set later in time)."""
        while len(self._starts) <= slot:
            self._starts.append([])
            self._names.append([])
        starts, names = self._starts[slot], self._names[slot]
        if not starts or time > starts[-1]:  # a new occupant of the slot: the usual case
            starts.append(time)
            names.append(name)
            return
        i = bisect_left(starts, time)
        if starts[i] == time:
            names[i] = name
        else:
            starts.insert(i, time)
            names.insert(i, name)

    def name(self, slot: int, time: int) -> str:
        """The name of the actor that made ``time`` of ``slot`` ('' if none is known)."""
        if slot >= len(self._starts):
            return ""
        i = bisect_right(self._starts[slot], time) - 1
        return self._names[slot][i] if i >= 0 else ""

    def names(self, times: Sequence[int]) -> tuple[str, ...]:
        """The names of a whole clock's entries (``times[slot]`` for each slot)."""
        return tuple(self.name(slot, t) for slot, t in enumerate(times))

    def copy(self) -> SlotNames:
        """An independent copy."""
        table = SlotNames(self.shared)
        table._starts = [list(s) for s in self._starts]
        table._names = [list(n) for n in self._names]
        return table
