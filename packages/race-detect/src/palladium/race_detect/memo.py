"""Race detection memoised by exact call log (a "verified schedule"): ``MemoDetector``.

A detector's results (reports, an error raised, slots, live records) are a function of
the calls it receives, and a steady launch of a kernel makes the calls of the launch
before. So a ``MemoDetector`` writes each call as one entry (``call_log``: actors and
clocks as per-launch tokens, names and sites left out) and compares it with the entry
at the same position of the last launch of the same kernel that made no race and no
error (a ``RaceMemo``, kept by the simulator's client per kernel). While every entry
matches there is nothing to detect: that launch's detector found no race on the same
calls, and a prefix of a race-free log is race-free. At the first entry that differs
(or a question only a real detector can answer), the calls so far are replayed into an
eager ``RaceDetector`` with this launch's names and sites, and every later call goes to
it: a race is then found at the same access, with the same report (or the same
``DataRaceError``), as a detector called eagerly from the start would find it.

A launch whose whole log matches answers ``num_slots`` and ``live_records`` with the
remembered ones. ``remember()`` (the simulator calls it when a run ended without error)
keeps the log so far if no race was reported and no call failed.

>>> memo = RaceMemo()
>>> def launch(det):
...     core = det.new_actor("core 0")
...     det.register_buffer("x", (4,), "x")
...     dma = det.new_actor("DMA #1", parent=core)
...     det.acquire_all(core, [det.write_release(dma, "x", (slice(0, 2),), site="copy")])
...     det.read(core, "x", (0,), site="kernel.py:3")
...     det.remember()
...     return det
>>> first = launch(MemoDetector("raise", memo))   # no memo yet: detected eagerly
>>> first.matched
False
>>> second = launch(MemoDetector("raise", memo))  # the same calls: nothing to detect
>>> second.matched, second.reports, second.num_slots
(True, [], 2)
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from palladium.race_detect.call_log import (
    ACQUIRE,
    ACQUIRE_ALL,
    BARRIER,
    END,
    FINISH,
    FINISH_RELEASE,
    FREE,
    FREE_ALL,
    JOIN,
    NEW,
    READ,
    READ_RELEASE,
    REGISTER,
    RELEASE,
    WRITE,
    WRITE_RELEASE,
    RaceMemo,
    Remembered,
    control_mask,
    control_region,
    replay,
)
from palladium.race_detect.detector import RaceDetector
from palladium.race_detect.errors import UnknownBufferError
from palladium.race_detect.policy import OnRace, deliver_function
from palladium.race_detect.prepared import PreparedAccess, prepare
from palladium.race_detect.report import RaceReport

__all__ = ["MemoDetector", "RaceMemo"]

_NOTHING = [END]


class MemoDetector:
    """The ``RaceDetector`` interface, memoised by call log (see the module).

    ``new_actor`` and the releases return int tokens standing for the actor or clock a
    ``RaceDetector`` would return: pass them back as those. ``memo``: where the logs
    are kept (None: nothing is compared or kept, every call goes to the eager detector);
    ``key``: which of its logs this launch is compared with. Calls must not overlap (a
    simulator's cores run one at a time); the memo itself is shared safely.
    """

    def __init__(self, on_race: OnRace = "raise", memo: RaceMemo | None = None,
                 key: Hashable = None) -> None:
        deliver_function(on_race)  # a bad policy is refused now, as RaceDetector does
        self.on_race = on_race
        self._memo, self._key = memo, key
        entry = memo.get(key) if memo is not None else None
        self._entry = entry  # the log compared with (None: detecting eagerly)
        self._expected: list[Any] = entry.log if entry is not None else _NOTHING
        self._n = 0  # the position in ``_expected``: it matched ``_expected[:_n]``
        self._tokens = 0  # tokens drawn while matching
        # The calls made before ``_expected[:_n]`` (while matching: none, or those up
        # to a ``free_buffers``), or all calls once eager; the names and sites of all.
        self._log: list[Any] = []
        self._payloads: list[Any] = []
        self._recording = memo is not None
        self._max_calls = memo.max_calls if memo is not None else 0
        self._clean = True  # no call failed
        self._freed = False
        self._shapes: dict[Hashable, tuple[tuple[int, ...], str]] = {}
        self._inner: RaceDetector | None = None
        self._objects: list[Any] = []  # token -> actor or clock, once eager
        if entry is None:
            self._diverge()

    # ------------------------------------------------------------------ the switch
    @property
    def matched(self) -> bool:
        """Whether every call so far matched the remembered log (no detection done)."""
        return self._inner is None

    @property
    def eager(self) -> RaceDetector:
        """The eager detector (the calls so far replayed into it first, if needed)."""
        if self._inner is None:
            self._diverge()
        assert self._inner is not None
        return self._inner

    def _diverge(self) -> RaceDetector:
        """From now on detect eagerly: replay the calls so far into a ``RaceDetector``
        (those matched as the remembered log has them: equal entries are the same
        calls; with this launch's names and sites) and return it."""
        inner = RaceDetector(on_race=self.on_race)
        objects: list[Any] = []
        log = self._log + self._expected[:self._n]
        replay(inner, log, self._payloads, objects)
        assert len(objects) == self._tokens, (len(objects), self._tokens)
        self._inner, self._objects = inner, objects
        self._entry, self._expected, self._n = None, _NOTHING, 0
        # Eager from now on: the names and sites are the detector's to keep (no replay
        # will need them); the log only while the launch may be remembered.
        self._log, self._payloads = (log if self._recording else []), []
        return inner

    def _step(self, entry: tuple[Any, ...], payload: Any) -> RaceDetector | None:
        """A call: None when it matched (nothing to do), else the eager detector (the
        call logged, while it may be remembered)."""
        inner = self._inner
        if inner is None:
            n = self._n
            if self._expected[n] == entry:
                self._n = n + 1
                self._payloads.append(payload)
                return None
            inner = self._diverge()
        if self._recording:
            self._keep(entry)
        return inner

    def _keep(self, entry: tuple[Any, ...]) -> None:
        """Log an eager call (its name or site is not kept: nothing will replay it)."""
        log = self._log
        log.append(entry)
        if len(log) > self._max_calls:
            self._stop_recording()

    def _stop_recording(self) -> None:
        """This launch will not be remembered (too long, or a call failed)."""
        self._recording = False
        self._log = []

    def _failed(self) -> None:
        self._clean = False
        self._stop_recording()

    def _token(self, obj: Any) -> int:
        objects = self._objects
        objects.append(obj)
        return len(objects) - 1

    def remember(self) -> None:
        """The run so far ended without error: keep its log for the next launch if no
        race was reported and no call failed (a log that matched is kept already)."""
        inner = self._inner
        if (inner is None or not self._recording or not self._clean or self._memo is None
                or inner.reports or not self._log):
            return
        self._memo.put(self._key, Remembered([*self._log, END], inner.num_slots,
                                             inner.live_records()))

    # ------------------------------------------------------------------ actors, clocks
    # (the calls a DMA makes match inline, without ``_step``: they are most of a
    # launch's calls)
    def new_actor(self, name: str, parent: int | None = None) -> int:
        entry = (NEW, parent)
        inner = self._inner
        if inner is None:
            n = self._n
            if self._expected[n] == entry:
                self._n = n + 1
                self._payloads.append(name)
                token = self._tokens
                self._tokens = token + 1
                return token
            inner = self._diverge()
        if self._recording:
            self._keep(entry)
        objects = self._objects
        try:
            actor = inner.new_actor(name, None if parent is None else objects[parent])
        except BaseException:
            self._failed()
            raise
        objects.append(actor)
        return len(objects) - 1

    def read_release(self, actor: int, key: Hashable, region: Any = None,
                     site: object = None) -> int:
        return self._release(READ_RELEASE, actor, key, region, site)

    def write_release(self, actor: int, key: Hashable, region: Any = None,
                      site: object = None) -> int:
        return self._release(WRITE_RELEASE, actor, key, region, site)

    def _release(self, kind: int, actor: int, key: Hashable, region: Any,
                 site: object) -> int:
        entry = (kind, actor, key,
                 region if region.__class__ is PreparedAccess else control_region(region))
        inner = self._inner
        if inner is None:
            n = self._n
            if self._expected[n] == entry:
                self._n = n + 1
                self._payloads.append(site)
                token = self._tokens
                self._tokens = token + 1
                return token
            inner = self._diverge()
        if self._recording:
            self._keep(entry)
        method = inner.read_release if kind == READ_RELEASE else inner.write_release
        objects = self._objects
        try:
            clock = method(objects[actor], key, region, site)
        except BaseException:
            self._failed()
            raise
        objects.append(clock)
        return len(objects) - 1

    def acquire_all(self, actor: int, clocks: Sequence[int]) -> None:
        entry = (ACQUIRE_ALL, actor, tuple(clocks))
        inner = self._inner
        if inner is None:
            n = self._n
            if self._expected[n] == entry:
                self._n = n + 1
                self._payloads.append(None)
                return
            inner = self._diverge()
        if self._recording:
            self._keep(entry)
        objects = self._objects
        try:
            inner.acquire_all(objects[actor], [objects[c] for c in clocks])
        except BaseException:
            self._failed()
            raise

    def _returning(self, entry: tuple[Any, ...], method: str) -> int:
        """A call that returns a clock (``release``, ``finish_release``)."""
        inner = self._step(entry, None)
        if inner is None:
            token = self._tokens
            self._tokens = token + 1
            return token
        try:
            clock = getattr(inner, method)(self._objects[entry[1]])
        except BaseException:
            self._failed()
            raise
        return self._token(clock)

    def release(self, actor: int) -> int:
        return self._returning((RELEASE, actor), "release")

    def finish_release(self, actor: int) -> int:
        return self._returning((FINISH_RELEASE, actor), "finish_release")

    def finish(self, actor: int) -> None:
        inner = self._step((FINISH, actor), None)
        if inner is not None:
            self._call(inner.finish, self._objects[actor])

    def join(self, observer: int, other: int) -> None:
        inner = self._step((JOIN, observer, other), None)
        if inner is not None:
            objects = self._objects
            self._call(inner.join, objects[observer], objects[other])

    def acquire(self, actor: int, clock: int) -> None:
        inner = self._step((ACQUIRE, actor, clock), None)
        if inner is not None:
            objects = self._objects
            self._call(inner.acquire, objects[actor], objects[clock])

    def barrier(self, actors: Sequence[int]) -> None:
        actors = tuple(actors)
        inner = self._step((BARRIER, actors), None)
        if inner is not None:
            objects = self._objects
            self._call(inner.barrier, [objects[a] for a in actors])

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> None:
        try:
            method(*args, **kwargs)
        except BaseException:
            self._failed()
            raise

    # ------------------------------------------------------------------ buffers
    def register_buffer(self, key: Hashable, shape: tuple[int, ...], name: str) -> None:
        shape = tuple(int(d) for d in shape)
        inner = self._step((REGISTER, key, shape), name)
        self._shapes[key] = (shape, name)
        if inner is not None:
            self._call(inner.register_buffer, key, shape, name)

    def free_buffer(self, key: Hashable) -> None:
        inner = self._step((FREE, key), None)
        self._shapes.pop(key, None)
        if inner is not None:
            self._call(inner.free_buffer, key)

    def free_buffers(self) -> None:
        """As ``RaceDetector.free_buffers`` (what a simulator calls once its run is
        over). While matching there is nothing to free: no call after it can match."""
        self._shapes = {}
        if self._inner is None:
            # The calls so far (a prefix of the remembered log) and this one: what a
            # replay would make, should another call come.
            self._log = [*self._log, *self._expected[:self._n], (FREE_ALL,)]
            self._payloads.append(None)
            self._freed = True
            if self._expected[self._n] is not END:
                self._entry = None  # the answers remembered are not this log's
            self._expected, self._n = _NOTHING, 0
            return
        if self._recording:
            self._keep((FREE_ALL,))
        self._call(self._inner.free_buffers)

    def prepare(self, key: Hashable, region: Any = None) -> PreparedAccess:
        """As ``RaceDetector.prepare``."""
        if self._inner is not None:
            return self._inner.prepare(key, region)
        try:
            shape, name = self._shapes[key]
        except KeyError:
            raise UnknownBufferError(
                f"prepare: no buffer with key {key!r} is registered") from None
        return prepare(region, shape, name)

    def read(self, actor: int, key: Hashable, region: Any = None, site: object = None,
             *, mask: Any = None) -> None:
        self._access(READ, actor, key, region, site, mask)

    def write(self, actor: int, key: Hashable, region: Any = None, site: object = None,
              *, mask: Any = None) -> None:
        self._access(WRITE, actor, key, region, site, mask)

    def _access(self, kind: int, actor: int, key: Hashable, region: Any, site: object,
                mask: Any) -> None:
        entry = (kind, actor, key, region if region.__class__ is PreparedAccess
                 else control_region(region), control_mask(mask))
        inner = self._step(entry, site)
        if inner is not None:
            method = inner.read if kind == READ else inner.write
            self._call(method, self._objects[actor], key, region, site, mask=mask)

    # ------------------------------------------------------------------ results
    @property
    def reports(self) -> list[RaceReport]:
        """Every race seen so far (none while matching: the remembered log had none)."""
        return [] if self._inner is None else self._inner.reports

    def _answers(self) -> Remembered | None:
        """The remembered answers, if the whole remembered log matched."""
        if self._inner is None and self._entry is not None and self._expected[self._n] is END:
            return self._entry
        return None

    @property
    def num_slots(self) -> int:
        answers = self._answers()
        return answers.num_slots if answers is not None else self.eager.num_slots

    def live_records(self) -> int:
        answers = self._answers()
        if answers is not None:
            return 0 if self._freed else answers.live_records  # (freed: no buffer left)
        return self.eager.live_records()

    def actor(self, token: int) -> Any:
        """The ``Actor`` (or ``Clock``) a token stands for (detecting eagerly from now)."""
        self.eager  # noqa: B018 - replays what was matched
        return self._objects[token]
