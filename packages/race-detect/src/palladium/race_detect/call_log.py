"""The race detector's calls as a log: one tuple per call, its replay, and the memo that
keeps the logs of race-free launches (``RaceMemo``).

An entry holds what the detector's decisions depend on (its *control*): the kind of
call, actors and clocks as per-launch tokens (numbered from 0 in the order they are
made), the buffer key, the region (a ``PreparedAccess``, compared by region and shape, or
a plain tuple of ints and slices), the shape a buffer is registered with, a mask's
shape and bits. Names and sites are not in it: the detector only stores them in reports
and messages, so they decide nothing; they travel beside the entry (its *payload*).
Two calls with equal entries therefore get the same answer from a detector in the same
state: no race, the same slots, the same records, the same error or none.

``replay`` makes the calls of a log on a ``RaceDetector`` with the payloads of the
launch that made them, so whatever it stores for later reports is that launch's own.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import numpy as np

from palladium.race_detect.detector import RaceDetector
from palladium.race_detect.prepared import PreparedAccess

__all__ = ["END", "Opaque", "RaceMemo", "Remembered", "control_mask", "control_region", "replay"]

MAX_CALLS = 1 << 20  # a longer log is not remembered (~110 bytes per call: <= ~110 MiB)
MAX_KEYS = 2  # logs kept per memo (a kernel run at two sizes or with two seeds)


# The kinds of call (the first item of an entry).
NEW, READ_RELEASE, WRITE_RELEASE, ACQUIRE_ALL, READ, WRITE = range(6)
RELEASE, FINISH_RELEASE, FINISH, JOIN, ACQUIRE, BARRIER = range(6, 12)
REGISTER, FREE, FREE_ALL = range(12, 15)


class Opaque:
    """An argument the log cannot compare exactly (a list region, a non-boolean mask):
    equal to nothing but itself, so an entry holding one never matches another launch's."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__


class _End:
    """The mark after a remembered log's last entry: equal to no entry."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "END"


END: Any = _End()


class Remembered(NamedTuple):
    """A launch's log that made no race and no error (its entries, then ``END``), and
    the detector's answers at its end."""

    log: list[Any]
    num_slots: int
    live_records: int


class RaceMemo:
    """The remembered logs of one kernel (the client keeps one per kernel): by a key
    the simulator chooses (the slice's size and its options), the last ``max_keys``
    used. Thread-safe."""

    def __init__(self, max_keys: int = MAX_KEYS, max_calls: int = MAX_CALLS) -> None:
        self.max_keys = max_keys
        self.max_calls = max_calls
        self._entries: dict[Hashable, Remembered] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Remembered | None:
        with self._lock:
            return self._entries.get(key)

    def put(self, key: Hashable, entry: Remembered) -> None:
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = entry  # newest last
            while len(self._entries) > self.max_keys:
                del self._entries[next(iter(self._entries))]

    def reserve(self, keys: int) -> None:
        """Keep at least ``keys`` logs from now on (a client whose every launch runs
        under several keys, such as other seeds, must not push its own logs out)."""
        with self._lock:
            self.max_keys = max(self.max_keys, keys)

    def clear(self) -> None:
        """Forget every log."""
        with self._lock:
            self._entries = {}

    def calls(self) -> int:
        """How many calls the kept logs hold together."""
        with self._lock:
            return sum(len(e.log) - 1 for e in self._entries.values())


def _plain(index: Any) -> bool:
    t = index.__class__
    if t is int:
        return True
    if t is slice:
        return all(v is None or v.__class__ is int for v in (index.start, index.stop, index.step))
    return False


def control_region(region: Any) -> Any:
    """A region as the log compares it: a ``PreparedAccess`` itself (equal when its
    region and shape are), None, a tuple of plain ints and slices (immutable, compared
    by value); anything else ``Opaque``."""
    if region is None or region.__class__ is PreparedAccess:
        return region
    if region.__class__ is tuple and all(_plain(i) for i in region):
        return region
    if _plain(region):
        return region
    return Opaque(region)


def control_mask(mask: Any) -> Any:
    """A mask as the log compares it: None, ``(shape, bits)`` of a boolean array (what
    the detector reads of it, copied now: the caller may change its array later), or
    ``Opaque`` (the detector refuses such a mask: the call raises)."""
    if mask is None:
        return None
    array = np.asarray(mask)
    if array.dtype != np.bool_:
        return Opaque(mask)
    return (array.shape, array.tobytes())


def _mask(control: Any) -> Any:
    if control is None:
        return None
    if control.__class__ is Opaque:
        return control.value
    shape, bits = control
    return np.frombuffer(bits, np.bool_).reshape(shape)


def _region(control: Any) -> Any:
    return control.value if control.__class__ is Opaque else control


def replay(det: RaceDetector, log: Sequence[Any], payloads: Sequence[Any],
           objects: list[Any]) -> None:
    """Make the calls of ``log`` (with ``payloads``: the names and sites) on ``det``;
    the actors and clocks it returns are appended to ``objects`` (token ``i`` stands
    for ``objects[i]``)."""
    new_actor, read_release, write_release = det.new_actor, det.read_release, det.write_release
    acquire_all, append = det.acquire_all, objects.append
    for entry, payload in zip(log, payloads):
        kind = entry[0]
        if kind == READ_RELEASE:
            _, actor, key, region = entry
            append(read_release(objects[actor], key, _region(region), payload))
        elif kind == WRITE_RELEASE:
            _, actor, key, region = entry
            append(write_release(objects[actor], key, _region(region), payload))
        elif kind == ACQUIRE_ALL:
            acquire_all(objects[entry[1]], [objects[c] for c in entry[2]])
        elif kind == NEW:
            parent = entry[1]
            append(new_actor(payload, None if parent is None else objects[parent]))
        else:
            _replay_other(det, entry, payload, objects)


def _replay_other(det: RaceDetector, entry: tuple[Any, ...], payload: Any,
                  objects: list[Any]) -> None:
    kind = entry[0]
    if kind in (READ, WRITE):
        _, actor, key, region, mask = entry
        method = det.read if kind == READ else det.write
        method(objects[actor], key, _region(region), payload, mask=_mask(mask))
    elif kind == RELEASE:
        objects.append(det.release(objects[entry[1]]))
    elif kind == FINISH_RELEASE:
        objects.append(det.finish_release(objects[entry[1]]))
    elif kind == FINISH:
        det.finish(objects[entry[1]])
    elif kind == JOIN:
        det.join(objects[entry[1]], objects[entry[2]])
    elif kind == ACQUIRE:
        det.acquire(objects[entry[1]], objects[entry[2]])
    elif kind == BARRIER:
        det.barrier([objects[a] for a in entry[1]])
    elif kind == REGISTER:
        det.register_buffer(entry[1], entry[2], payload)
    elif kind == FREE:
        det.free_buffer(entry[1])
    elif kind == FREE_ALL:
        det.free_buffers()
    else:  # pragma: no cover - every kind is listed above
        raise AssertionError(f"unknown log entry {entry!r}")

