"""Vector clocks.

A clock has one integer time per *slot*. Every actor owns one slot; its own entry is its
current epoch, the other entries say how far into the other slots' histories it has
seen. Each entry also carries the name of the actor that made that time, so a report can
say "saw DMA #3 up to time 4" even after DMA #3's slot went to another DMA.

An access made at epoch ``(slot, time)`` happens-before every later access whose clock
has ``clock[slot] >= time`` (the FastTrack epoch test: O(1) instead of comparing whole
clocks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress, count
from operator import gt

Entries = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Clock:
    """An immutable vector-clock snapshot: what ``RaceDetector.release`` hands to ``acquire``.

    >>> a = Clock((2, 0, 1), ("core 0", "", "DMA #1"))
    >>> a.entries()
    (('core 0', 2), ('DMA #1', 1))
    >>> a <= a.join(Clock((0, 5), ("", "core 1")))
    True
    """

    times: tuple[int, ...] = ()
    names: tuple[str, ...] = ()
    # The slot of the finished actor whose last release this is (-1: any other): whoever
    # acquires it has that actor's whole past and may give its slot to a new actor.
    finished_slot: int = field(default=-1, compare=False)

    def time(self, slot: int) -> int:
        """The time of ``slot`` (0 if this clock never heard of it)."""
        return self.times[slot] if slot < len(self.times) else 0

    def join(self, other: Clock) -> Clock:
        """The element-wise maximum of both clocks."""
        vc = VectorClock(self.times, self.names)
        vc.join(other)
        return vc.snapshot()

    def __le__(self, other: Clock) -> bool:
        """Whether every entry of ``self`` is <= the same entry of ``other``."""
        return all(t <= other.time(s) for s, t in enumerate(self.times))

    def happens_before(self, other: Clock) -> bool:
        """Strict happens-before of the two snapshots: ``self <= other`` and they differ."""
        return self <= other and not other <= self

    def entries(self) -> Entries:
        """The non-zero entries as ``(actor name, time)`` pairs, in slot order."""
        return tuple((n, t) for t, n in zip(self.times, self.names) if t)


class VectorClock:
    """A mutable vector clock, owned by one actor (see ``Clock`` for the snapshot)."""

    __slots__ = ("times", "names", "_entries", "_snapshot")

    def __init__(self, times: Sequence[int] = (), names: Sequence[str] = ()) -> None:
        self.times: list[int] = list(times)
        self.names: list[str] = list(names)
        self._entries: Entries | None = None
        self._snapshot: Clock | None = None

    def time(self, slot: int) -> int:
        """The time of ``slot`` (0 if never heard of)."""
        times = self.times
        return times[slot] if slot < len(times) else 0

    def covers(self, slot: int, time: int) -> bool:
        """Whether the epoch ``(slot, time)`` is in this clock's past (or is its present)."""
        times = self.times
        return slot < len(times) and time <= times[slot]

    def set(self, slot: int, time: int, name: str) -> None:
        """Set one entry (a new actor taking ``slot`` starts at ``time``)."""
        if slot >= len(self.times):
            grow = slot + 1 - len(self.times)
            self.times.extend([0] * grow)
            self.names.extend([""] * grow)
        self.times[slot] = time
        self.names[slot] = name
        self._entries = self._snapshot = None

    def increment(self, slot: int) -> None:
        """Tick ``slot``: the owner's later accesses are concurrent with what it released."""
        self.times[slot] += 1
        self._entries = self._snapshot = None

    def join(self, other: VectorClock | Clock) -> None:
        """Take the element-wise maximum with ``other`` (an acquire)."""
        times, names = self.times, self.names
        other_times, other_names = other.times, other.names
        if len(other_times) > len(times):
            grow = len(other_times) - len(times)
            times.extend([0] * grow)
            names.extend([""] * grow)
            self._entries = self._snapshot = None
        # The slots to update are found in C (map/compress), then visited: an acquire of
        # a clock that knows little new costs a scan at C speed, not a Python loop.
        changed = False
        for slot in compress(count(), map(gt, other_times, times)):
            times[slot] = other_times[slot]
            names[slot] = other_names[slot]
            changed = True
        if changed:
            self._entries = self._snapshot = None

    def copy(self) -> VectorClock:
        """An independent copy."""
        return VectorClock(self.times, self.names)

    def snapshot(self) -> Clock:
        """The immutable snapshot of the current value (cached until the next change)."""
        if self._snapshot is None:
            self._snapshot = Clock(tuple(self.times), tuple(self.names))
        return self._snapshot

    def entries(self) -> Entries:
        """The non-zero entries as ``(actor name, time)`` pairs (cached until the next change)."""
        if self._entries is None:
            self._entries = tuple((n, t) for t, n in zip(self.times, self.names) if t)
        return self._entries
