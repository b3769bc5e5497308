"""The race detector: actors, synchronisation edges, buffers and accesses."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from palladium.race_detect.actor import Actor
from palladium.race_detect.clock import Clock, VectorClock
from palladium.race_detect.errors import ActorError, RegionError, UnknownBufferError
from palladium.race_detect.policy import OnRace, deliver_function
from palladium.race_detect.prepared import PreparedAccess, prepare
from palladium.race_detect.regions import check_mask
from palladium.race_detect.report import RaceReport
from palladium.race_detect.shadow import BufferShadow, Event
from palladium.race_detect.slot_names import SlotNames


class RaceDetector:
    """A happens-before data-race detector over array buffers (FastTrack-style, precise).

    >>> det = RaceDetector(on_race="collect")
    >>> core = det.new_actor("core 0")
    >>> det.register_buffer("x", (4, 4), "x")
    >>> dma = det.new_actor("DMA #1", parent=core)
    >>> det.write(dma, "x", (slice(0, 2),), site="copy in")
    >>> det.read(core, "x", (0, 1), site="kernel.py:3")   # core did not wait: a race
    >>> len(det.reports)
    1
    >>> det.finish(dma); det.join(core, dma)             # waited on the DMA's semaphore
    >>> det.read(core, "x", (0, 1), site="kernel.py:5")
    >>> len(det.reports)
    1

    All methods are thread-safe (one lock). Policies are applied after the lock is
    released, so an ``on_race`` callable may call back into the detector.
    """

    def __init__(self, on_race: OnRace = "raise") -> None:
        self._deliver = deliver_function(on_race)
        self.on_race = on_race
        self._lock = threading.Lock()
        self._occupants: list[Actor] = []  # slot -> the actor holding it now
        self._free: set[int] = set()  # slots whose occupant finished
        # Arrays of a capacity that grows by doubling (slots past ``len(_occupants)`` are
        # unused), for the vectorised search of a reusable slot: slot -> the last time
        # used in it so far, slot -> in ``_free``.
        self._final = np.zeros(64, np.int64)
        self._free_mask = np.zeros(64, bool)
        self._buffers: dict[Hashable, BufferShadow] = {}
        self._reports: list[RaceReport] = []
        self._serial = 0
        # Who made each time of each slot: the names every clock of this detector shows.
        self.slot_names = SlotNames(shared=True)

    # ----------------------------------------------------------------- actors
    def new_actor(self, name: str, parent: Actor | None = None) -> Actor:
        """A new actor; with ``parent`` a fork (the parent's past happens-before it)."""
        with self._lock:
            slot = self._reusable_slot(parent)
            if slot is None:
                slot = len(self._occupants)
                self._occupants.append(None)  # type: ignore[arg-type]
                if slot >= len(self._final):
                    grow = len(self._final)
                    self._final = np.concatenate((self._final, np.zeros(grow, np.int64)))
                    self._free_mask = np.concatenate((self._free_mask, np.zeros(grow, bool)))
            else:
                self._free.discard(slot)
                self._free_mask[slot] = False
            time = int(self._final[slot]) + 1
            if parent is None:
                clock = VectorClock(namer=self.slot_names)
                clock.set(slot, time, name)
                actor = Actor(name, slot, clock)
            else:
                # The child's clock is the parent's times (shared: the parent's tick
                # below copies them) plus its own slot; it gets an array of its own only
                # if it ever needs one (``Actor.vector``): a DMA never does.
                vector = parent.vector
                self.slot_names.set(slot, time, name)
                actor = Actor.forked(name, slot, vector.share(), vector.namer, time, vector)
                if not parent.finished:
                    vector.increment(parent.slot)
            self._occupants[slot] = actor
            return actor

    def _reusable_slot(self, parent: Actor | None) -> int | None:
        # Why reuse is exact: a slot is a chain of actors. The new occupant starts at
        # (old occupant's final time) + 1 and inherits the parent's clock, which already
        # has clock[slot] >= that final time, i.e. the whole old occupant happens-before
        # the new one. An old epoch (slot, t <= final) is in a clock C's past iff
        # C[slot] >= t: C got that value either from the old occupant itself (the usual
        # vector-clock argument) or from the new occupant, whose past contains every
        # event of the old one. A new epoch (slot, t > final) can only be known through
        # the new occupant. So sharing the entry never orders two accesses that are not
        # ordered, nor misses an order that exists. Without the parent condition (a
        # finished DMA nobody waited for) the old epochs would look ordered after the
        # new occupant's start, so such slots stay unused until someone's past has them.
        if parent is None:
            return None
        times, final, free = parent.vector.array, self._final, self._free
        hints = parent.reusable_slots
        while hints:  # the slots of the DMAs the parent waited for: O(1), not O(free)
            slot = hints.pop()
            if slot in free and times[slot] >= final[slot]:
                return slot
        if not free:
            return None
        # The lowest free slot whose final time the parent has seen (vectorised: the
        # free slots are many when the parent waits for few of its DMAs' ends).
        n = min(len(times), len(self._occupants))
        ok = self._free_mask[:n] & (times[:n] >= final[:n])
        slot = int(ok.argmax())
        return slot if ok[slot] else None

    def finish(self, actor: Actor) -> None:
        """``actor`` ends (a DMA completed); its slot may then be reused."""
        with self._lock:
            self._finish(actor)

    def _finish(self, actor: Actor) -> None:
        if actor.finished:
            return
        actor.finished = True
        slot = actor.slot
        self._final[slot] = actor.time
        if self._occupants[slot] is actor:
            self._free.add(slot)
            self._free_mask[slot] = True

    @property
    def num_slots(self) -> int:
        """How many clock slots exist (bounded by how many actors were ever in flight)."""
        with self._lock:
            return len(self._occupants)

    # ----------------------------------------------------------------- synchronisation
    def join(self, observer: Actor, other: Actor) -> None:
        """Everything ``other`` did so far happens-before ``observer``'s future."""
        with self._lock:
            if observer is other:
                return
            observer.vector.join(other.vector)
            if other.finished:
                observer.hint_reusable(other.slot)
            _tick(other)

    def release(self, actor: Actor) -> Clock:
        """A snapshot of ``actor``'s clock for a later ``acquire`` (then ``actor`` ticks).

        A finished actor does not tick: its snapshot holds its final time and names its
        slot (``Clock.finished_slot``), which the acquirer may then reuse."""
        with self._lock:
            return _release(actor)

    def finish_release(self, actor: Actor) -> Clock:
        """``finish`` then ``release`` in one call (a DMA completes and signals its
        receive semaphore): the released clock holds the actor's final time and names
        its slot."""
        with self._lock:
            self._finish(actor)
            return _release(actor)

    def read_release(self, actor: Actor, key: Hashable, region: Any = None,
                     site: object = None) -> Clock:
        """``read`` then ``release`` in one call (a DMA reads its source and signals its
        send semaphore): the clock released. Races are delivered between the two, as
        two calls would."""
        with self._lock:
            reports = self._record(actor, key, region, site, None, False)
            if not reports:
                return _release(actor)
        self._deliver(reports)
        with self._lock:
            return _release(actor)

    def write_release(self, actor: Actor, key: Hashable, region: Any = None,
                      site: object = None) -> Clock:
        """``write`` then ``finish_release`` in one call (a DMA writes its destination,
        completes and signals its receive semaphore): the clock released. Races are
        delivered between the two, as two calls would."""
        with self._lock:
            if actor.own_vector is None and not actor.finished:
                # The clock the release hands over (the final time, the slot to reuse)
                # serves the write's event too: one snapshot, not two.
                actor.final_fork_clock()
            try:
                reports = self._record(actor, key, region, site, None, True)
            except BaseException:
                actor.drop_fork_clock()  # not finished: its next snapshot is an ordinary one
                raise
            if not reports:
                self._finish(actor)
                return _release(actor)
            actor.drop_fork_clock()  # not finished before the delivery
        self._deliver(reports)
        with self._lock:
            self._finish(actor)
            return _release(actor)

    def acquire(self, actor: Actor, clock: Clock) -> None:
        """Everything before the ``release`` that made ``clock`` happens-before ``actor``'s future."""
        with self._lock:
            actor.vector.join(clock)
            if clock.finished_slot >= 0:
                actor.hint_reusable(clock.finished_slot)

    def acquire_all(self, actor: Actor, clocks: Sequence[Clock]) -> None:
        """``acquire`` of each of ``clocks`` in turn (what one semaphore wait observes)."""
        with self._lock:
            vector = actor.vector
            for clock in clocks:
                vector.join(clock)
                if clock.finished_slot >= 0:
                    actor.hint_reusable(clock.finished_slot)

    def barrier(self, actors: Sequence[Actor]) -> None:
        """All of ``actors`` join each other."""
        with self._lock:
            unique = list({id(a): a for a in actors}.values())
            merged = VectorClock(namer=self.slot_names)
            for actor in unique:
                merged.join(actor.vector)
            for actor in unique:
                actor.vector.join(merged)
                _tick(actor)

    # ----------------------------------------------------------------- buffers
    def register_buffer(self, key: Hashable, shape: tuple[int, ...], name: str) -> None:
        """Start tracking a buffer; ``name`` is how reports call it."""
        with self._lock:
            self._buffers[key] = BufferShadow(tuple(int(d) for d in shape), name)

    def free_buffer(self, key: Hashable) -> None:
        """Forget a buffer's shadow state."""
        with self._lock:
            self._buffers.pop(key, None)

    def free_buffers(self) -> None:
        """Forget every buffer's shadow state (reports, actors and clocks stay): what a
        simulator calls once its run is over, so that the state (an event per access
        still named) is freed at once by reference counting, whatever holds the detector.

        >>> det = RaceDetector()
        >>> det.register_buffer("x", (4,), "x")
        >>> det.write(det.new_actor("core 0"), "x", (0,), site="k.py:1")
        >>> det.live_records()
        1
        >>> det.free_buffers(); det.live_records()
        0
        """
        with self._lock:
            self._buffers = {}

    def prepare(self, key: Hashable, region: Any = None) -> PreparedAccess:
        """``region`` of buffer ``key`` checked and normalised once, for ``read``/``write``.

        A simulator keeps it with its own plan of the region and passes it instead of
        the region on every access (the detector then does no work on the region and
        keeps no cache). It is a plain value: valid for any buffer of the same shape.

        >>> det = RaceDetector()
        >>> det.register_buffer("x", (4, 4), "x")
        >>> rows = det.prepare("x", (slice(0, 2),))
        >>> det.write(det.new_actor("core 0"), "x", rows, site="kernel.py:3")
        """
        with self._lock:
            shadow = self._shadow(key, "prepare", None)
            shape, name = shadow.shape, shadow.name
        return prepare(region, shape, name)

    def read(
        self,
        actor: Actor,
        key: Hashable,
        region: Any = None,
        site: object = None,
        *,
        mask: Any = None,
    ) -> None:
        """``actor`` reads ``buffer[region]`` (only the True elements of ``mask``).

        ``region``: a tuple of ``int | slice``, None (the whole buffer), or a
        ``PreparedAccess`` of the region (``prepare``), which skips checking it again.
        """
        self._access(actor, key, region, site, mask, False)

    def write(
        self,
        actor: Actor,
        key: Hashable,
        region: Any = None,
        site: object = None,
        *,
        mask: Any = None,
    ) -> None:
        """``actor`` writes ``buffer[region]`` (only the True elements of ``mask``); ``region``
        as for ``read``."""
        self._access(actor, key, region, site, mask, True)

    def _shadow(self, key: Hashable, what: str, actor: Actor | None, site: object = None) -> BufferShadow:
        try:
            return self._buffers[key]
        except KeyError:
            who = "" if actor is None else f" by {actor.name!r} at {site}"
            raise UnknownBufferError(
                f"{what}{who}: no buffer with key {key!r} is registered"
            ) from None

    def _access(
        self, actor: Actor, key: Hashable, region: Any, site: object, mask: Any, is_write: bool
    ) -> None:
        with self._lock:
            reports = self._record(actor, key, region, site, mask, is_write)
            if not reports:
                return
        self._deliver(reports)

    def _record(
        self, actor: Actor, key: Hashable, region: Any, site: object, mask: Any, is_write: bool
    ) -> list[RaceReport] | None:
        """One access, under the lock: the reports it makes (kept), or None."""
        shadow = self._buffers.get(key)
        if shadow is None:
            shadow = self._shadow(key, "write" if is_write else "read", actor, site)
        if actor.finished:
            raise ActorError(
                f"{actor.name!r} accessed {shadow.name!r} at {site} after it finished"
            )
        if region.__class__ is not PreparedAccess:
            region = prepare(region, shadow.shape, shadow.name)
        elif region.shape != shadow.shape:
            raise RegionError(
                f"buffer {shadow.name!r} of shape {shadow.shape}: {region!r} was "
                f"prepared for another shape"
            )
        full, box, size = region.region, region.box, region.size
        bool_mask = None if mask is None else check_mask(mask, full, shadow.shape, shadow.name)
        slot = actor.slot
        self._serial = serial = self._serial + 1
        # The clock's entries are only needed if a report is made: the snapshot shares
        # the clock's array (copied when the clock next changes) and is shared by the
        # actor's accesses until then; Event.access turns it into entries.
        clock = actor.own_vector
        if clock is None:  # a forked actor without its own clock (a DMA): base + own
            times = actor.base
            event = Event(slot, actor.own, serial, actor.name, is_write, shadow.name,
                          full, site, actor.fork_clock(), bool_mask is not None)
        else:
            times = clock.array
            event = Event(slot, int(times[slot]), serial, actor.name, is_write,
                          shadow.name, full, site, clock.snapshot(), bool_mask is not None)
        # The box path takes the actor's own slot apart (everything of it is in the
        # actor's past), so ``base`` serves as a forked actor's times there.
        tried = bool_mask is None and box is not None
        if tried and shadow.access_box(box, size, event, times, is_write, slot):
            return None  # a uniform box and no race: the common case, O(1)
        times = actor.vector.array
        try:
            races = shadow.access(event, times, is_write, full, bool_mask, box, size, tried)
        except IndexError as error:  # numpy's own bounds message, with our names
            raise RegionError(f"buffer {shadow.name!r}: {error}") from error
        if not races:
            return None
        access = event.access
        reports = [RaceReport(earlier.access, access, element) for earlier, element in races]
        self._reports.extend(reports)
        return reports

    def live_records(self) -> int:
        """Write records plus read sets held by all buffers' shadow state (bounded by size)."""
        with self._lock:
            return sum(sum(b.live_records()) for b in self._buffers.values())

    @property
    def reports(self) -> list[RaceReport]:
        """Every race seen so far, whatever the policy (a copy)."""
        with self._lock:
            return list(self._reports)


def _release(actor: Actor) -> Clock:
    if actor.own_vector is None:  # a forked actor without its own clock: base + own
        if actor.finished:
            clock = actor.final_fork_clock()  # write_release's, or made now
            actor.drop_fork_clock()
            return clock
        snapshot = actor.fork_clock()
        actor.tick()
        return snapshot
    snapshot = actor.own_vector.snapshot()
    if actor.finished:
        return Clock.of_array(snapshot.array, snapshot.namer, actor.slot)
    _tick(actor)
    return snapshot


def _tick(actor: Actor) -> None:
    # A finished actor does nothing more, so it needs no new epoch; keeping its time
    # fixed keeps the slot's final time valid for reuse.
    if not actor.finished:
        actor.tick()
