"""Vector clocks: flat int64 arrays, one time per *slot*.

Every actor owns one slot; its own entry is its current epoch, the other entries say how
far into the other slots' histories it has seen. Each entry also carries the name of the
actor that made that time, so a report can say "saw DMA #3 up to time 4" even after
DMA #3's slot went to another DMA.

An access made at epoch ``(slot, time)`` happens-before every later access whose clock
has ``clock[slot] >= time`` (the FastTrack epoch test: O(1) instead of comparing whole
clocks).

The times are one numpy ``int64`` array per clock (``VectorClock.array``), the names
one object array: a join is a few vectorised operations whatever the number of slots
and of entries it takes. A snapshot copies nothing: it shares both arrays, and the
clock copies one on its next change of it (copy on write), so the snapshots an actor's
accesses take between two changes of its clock cost one array copy in all, made only
if the clock changes again. The names change only when a join takes a newer time from
another clock (or a slot gets a new actor), not when the owner ticks, so a tick copies
the times only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

Entries = tuple[tuple[str, int], ...]

_INT = np.int64


def _object_array(names: Sequence[str]) -> np.ndarray:
    """``names`` as a one-dimensional object array."""
    array = np.empty(len(names), object)
    array[:] = list(names)
    return array


class Clock:
    """An immutable vector-clock snapshot: what ``RaceDetector.release`` hands to ``acquire``.

    >>> a = Clock((2, 0, 1), ("core 0", "", "DMA #1"))
    >>> a.entries()
    (('core 0', 2), ('DMA #1', 1))
    >>> a <= a.join(Clock((0, 5), ("", "core 1")))
    True

    ``finished_slot``: the slot of the finished actor whose last release this is (-1: any
    other); whoever acquires it has that actor's whole past and may give its slot to a
    new actor. It takes no part in equality.
    """

    __slots__ = ("_array", "_name_array", "_names", "_times", "finished_slot")

    def __init__(self, times: Sequence[int] = (), names: Sequence[str] = (),
                 finished_slot: int = -1) -> None:
        self._times: tuple[int, ...] | None = tuple(int(t) for t in times)
        self._array: np.ndarray | None = None
        self._names: tuple[str, ...] | None = tuple(names)
        self._name_array: np.ndarray | None = None
        self.finished_slot = finished_slot

    @classmethod
    def of_array(cls, array: np.ndarray, names: np.ndarray, finished_slot: int = -1) -> Clock:
        """A snapshot over ``array`` and the object array ``names`` (neither copied:
        nobody may change them afterwards)."""
        clock = cls.__new__(cls)
        clock._array = array
        clock._times = None
        clock._name_array = names
        clock._names = None
        clock.finished_slot = finished_slot
        return clock

    @property
    def times(self) -> tuple[int, ...]:
        """The times, one per slot."""
        if self._times is None:
            assert self._array is not None
            self._times = tuple(self._array.tolist())
        return self._times

    @property
    def array(self) -> np.ndarray:
        """The times as an int64 array (shared: never change it)."""
        if self._array is None:
            self._array = np.array(self.times, dtype=_INT)
        return self._array

    @property
    def names(self) -> tuple[str, ...]:
        """Per slot, the name of the actor that made its time."""
        if self._names is None:
            assert self._name_array is not None
            self._names = tuple(self._name_array.tolist())
        return self._names

    @property
    def name_array(self) -> np.ndarray:
        """The names as an object array (shared: never change it)."""
        if self._name_array is None:
            self._name_array = _object_array(self.names)
        return self._name_array

    def time(self, slot: int) -> int:
        """The time of ``slot`` (0 if this clock never heard of it)."""
        array = self.array
        return int(array[slot]) if slot < len(array) else 0

    def join(self, other: Clock) -> Clock:
        """The element-wise maximum of both clocks."""
        vc = VectorClock(self.array, self.names)
        vc.join(other)
        return vc.snapshot()

    def __le__(self, other: Clock) -> bool:
        """Whether every entry of ``self`` is <= the same entry of ``other``."""
        mine, theirs = self.array, other.array
        n = min(len(mine), len(theirs))
        return bool(np.all(mine[:n] <= theirs[:n])) and not np.any(mine[n:])

    def happens_before(self, other: Clock) -> bool:
        """Strict happens-before of the two snapshots: ``self <= other`` and they differ."""
        return self <= other and not other <= self

    def entries(self) -> Entries:
        """The non-zero entries as ``(actor name, time)`` pairs, in slot order."""
        return tuple((n, t) for t, n in zip(self.times, self.names) if t)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Clock):
            return NotImplemented
        return self.times == other.times and self.names == other.names

    def __hash__(self) -> int:
        return hash((self.times, self.names))

    def __repr__(self) -> str:
        return f"Clock(times={self.times!r}, names={self.names!r})"

    def __reduce__(self) -> Any:
        return (Clock, (self.times, self.names, self.finished_slot))


class VectorClock:
    """A mutable vector clock, owned by one actor (see ``Clock`` for the snapshot).

    ``array`` holds the times (int64, one per slot), ``_names`` the names (an object
    array: a join copies the names it takes in one vectorised step, however many); both
    may be shared with snapshots (``_shared``, ``_names_shared``): every change goes
    through ``_own`` / ``_own_names`` first, which copy them then. ``times`` and
    ``names`` are copies as lists.
    """

    __slots__ = ("_entries", "_names", "_names_shared", "_shared", "_snapshot", "array")

    def __init__(self, times: Sequence[int] | np.ndarray = (), names: Sequence[str] = ()) -> None:
        self.array: np.ndarray = np.array(times, dtype=_INT).reshape(-1)
        names = list(names)
        if len(names) < len(self.array):
            names.extend([""] * (len(self.array) - len(names)))
        self._names: np.ndarray = _object_array(names)
        self._entries: Entries | None = None
        self._snapshot: Clock | None = None
        self._shared = False  # a snapshot holds ``array``: copy it before changing it
        self._names_shared = False  # the same for ``_names``

    def _own(self) -> np.ndarray:
        """``array``, copied first if a snapshot shares it: the one way to change it."""
        if self._shared:
            self.array = self.array.copy()
            self._shared = False
        return self.array

    def _own_names(self) -> np.ndarray:
        """``_names``, copied first if a snapshot shares it."""
        if self._names_shared:
            self._names = self._names.copy()
            self._names_shared = False
        return self._names

    @property
    def times(self) -> list[int]:
        """The times, one per slot (a copy)."""
        return self.array.tolist()

    @property
    def names(self) -> list[str]:
        """Per slot, the name of the actor that made its time (a copy)."""
        return self._names.tolist()

    def time(self, slot: int) -> int:
        """The time of ``slot`` (0 if never heard of)."""
        array = self.array
        return int(array[slot]) if slot < len(array) else 0

    def covers(self, slot: int, time: int) -> bool:
        """Whether the epoch ``(slot, time)`` is in this clock's past (or is its present)."""
        array = self.array
        return slot < len(array) and time <= array[slot]

    def _grow(self, n: int) -> None:
        grow = n - len(self.array)
        # New arrays: nothing shares them.
        self.array = np.concatenate((self.array, np.zeros(grow, _INT)))
        self._shared = False
        names = np.empty(n, object)
        names[: len(self._names)] = self._names
        names[len(self._names):] = ""
        self._names = names
        self._names_shared = False

    def set(self, slot: int, time: int, name: str) -> None:
        """Set one entry (a new actor taking ``slot`` starts at ``time``)."""
        if slot >= len(self.array):
            self._grow(slot + 1)
        self._own()[slot] = time
        self._own_names()[slot] = name
        self._entries = self._snapshot = None

    def increment(self, slot: int) -> None:
        """Tick ``slot``: the owner's later accesses are concurrent with what it released."""
        self._own()[slot] += 1
        self._entries = self._snapshot = None

    def join(self, other: VectorClock | Clock) -> None:
        """Take the element-wise maximum with ``other`` (an acquire)."""
        theirs = other.array
        n = len(theirs)
        if n > len(self.array):
            self._grow(n)
        mine = self.array
        if n < len(mine):
            mine = mine[:n]
        slots = (theirs > mine).nonzero()[0]
        k = len(slots)
        if not k:
            return
        their_names = other._names if other.__class__ is VectorClock else other.name_array  # type: ignore[union-attr]
        if k == 1:  # half of all joins (a core learning one DMA's end): no fancy indexing
            slot = slots[0]
            self._own()[slot] = theirs[slot]
            self._own_names()[slot] = their_names[slot]
        else:
            self._own()[slots] = theirs[slots]
            self._own_names()[slots] = their_names[slots]
        self._entries = self._snapshot = None

    def copy(self) -> VectorClock:
        """An independent copy."""
        vc = VectorClock.__new__(VectorClock)
        vc.array = self.array.copy()
        vc._shared = False
        vc._names = self._names.copy()
        vc._names_shared = False
        vc._entries = vc._snapshot = None
        return vc

    def snapshot(self) -> Clock:
        """The immutable snapshot of the current value (cached until the next change;
        it shares the arrays, which the next change copies)."""
        snap = self._snapshot
        if snap is None:
            snap = self._snapshot = Clock.of_array(self.array, self._names)
            self._shared = self._names_shared = True
        return snap

    def entries(self) -> Entries:
        """The non-zero entries as ``(actor name, time)`` pairs (cached until the next change)."""
        if self._entries is None:
            self._entries = tuple(
                (n, t) for t, n in zip(self.array.tolist(), self._names.tolist()) if t)
        return self._entries
