"""Shadow state of one buffer: per element, the last write and the unordered reads since.

Representation: one lazily allocated int64 array over the buffer's elements holding a
pair of ids per element, ``w << 32 | r``:

- ``w``: an id into the write table (an ``Event``: slot, time, the ``Access``), 0 = never
  written;
- ``r``: an id into the interned table of *read sets*, 0 = no read since the last write.
  A read set is the tuple of reads since the last write that no later read happened
  after; reads of one slot are always ordered (a slot is a chain of actors), so it
  holds at most one read per slot. The one-read set is FastTrack's read epoch; more
  entries are its read vector clock.

An access gathers the pairs in its region (one min and one max decide whether they are
all equal, the common case), tests happens-before once per *distinct* id (a region
written by one DMA holds one id, whatever its size), then stores new pairs.
Tables are reference counted exactly (how many elements hold each id) and freed ids are
reused, so their size is bounded by the buffer's size and an access costs O(region)
numpy work plus O(distinct ids) Python work, independent of how many accesses ran before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from palladium.race_detect.regions import Region, element_at
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


_R_MASK = (1 << 32) - 1
_min = np.minimum.reduce
_max = np.maximum.reduce


class BufferShadow:
    """The shadow state of one buffer (see the module docstring)."""

    def __init__(self, shape: tuple[int, ...], name: str) -> None:
        self.shape = shape
        self.name = name
        self._state: np.ndarray | None = None
        # When not None, every element holds this pair and ``_state`` is stale: an
        # access of the whole buffer (a block copy, a kernel's ``ref[...]``) then costs
        # O(1) instead of a scan and a fill of the buffer.
        self._uniform: int | None = 0
        self._size = int(np.prod(shape, dtype=np.int64))
        self._whole: Region | None = None  # the last region seen to cover the buffer
        self._writes = _Table(None)
        self._reads = _Table(())
        self._read_ids: dict[tuple[int, ...], int] = {}

    def live_records(self) -> tuple[int, int]:
        """(live write records, live read sets): bounded by the number of elements."""
        return self._writes.live(), self._reads.live()

    def _element(
        self, region: Region, mask: np.ndarray | None, hits: np.ndarray
    ) -> tuple[int, ...]:
        """The buffer index of the first True of ``hits`` (laid out like the region)."""
        position = int(np.flatnonzero(np.ravel(hits))[0])
        return element_at(region, self.shape, mask, position)

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
        whole = mask is None and self._size > 0 and self._covers(region)
        if whole and self._uniform is not None and self._access_uniform(event, times, is_write):
            return []
        if self._state is None:
            self._state = np.zeros(self.shape, np.int64)
        if self._uniform is not None:
            self._state[...] = self._uniform
            self._uniform = None
        # A trailing None keeps even a single element a (1-element) view, not a copy.
        view = self._state[region + (None,)]
        old = view if mask is None else view[mask]
        if old.size == 0:
            return []
        low = int(_min(old, axis=None))
        inverse = None
        if low == int(_max(old, axis=None)):
            pairs = [low]
            counts = [old.size]
        else:
            values, inverse, count_array = np.unique(old, return_inverse=True, return_counts=True)
            pairs = values.tolist()
            counts = count_array.tolist()
        write_counts: dict[int, int] = {}
        read_counts: dict[int, int] = {}
        for pair, count in zip(pairs, counts):
            wid, rid = pair >> 32, pair & _R_MASK
            write_counts[wid] = write_counts.get(wid, 0) + count
            read_counts[rid] = read_counts.get(rid, 0) + count
        races: list[Race] = []
        writes = self._writes
        for wid in write_counts:
            if wid:
                earlier = writes.items[wid]
                if not _precedes(earlier, times):
                    hits = (old >> 32) == wid
                    races.append((earlier, self._element(region, mask, hits)))
        if is_write:
            self._check_reads(times, region, mask, old, read_counts, races)
            for wid, count in write_counts.items():
                if wid:
                    writes.release(wid, count)
            for rid, count in read_counts.items():
                self._drop_read_set(rid, count)
            new: Any = writes.add(event, old.size) << 32
        else:
            new_read = {
                rid: self._with_read(rid, event, times, count) for rid, count in read_counts.items()
            }
            for rid, count in read_counts.items():
                self._drop_read_set(rid, count)
            new_pairs = [(pair >> 32) << 32 | new_read[pair & _R_MASK] for pair in pairs]
            if inverse is None:
                new = new_pairs[0]
            else:
                new = np.asarray(new_pairs, np.int64)[np.reshape(inverse, old.shape)]
        if whole and not isinstance(new, np.ndarray):
            self._uniform = new
        elif mask is None:
            view[...] = new
        else:
            view[mask] = new
        return races

    def _covers(self, region: Region) -> bool:
        """Whether the normalised ``region`` is every element of the buffer."""
        if region is self._whole:
            return True
        for index, n in zip(region, self.shape):
            if index.__class__ is slice:
                if index.step not in (None, 1) or index.start not in (None, 0):
                    return False
                if index.stop is not None and index.stop < n:
                    return False
            elif n != 1 or index not in (0, -1):
                return False
        self._whole = region
        return True

    def _access_uniform(self, event: Event, times: list[int], is_write: bool) -> bool:
        """The whole-buffer access of a uniform buffer, if it races with nothing (True);
        False (nothing changed) when it races: the general path then reports it."""
        assert self._uniform is not None
        pair, size = self._uniform, self._size
        wid, rid = pair >> 32, pair & _R_MASK
        if wid and not _precedes(self._writes.items[wid], times):
            return False
        if is_write:
            if rid and any(not _precedes(e, times) for e in self._reads.items[rid]):
                return False
            if wid:
                self._writes.release(wid, size)
            self._drop_read_set(rid, size)
            self._uniform = self._writes.add(event, size) << 32
        else:
            new_rid = self._with_read(rid, event, times, size)
            self._drop_read_set(rid, size)
            self._uniform = wid << 32 | new_rid
        return True

    def _check_reads(
        self,
        times: list[int],
        region: Region,
        mask: np.ndarray | None,
        old: np.ndarray,
        read_counts: dict[int, int],
        races: list[Race],
    ) -> None:
        """A write: report every recorded read not before it (once per read)."""
        seen: set[int] = set()
        for rid in read_counts:
            for earlier in self._reads.items[rid]:
                if earlier.serial not in seen and not _precedes(earlier, times):
                    seen.add(earlier.serial)
                    hits = (old & _R_MASK) == rid
                    races.append((earlier, self._element(region, mask, hits)))

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
