"""Vector clocks: flat int64 arrays, one time per *slot*.

Every actor owns one slot; its own entry is its current epoch, the other entries say how
far into the other slots' histories it has seen. Each entry is also shown with the name
of the actor that made that time, so a report can say "saw DMA #3 up to time 4" even
after DMA #3's slot went to another DMA: a slot's times name their actors (a slot is a
chain of actors, each starting past its predecessor's final time), so the names are not
kept per entry but looked up in a ``SlotNames`` (``slot_names.py``) when shown.

An access made at epoch ``(slot, time)`` happens-before every later access whose clock
has ``clock[slot] >= time`` (the FastTrack epoch test: O(1) instead of comparing whole
clocks).

The times are one numpy ``int64`` array per clock (``VectorClock.array``), and nothing
else: a join is one vectorised maximum whatever the number of slots and of entries it
takes, and a copy copies the array alone. A snapshot copies nothing: it shares the
array, and the clock copies it on its next change (copy on write), so the snapshots an
actor's accesses take between two changes of its clock cost one array copy in all, made
only if the clock changes again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from palladium.race_detect.slot_names import SlotNames

Entries = tuple[tuple[str, int], ...]

_INT = np.int64


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

    __slots__ = ("_array", "_fork", "_times", "finished_slot", "namer")

    def __init__(self, times: Sequence[int] = (), names: Sequence[str] = (),
                 finished_slot: int = -1) -> None:
        self._times: tuple[int, ...] | None = tuple(int(t) for t in times)
        self._array: np.ndarray | None = None
        # The names of the times (``slot_names``): explicit ones, this clock's own.
        self.namer = SlotNames.of(self._times, names)
        self.finished_slot = finished_slot
        self._fork: tuple[np.ndarray, int, int, VectorClock | None] | None = None

    @classmethod
    def of_array(cls, array: np.ndarray, namer: SlotNames, finished_slot: int = -1) -> Clock:
        """A snapshot over ``array`` (not copied: nobody may change it afterwards), whose
        times ``namer`` names."""
        clock = cls.__new__(cls)
        clock._array = array
        clock._times = None
        clock.namer = namer
        clock.finished_slot = finished_slot
        clock._fork = None
        return clock

    @classmethod
    def of_fork(cls, base: np.ndarray, namer: SlotNames, slot: int, time: int,
                finished_slot: int = -1, origin: VectorClock | None = None) -> Clock:
        """``base`` (a snapshot's array: nobody may change it) with ``slot`` at ``time``
        (``time >= base[slot]``): the clock of a forked actor that never joined anything
        (a DMA), made without copying ``base``. Its array is built only if asked for;
        ``VectorClock.join`` takes it as ``base`` plus one entry. ``origin``: the clock
        ``base`` was shared from (the parent's), which only grows: joined into it, only
        the one entry can change anything.

        >>> Clock.of_fork(np.array([3, 0, 1]), SlotNames.of((3, 0, 1), ("a", "", "b")),
        ...               4, 2).times
        (3, 0, 1, 0, 2)
        """
        clock = cls.__new__(cls)
        clock._array = None
        clock._times = None
        clock.namer = namer
        clock.finished_slot = finished_slot
        clock._fork = (base, slot, time, origin)
        return clock

    @property
    def times(self) -> tuple[int, ...]:
        """The times, one per slot."""
        if self._times is None:
            self._times = tuple(self.array.tolist())
        return self._times

    @property
    def array(self) -> np.ndarray:
        """The times as an int64 array (shared: never change it)."""
        if self._array is None:
            if self._fork is not None:
                self._array = with_entry(*self._fork[:3])
            else:
                self._array = np.array(self.times, dtype=_INT)
        return self._array

    @property
    def names(self) -> tuple[str, ...]:
        """Per slot, the name of the actor that made its time."""
        return self.namer.names(self.times)

    def time(self, slot: int) -> int:
        """The time of ``slot`` (0 if this clock never heard of it)."""
        if self._fork is not None and slot == self._fork[1]:
            return self._fork[2]
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
        name = self.namer.name
        return tuple((name(s, t), t) for s, t in enumerate(self.times) if t)

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

    ``array`` holds the times (int64, one per slot), ``namer`` their names (a
    ``SlotNames``: the race detector's, shared by all its clocks, or this clock's own
    when made from explicit ``names``). ``array`` may be shared with snapshots
    (``_shared``): every change goes through ``_own`` first, which copies it then.
    ``times`` and ``names`` are copies as lists.
    """

    __slots__ = ("_entries", "_shared", "_snapshot", "array", "namer")

    def __init__(self, times: Sequence[int] | np.ndarray = (), names: Sequence[str] = (),
                 namer: SlotNames | None = None) -> None:
        self.array: np.ndarray = np.array(times, dtype=_INT).reshape(-1)
        if namer is None:
            namer = SlotNames.of(self.array.tolist(), names)
        self.namer = namer
        self._entries: Entries | None = None
        self._snapshot: Clock | None = None
        self._shared = False  # a snapshot holds ``array``: copy it before changing it

    @classmethod
    def owning(cls, array: np.ndarray, namer: SlotNames) -> VectorClock:
        """A clock that owns ``array`` (not copied: nobody else may hold it), named by
        ``namer``."""
        vc = cls.__new__(cls)
        vc.array = array
        vc.namer = namer
        vc._entries = vc._snapshot = None
        vc._shared = False
        return vc

    def _own(self) -> np.ndarray:
        """``array``, copied first if a snapshot shares it: the one way to change it."""
        if self._shared:
            self.array = self.array.copy()
            self._shared = False
        return self.array

    @property
    def times(self) -> list[int]:
        """The times, one per slot (a copy)."""
        return self.array.tolist()

    @property
    def names(self) -> list[str]:
        """Per slot, the name of the actor that made its time (a copy)."""
        return list(self.namer.names(self.array.tolist()))

    def time(self, slot: int) -> int:
        """The time of ``slot`` (0 if never heard of)."""
        array = self.array
        return int(array[slot]) if slot < len(array) else 0

    def covers(self, slot: int, time: int) -> bool:
        """Whether the epoch ``(slot, time)`` is in this clock's past (or is its present)."""
        array = self.array
        return slot < len(array) and time <= array[slot]

    def _grow(self, n: int) -> None:
        # A new array: nothing shares it.
        self.array = np.concatenate((self.array, np.zeros(n - len(self.array), _INT)))
        self._shared = False

    def set(self, slot: int, time: int, name: str) -> None:
        """Set one entry (a new actor taking ``slot`` starts at ``time``)."""
        if slot >= len(self.array):
            self._grow(slot + 1)
        self._own()[slot] = time
        self.namer.set(slot, time, name)
        self._entries = self._snapshot = None

    def increment(self, slot: int) -> None:
        """Tick ``slot``: the owner's later accesses are concurrent with what it released."""
        self._own()[slot] += 1
        self._entries = self._snapshot = None

    def join(self, other: VectorClock | Clock) -> None:
        """Take the element-wise maximum with ``other`` (an acquire)."""
        if other.__class__ is Clock and other._fork is not None and other.namer is self.namer:
            self._join_fork(*other._fork)  # type: ignore[union-attr]
            return
        theirs = other.array
        n = len(theirs)
        if n > len(self.array):
            self._grow(n)
        namer = other.namer
        if namer is not self.namer:  # names of another table: take those of the new times
            mine = self.array[:n]
            slots = (theirs > mine).nonzero()[0].tolist()
            if not slots:
                return
            for slot in slots:
                time = int(theirs[slot])
                self.namer.set(slot, time, namer.name(slot, time))
        mine = self._own()
        if n < len(mine):
            mine = mine[:n]
        np.maximum(mine, theirs, out=mine)
        self._entries = self._snapshot = None

    def _join_fork(self, base: np.ndarray, slot: int, time: int,
                   origin: VectorClock | None) -> None:
        """``join`` of ``Clock.of_fork(base, self.namer, slot, time, origin=origin)``:
        ``base``, then the one entry (which is at least ``base``'s own). When ``base``
        was shared from this clock (a core observing its own DMA), it is already below
        it everywhere: only the entry is joined."""
        n = len(base)
        mine = self.array
        if origin is self:
            if slot >= len(mine):
                self._grow(slot + 1)
            elif mine[slot] >= time:
                return
            self._own()[slot] = time
            self._entries = self._snapshot = None
            return
        if n == len(mine) and self._shared:  # one new array instead of a copy, then max
            mine = self.array = np.maximum(mine, base)
            self._shared = False
        else:
            if max(n, slot + 1) > len(mine):
                self._grow(max(n, slot + 1))
            mine = self._own()
            head = mine[:n] if n < len(mine) else mine
            np.maximum(head, base, out=head)
        if slot >= len(mine):
            self._grow(slot + 1)
            mine = self.array
        if mine[slot] < time:
            mine[slot] = time
        self._entries = self._snapshot = None

    def share(self) -> np.ndarray:
        """The array, shared from now on (the next change copies it): what a forked
        actor's clock starts from (``Clock.of_fork``)."""
        self._shared = True
        return self.array

    def copy(self) -> VectorClock:
        """An independent copy."""
        vc = VectorClock.__new__(VectorClock)
        vc.array = self.array.copy()
        vc._shared = False
        namer = self.namer
        vc.namer = namer if namer.shared else namer.copy()
        vc._entries = vc._snapshot = None
        return vc

    def snapshot(self) -> Clock:
        """The immutable snapshot of the current value (cached until the next change;
        it shares the array, which the next change copies)."""
        snap = self._snapshot
        if snap is None:
            snap = self._snapshot = Clock.of_array(self.array, self.namer)
            self._shared = True
        return snap

    def entries(self) -> Entries:
        """The non-zero entries as ``(actor name, time)`` pairs (cached until the next change)."""
        if self._entries is None:
            name = self.namer.name
            self._entries = tuple(
                (name(s, t), t) for s, t in enumerate(self.array.tolist()) if t)
        return self._entries


def with_entry(base: np.ndarray, slot: int, time: int) -> np.ndarray:
    """A new array: ``base`` (grown with zeros to hold ``slot``) with ``slot`` at ``time``."""
    n = len(base)
    if slot < n:
        array = base.copy()
    else:
        array = np.zeros(slot + 1, _INT)
        array[:n] = base
    array[slot] = time
    return array
