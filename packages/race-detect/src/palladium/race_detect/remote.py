"""Vector clocks that cross processes (a simulation split over processes).

Each process has its own ``RaceDetector``, whose clock slots mean nothing elsewhere. A
clock leaves a process as *entries* ``(process, slot, time, name)`` naming each slot
by the process that owns it; the receiving process maps every foreign
``(process, slot)`` to a *proxy slot* of its own (allocated once, never reused), so the
times carry over unchanged. A slot is a chain of actors whose times only grow, so the
proxy stays exact when the owner reuses its slot. A remote actor's access (a DMA's
write applied where it lands) is checked with :meth:`ClockExchange.actor`: an actor on
the proxy slot of the remote actor, at its time, with its whole clock.

>>> from palladium.race_detect import RaceDetector
>>> sender, receiver = RaceDetector(), RaceDetector()
>>> a = ClockExchange(sender, 0); b = ClockExchange(receiver, 1)
>>> core = sender.new_actor("core 0")
>>> entries = a.export(sender.release(core))
>>> b.imported(entries).entries()
(('core 0', 1),)
"""

from __future__ import annotations

import numpy as np

from palladium.race_detect.actor import Actor
from palladium.race_detect.clock import Clock, VectorClock
from palladium.race_detect.detector import RaceDetector

__all__ = ["ClockExchange", "Entries"]

Entries = tuple[tuple[int, int, int, str], ...]


class ClockExchange:
    """Translates clocks between this process's detector and the other processes'."""

    def __init__(self, detector: RaceDetector, process: int) -> None:
        self.detector = detector
        self.process = process
        self._proxy: dict[tuple[int, int], int] = {}  # (process, slot) -> local slot
        self._origin: dict[int, tuple[int, int]] = {}  # local proxy slot -> (process, slot)

    def export(self, clock: Clock) -> Entries:
        """``clock`` as entries every process can import."""
        origin, me = self._origin, self.process
        return tuple(
            (*origin.get(s, (me, s)), t, n)
            for s, (t, n) in enumerate(zip(clock.times, clock.names))
            if t
        )

    def imported(self, entries: Entries) -> Clock:
        """The local clock of ``entries`` (from any process). The names of another
        process's times go into the detector's ``slot_names`` (on their proxy slots);
        this process's own times it names already."""
        names = self.detector.slot_names
        times: dict[int, int] = {}
        for process, slot, time, name in entries:
            local = self.slot(process, slot, name)
            if process != self.process:
                names.set(local, time, name)
            times[local] = time
        array = np.zeros(max(times) + 1 if times else 0, np.int64)
        for local, time in times.items():
            array[local] = time
        return Clock.of_array(array, names)

    def slot(self, process: int, slot: int, name: str = "") -> int:
        """The local slot of ``slot`` of ``process`` (a proxy slot for another's)."""
        if process == self.process:
            return slot
        local = self._proxy.get((process, slot))
        if local is None:
            # A root actor that never acts nor finishes: its slot is never reused.
            local = self.detector.new_actor(f"{name} (process {process})").slot
            self._proxy[(process, slot)] = local
            self._origin[local] = (process, slot)
        return local

    def actor(self, name: str, process: int, slot: int, entries: Entries) -> Actor:
        """An actor standing for ``slot`` of ``process`` at the time ``entries`` give it,
        with their whole past: its accesses are checked as that actor's."""
        clock = self.imported(entries)
        local = self.slot(process, slot, name)
        return Actor(name, local, VectorClock(clock.array, namer=clock.namer))
