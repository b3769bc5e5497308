"""Actors: a simulated core, a DMA in flight — anything with its own program order."""

from __future__ import annotations

from palladium.race_detect.clock import Clock, VectorClock

REUSABLE_HINTS = 64


class Actor:
    """An actor of a ``RaceDetector`` (made by ``RaceDetector.new_actor``).

    ``name`` is the user-facing name ("device 0 core 1", "DMA #12 x->scratch_shapes[0]");
    ``slot`` is the vector-clock slot it occupies (slots of finished actors are reused).
    """

    __slots__ = ("name", "slot", "finished", "vector", "reusable_slots")

    def __init__(self, name: str, slot: int, clock: VectorClock) -> None:
        self.name = name
        self.slot = slot
        self.finished = False
        # The mutable clock the detector advances (``clock()`` gives users a snapshot).
        self.vector = clock
        # Slots of finished actors whose final time this actor acquired, newest last (at
        # most ``REUSABLE_HINTS``: ``hint_reusable`` drops the oldest): where
        # ``RaceDetector.new_actor`` looks first for a slot to give its child. A list,
        # not a deque: one is made per DMA, and a list is made faster.
        self.reusable_slots: list[int] = []

    def hint_reusable(self, slot: int) -> None:
        """``slot``'s finished actor happens-before this actor's future: a slot its next
        child may take."""
        hints = self.reusable_slots
        hints.append(slot)
        if len(hints) > REUSABLE_HINTS:
            del hints[0]

    def clock(self) -> Clock:
        """A snapshot of the actor's vector clock."""
        return self.vector.snapshot()

    @property
    def time(self) -> int:
        """The actor's current epoch time (its own clock entry)."""
        return self.vector.time(self.slot)

    def __repr__(self) -> str:
        state = ", finished" if self.finished else ""
        return f"Actor({self.name!r}, slot={self.slot}, time={self.time}{state})"
