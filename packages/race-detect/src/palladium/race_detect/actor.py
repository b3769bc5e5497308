"""Actors: a simulated core, a DMA in flight — anything with its own program order."""

from __future__ import annotations

import numpy as np

from palladium.race_detect.clock import Clock, VectorClock, with_entry
from palladium.race_detect.slot_names import SlotNames

REUSABLE_HINTS = 64


class Actor:
    """An actor of a ``RaceDetector`` (made by ``RaceDetector.new_actor``).

    ``name`` is the user-facing name ("device 0 core 1", "DMA #12 x->scratch_shapes[0]");
    ``slot`` is the vector-clock slot it occupies (slots of finished actors are reused).

    A forked actor (``forked``) starts without a clock of its own: its clock is its
    parent's snapshot ``base`` (shared, never changed) with its own slot at ``own``,
    which is all a DMA ever needs (it never joins anything). ``vector`` builds the
    mutable clock on first use; until then the detector reads ``base`` and ``own``.
    """

    __slots__ = ("_fork_clock", "base", "finished", "name", "namer", "origin", "own",
                 "own_vector", "reusable_slots", "slot")

    def __init__(self, name: str, slot: int, clock: VectorClock) -> None:
        self.name = name
        self.slot = slot
        self.finished = False
        # The mutable clock the detector advances (``clock()`` gives users a snapshot);
        # None while a forked actor has no clock of its own (``vector`` builds it).
        self.own_vector: VectorClock | None = clock
        # Forked and without its own clock yet: the parent's times, and this slot's time.
        self.base: np.ndarray | None = None
        self.namer: SlotNames | None = None
        self.origin: VectorClock | None = None  # the parent's clock, ``base``'s source
        self.own = 0
        self._fork_clock: Clock | None = None  # the snapshot of base + own (cached)
        # Slots of finished actors whose final time this actor acquired, newest last (at
        # most ``REUSABLE_HINTS``: ``hint_reusable`` drops the oldest): where
        # ``RaceDetector.new_actor`` looks first for a slot to give its child. A list,
        # not a deque: one is made per DMA, and a list is made faster.
        self.reusable_slots: list[int] = []

    @classmethod
    def forked(cls, name: str, slot: int, base: np.ndarray, namer: SlotNames,
               time: int, origin: VectorClock | None = None) -> Actor:
        """An actor at ``time`` of ``slot`` whose past is ``base`` (its parent's times,
        shared from ``origin``, the parent's clock: nobody may change them), without a
        clock of its own yet."""
        actor = cls.__new__(cls)
        actor.name = name
        actor.slot = slot
        actor.finished = False
        actor.own_vector = None
        actor.base = base
        actor.namer = namer
        actor.origin = origin
        actor.own = time
        actor._fork_clock = None
        actor.reusable_slots = []
        return actor

    @property
    def vector(self) -> VectorClock:
        """The actor's mutable clock (built from ``base`` on first use)."""
        vector = self.own_vector
        if vector is None:
            assert self.base is not None and self.namer is not None
            vector = VectorClock.owning(with_entry(self.base, self.slot, self.own), self.namer)
            self.own_vector = vector
            self.base = self._fork_clock = self.origin = None
        return vector

    def fork_clock(self) -> Clock:
        """The snapshot of a forked actor without its own clock (``base`` + ``own``)."""
        clock = self._fork_clock
        if clock is None:
            assert self.base is not None and self.namer is not None
            clock = self._fork_clock = Clock.of_fork(self.base, self.namer, self.slot, self.own,
                                                     origin=self.origin)
        return clock

    def final_fork_clock(self) -> Clock:
        """The release of a finished forked actor without its own clock: ``base`` +
        ``own``, naming its slot (``Clock.finished_slot``). Kept as its snapshot until
        ``drop_fork_clock``, so the last access's event can share it."""
        clock = self._fork_clock
        if clock is None or clock.finished_slot != self.slot:
            assert self.base is not None and self.namer is not None
            clock = self._fork_clock = Clock.of_fork(self.base, self.namer, self.slot, self.own,
                                                     self.slot, self.origin)
        return clock

    def drop_fork_clock(self) -> None:
        """Forget the cached snapshot (the next one is made afresh)."""
        self._fork_clock = None

    def tick(self) -> None:
        """The actor's own time advances (its later accesses follow what it released)."""
        if self.own_vector is None:
            self.own += 1
            self._fork_clock = None
        else:
            self.own_vector.increment(self.slot)

    def hint_reusable(self, slot: int) -> None:
        """``slot``'s finished actor happens-before this actor's future: a slot its next
        child may take."""
        hints = self.reusable_slots
        hints.append(slot)
        if len(hints) > REUSABLE_HINTS:
            del hints[0]

    def clock(self) -> Clock:
        """A snapshot of the actor's vector clock."""
        if self.own_vector is None:
            return self.fork_clock()
        return self.own_vector.snapshot()

    @property
    def time(self) -> int:
        """The actor's current epoch time (its own clock entry)."""
        if self.own_vector is None:
            return self.own
        return self.own_vector.time(self.slot)

    def __repr__(self) -> str:
        state = ", finished" if self.finished else ""
        return f"Actor({self.name!r}, slot={self.slot}, time={self.time}{state})"
