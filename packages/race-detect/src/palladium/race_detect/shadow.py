"""Shadow state of one buffer: per element, the last write and the unordered reads since.

Representation: two lazily allocated int32 arrays over the buffer's elements,

- ``w``: an id into the write table (an ``Event``: slot, time, the ``Access``), 0 = never
  written;
- ``r``: an id into the interned table of *read sets*, 0 = no read since the last write.
  A read set is the tuple of reads since the last write that no later read happened
  after; reads of one slot are always ordered (a slot is a chain of actors), so it
  holds at most one read per slot. The one-read set is FastTrack's read epoch; more
  entries are its read vector clock.

An access gathers the ids in its region, tests happens-before once per *distinct* id (a
region written by one DMA holds one id, whatever its size), then stores new ids.
Tables are reference counted exactly (how many elements hold each id) and freed ids are
reused, so their size is bounded by the buffer's size and an access costs O(region)
numpy work plus O(distinct ids) Python work, independent of how many accesses ran before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from palladium.race_detect.regions import Region, flat_elements
from palladium.race_detect.report import Access


class Event:
    """One access at epoch ``(slot, time)``; ``serial`` numbers accesses in program order."""

    __slots__ = ("slot", "time", "serial", "access")

    def __init__(self, slot: int, time: int, serial: int, access: Access) -> None:
        self.slot = slot
        self.time = time
        self.serial = serial
        self.access = access


Race = tuple[Event, tuple[int, ...]]  # the earlier event and one element both touch


def _precedes(event: Event, times: list[int]) -> bool:
    """Whether ``event`` happens-before an access whose clock is ``times``."""
    slot = event.slot
    return slot < len(times) and event.time <= times[slot]


def _distinct(ids: np.ndarray) -> Iterable[tuple[int, int]]:
    """(id, how many elements hold it) for each distinct id; one numpy pass when uniform."""
    low = int(ids.min())
    if low == int(ids.max()):
        return ((low, ids.size),)
    values, counts = np.unique(ids, return_counts=True)
    return zip(values.tolist(), counts.tolist())


class _Table:
    """Reference-counted records with a free list; id 0 is the empty record."""

    __slots__ = ("items", "counts", "free")

    def __init__(self, empty: Any) -> None:
        self.items: list[Any] = [empty]
        self.counts: list[int] = [0]
        self.free: list[int] = []

    def add(self, item: Any, count: int) -> int:
        if self.free:
            index = self.free.pop()
            self.items[index] = item
            self.counts[index] = count
            return index
        self.items.append(item)
        self.counts.append(count)
        return len(self.items) - 1

    def release(self, index: int, count: int) -> bool:
        """Drop ``count`` references; True when the record was freed."""
        left = self.counts[index] - count
        self.counts[index] = left
        if left == 0:
            self.items[index] = None
            self.free.append(index)
            return True
        return False

    def live(self) -> int:
        return len(self.items) - 1 - len(self.free)


class BufferShadow:
    """The shadow state of one buffer (see the module docstring)."""

    def __init__(self, shape: tuple[int, ...], name: str) -> None:
        self.shape = shape
        self.name = name
        self._w: np.ndarray | None = None
        self._r: np.ndarray | None = None
        self._writes = _Table(None)
        self._reads = _Table(())
        self._read_ids: dict[tuple[int, ...], int] = {}

    def live_records(self) -> tuple[int, int]:
        """(live write records, live read sets): bounded by the number of elements."""
        return self._writes.live(), self._reads.live()

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._w is None or self._r is None:
            self._w = np.zeros(self.shape, np.int32)
            self._r = np.zeros(self.shape, np.int32)
        return self._w, self._r

    def _element(
        self, region: Region, mask: np.ndarray | None, ids: np.ndarray, wanted: int
    ) -> tuple[int, ...]:
        """A buffer index in the region whose gathered id is ``wanted`` (only on a race)."""
        position = int(np.flatnonzero(np.ravel(ids) == wanted)[0])
        flat = int(flat_elements(region, self.shape, mask)[position])
        return tuple(int(i) for i in np.unravel_index(flat, self.shape))

    def access(
        self,
        event: Event,
        times: list[int],
        is_write: bool,
        region: Region,
        mask: np.ndarray | None,
    ) -> list[Race]:
        """Record ``event`` on ``buffer[region][mask]``; return the earlier events it races with.

        ``times`` is the accessing actor's clock. ``region`` is normalised (one index per
        dimension).
        """
        w, r = self._arrays()
        # A trailing None keeps even a single element a (1-element) view, not a copy.
        index = region + (None,)
        w_view = w[index]
        r_view = r[index]
        if mask is None:
            old_w, old_r = w_view, r_view
        else:
            old_w, old_r = w_view[mask], r_view[mask]
        if old_w.size == 0:
            return []
        races: list[Race] = []
        writes = self._writes
        for wid, count in _distinct(old_w):
            if not wid:
                continue
            earlier = writes.items[wid]
            if not _precedes(earlier, times):
                races.append((earlier, self._element(region, mask, old_w, wid)))
            if is_write:
                writes.release(wid, count)
        if is_write:
            self._write_reads(times, region, mask, old_r, races)
            new_w = writes.add(event, old_w.size)
            if mask is None:
                w_view[...] = new_w
                r_view[...] = 0
            else:
                w_view[mask] = new_w
                r_view[mask] = 0
        else:
            new_r = self._read_reads(event, times, old_r)
            if mask is None:
                r_view[...] = new_r
            else:
                r_view[mask] = new_r
        return races

    def _write_reads(
        self,
        times: list[int],
        region: Region,
        mask: np.ndarray | None,
        old_r: np.ndarray,
        races: list[Race],
    ) -> None:
        """A write: report every recorded read not before it, then drop all of them."""
        reads = self._reads
        seen: set[int] = set()
        for rid, count in _distinct(old_r):
            if not rid:
                continue
            for earlier in reads.items[rid]:
                if earlier.serial not in seen and not _precedes(earlier, times):
                    seen.add(earlier.serial)
                    races.append((earlier, self._element(region, mask, old_r, rid)))
            self._drop_read_set(rid, count)

    def _read_reads(self, event: Event, times: list[int], old_r: np.ndarray) -> Any:
        """A read: each read set loses the reads before ``event`` and gains ``event``."""
        low = int(old_r.min())
        if low == int(old_r.max()):
            new = self._with_read(low, event, times, old_r.size)
            self._drop_read_set(low, old_r.size)
            return new
        values, inverse, counts = np.unique(old_r, return_inverse=True, return_counts=True)
        new_ids = [
            self._with_read(rid, event, times, count)
            for rid, count in zip(values.tolist(), counts.tolist())
        ]
        for rid, count in zip(values.tolist(), counts.tolist()):
            self._drop_read_set(rid, count)
        return np.asarray(new_ids, np.int32)[np.reshape(inverse, old_r.shape)]

    def _with_read(self, rid: int, event: Event, times: list[int], count: int) -> int:
        """The id of (read set ``rid`` minus reads before ``event``) plus ``event``; +count refs."""
        kept = [e for e in self._reads.items[rid] if not _precedes(e, times)]
        kept.append(event)  # serials grow in program order: the tuple stays sorted
        key = tuple(e.serial for e in kept)
        found = self._read_ids.get(key)
        if found is not None:
            self._reads.counts[found] += count
            return found
        new = self._reads.add(tuple(kept), count)
        self._read_ids[key] = new
        return new

    def _drop_read_set(self, rid: int, count: int) -> None:
        if not rid:
            return
        items = self._reads.items[rid]
        if self._reads.release(rid, count):
            del self._read_ids[tuple(e.serial for e in items)]
