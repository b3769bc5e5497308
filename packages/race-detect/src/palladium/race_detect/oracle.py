"""A brute-force reference detector: keeps every access and rescans it.

It implements the definition in ``API.md`` literally and is the oracle that
``RaceDetector`` is tested against (and the quadratic baseline it is benchmarked
against). Never use it for real runs: time and memory grow with the length of the run.

- Happens-before uses textbook vector clocks with one entry per *actor* ever made (no
  slot reuse, no epochs in the clocks): an access stores its actor's full clock.
- Every element keeps its full history: the list of every access that touched it, in
  program order (elements with the same history share one node of a persistent list).
- For an access X on an element: W is the last write in the history; the recorded
  reads are the reads after W that no later read (after W) happened after. X races
  with W unless W -> X, and, if X is a write, with each recorded read R unless R -> X.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from palladium.race_detect.errors import ActorError, RegionError, UnknownBufferError
from palladium.race_detect.policy import OnRace, deliver_function
from palladium.race_detect.prepared import PreparedAccess, prepare
from palladium.race_detect.regions import check_mask, flat_elements, normalise
from palladium.race_detect.report import Access, RaceReport

ActorClock = dict[int, int]  # actor number -> time; never mutated once shared


@dataclass(frozen=True)
class OracleActor:
    """An actor of the brute-force detector (``number`` indexes its clock entry)."""

    name: str
    number: int


@dataclass(frozen=True)
class OracleClock:
    """A released clock of the brute-force detector."""

    clock: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class _Event:
    serial: int
    actor: int
    clock: ActorClock
    is_write: bool
    access: Access


def _before(a: _Event, b: _Event) -> bool:
    """``a -> b``: every entry of a's clock is <= b's (a != b in program order)."""
    return all(t <= b.clock.get(k, 0) for k, t in a.clock.items())


class BruteForceDetector:
    """The same API as ``RaceDetector``, implemented by keeping and rescanning everything."""

    def __init__(self, on_race: OnRace = "collect") -> None:
        self._deliver = deliver_function(on_race)
        self._clocks: list[ActorClock] = []
        self._names: list[str] = []
        self._finished: set[int] = set()
        self._buffers: dict[Hashable, tuple[tuple[int, ...], str, np.ndarray]] = {}
        self._history: list[tuple[int, _Event | None]] = [(0, None)]  # node -> (prev, event)
        self._events: list[_Event] = []
        self._reports: list[RaceReport] = []

    @property
    def reports(self) -> list[RaceReport]:
        """Every race seen so far."""
        return list(self._reports)

    def _tick(self, number: int) -> None:
        clock = dict(self._clocks[number])
        clock[number] += 1
        self._clocks[number] = clock

    def _merge(self, number: int, other: ActorClock) -> None:
        clock = dict(self._clocks[number])
        for k, t in other.items():
            clock[k] = max(clock.get(k, 0), t)
        self._clocks[number] = clock

    def new_actor(self, name: str, parent: OracleActor | None = None) -> OracleActor:
        """A new actor; with ``parent`` a fork."""
        number = len(self._clocks)
        clock = {} if parent is None else dict(self._clocks[parent.number])
        clock[number] = 1
        self._clocks.append(clock)
        self._names.append(name)
        if parent is not None:
            self._tick(parent.number)
        return OracleActor(name, number)

    def finish(self, actor: OracleActor) -> None:
        """The actor ends."""
        self._finished.add(actor.number)

    def join(self, observer: OracleActor, other: OracleActor) -> None:
        """``other``'s past happens-before ``observer``'s future."""
        if observer.number != other.number:
            self._merge(observer.number, self._clocks[other.number])
            self._tick(other.number)

    def release(self, actor: OracleActor) -> OracleClock:
        """A clock for ``acquire``."""
        snapshot = OracleClock(tuple(self._clocks[actor.number].items()))
        self._tick(actor.number)
        return snapshot

    def acquire(self, actor: OracleActor, clock: OracleClock) -> None:
        """The release's past happens-before ``actor``'s future."""
        self._merge(actor.number, dict(clock.clock))

    def barrier(self, actors: Sequence[OracleActor]) -> None:
        """All of ``actors`` join each other."""
        merged: ActorClock = {}
        for actor in actors:
            for k, t in self._clocks[actor.number].items():
                merged[k] = max(merged.get(k, 0), t)
        for number in {a.number for a in actors}:
            self._merge(number, merged)
            self._tick(number)

    def register_buffer(self, key: Hashable, shape: tuple[int, ...], name: str) -> None:
        """Start tracking a buffer."""
        size = int(np.prod(shape, dtype=np.int64))
        self._buffers[key] = (tuple(shape), name, np.zeros(size, np.int64))

    def free_buffer(self, key: Hashable) -> None:
        """Forget a buffer."""
        self._buffers.pop(key, None)

    def prepare(self, key: Hashable, region: Any = None) -> PreparedAccess:
        """``region`` of buffer ``key`` prepared (the oracle reads only its region)."""
        if key not in self._buffers:
            raise UnknownBufferError(f"no buffer with key {key!r} is registered")
        shape, name, _ = self._buffers[key]
        return prepare(region, shape, name)

    def read(
        self,
        actor: OracleActor,
        key: Hashable,
        region: Any = None,
        site: object = None,
        *,
        mask: Any = None,
    ) -> None:
        """Record a read."""
        self._access(actor, key, region, site, mask, False)

    def write(
        self,
        actor: OracleActor,
        key: Hashable,
        region: Any = None,
        site: object = None,
        *,
        mask: Any = None,
    ) -> None:
        """Record a write."""
        self._access(actor, key, region, site, mask, True)

    def _full_history(self, node: int) -> list[_Event]:
        events: list[_Event] = []
        while node:
            node, event = self._history[node]
            assert event is not None
            events.append(event)
        events.reverse()
        return events

    def _races(self, history: list[_Event], x: _Event) -> list[_Event]:
        last_write = max((i for i, e in enumerate(history) if e.is_write), default=-1)
        reads = history[last_write + 1 :]
        racing = []
        if last_write >= 0 and not _before(history[last_write], x):
            racing.append(history[last_write])
        if x.is_write:
            recorded = [
                r for i, r in enumerate(reads) if not any(_before(r, s) for s in reads[i + 1 :])
            ]
            racing.extend(r for r in recorded if not _before(r, x))
        return racing

    def _access(
        self,
        actor: OracleActor,
        key: Hashable,
        region: Any,
        site: object,
        mask: Any,
        is_write: bool,
    ) -> None:
        if key not in self._buffers:
            raise UnknownBufferError(f"no buffer with key {key!r} is registered")
        if actor.number in self._finished:
            raise ActorError(f"{actor.name!r} accessed a buffer after it finished")
        shape, name, nodes = self._buffers[key]
        if isinstance(region, PreparedAccess):
            if region.shape != shape:
                raise RegionError(f"buffer {name!r}: {region!r} was prepared for another shape")
            region = region.region
        full = normalise(region, shape, name)
        bool_mask = None if mask is None else check_mask(mask, full, shape, name)
        clock = self._clocks[actor.number]
        entries = tuple(
            (self._names[k], t) for k, t in sorted(clock.items(), key=lambda kv: kv[0]) if t
        )
        access = Access(
            actor.name,
            "write" if is_write else "read",
            name,
            full,
            site,
            entries,
            bool_mask is not None,
        )
        x = _Event(len(self._events) + 1, actor.number, clock, is_write, access)
        self._events.append(x)
        elements = flat_elements(full, shape, bool_mask)
        new_reports: dict[int, RaceReport] = {}
        new_nodes: dict[int, int] = {}
        for element in elements.tolist():
            node = int(nodes[element])
            if node not in new_nodes:
                for earlier in self._races(self._full_history(node), x):
                    if earlier.serial not in new_reports:
                        index = tuple(int(i) for i in np.unravel_index(element, shape))
                        new_reports[earlier.serial] = RaceReport(earlier.access, access, index)
                self._history.append((node, x))
                new_nodes[node] = len(self._history) - 1
            nodes[element] = new_nodes[node]
        reports = list(new_reports.values())
        self._reports.extend(reports)
        self._deliver(reports)
