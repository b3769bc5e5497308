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

An access whose box is exactly a union of uniform boxes (a block written row by row, then
read whole) runs the same table operations, in the same order, over the boxes themselves
(``_access_union``) instead of materialising the dense state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from palladium.race_detect.boxes import (
    R_MASK,
    Box,
    Times,
    box_of,
    box_size,
    contains,
    overlaps,
    precedes,
    subtract,
)
from palladium.race_detect.clock import Clock
from palladium.race_detect.regions import Region, element_at
from palladium.race_detect.report import Access


class Event:
    """One access at epoch ``(slot, time)``; ``serial`` numbers accesses in program order.

    It keeps the fields of its ``Access`` record, with the actor's clock as a snapshot
    (shared by the actor's accesses until its clock changes): the record itself, and the
    clock's entries, are built only when a report needs them (``access``), as most
    accesses never race. One object per access, nothing else.
    """

    __slots__ = ("_access", "actor", "buffer", "clock", "is_write", "masked", "region",
                 "serial", "site", "slot", "time")

    def __init__(
        self, slot: int, time: int, serial: int, actor: str, is_write: bool, buffer: str,
        region: Region, site: object, clock: Clock | tuple[tuple[str, int], ...],
        masked: bool,
    ) -> None:
        self.slot = slot
        self.time = time
        self.serial = serial
        self.actor = actor
        self.is_write = is_write
        self.buffer = buffer
        self.region = region
        self.site = site
        self.clock = clock
        self.masked = masked
        self._access: Access | None = None

    @property
    def access(self) -> Access:
        """The access as a report shows it (built on first use)."""
        if self._access is None:
            clock = self.clock
            entries = clock.entries() if isinstance(clock, Clock) else clock
            self._access = Access(self.actor, "write" if self.is_write else "read", self.buffer,
                                  self.region, self.site, entries, self.masked)
        return self._access


Race = tuple[Event, tuple[int, ...]]  # the earlier event and one element both touch


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


_MAX_BOXES = 1024  # beyond this many uniform boxes, fall back to the dense state

_min = np.minimum.reduce
_max = np.maximum.reduce


class BufferShadow:
    """The shadow state of one buffer (see the module docstring)."""

    def __init__(self, shape: tuple[int, ...], name: str) -> None:
        self.shape = shape
        self.name = name
        self._state: np.ndarray | None = None
        # Uniform boxes: disjoint rectangular parts of the buffer whose elements all
        # hold one pair; ``_state`` is stale there. An access of exactly such a box, or
        # of a box inside one (a block copy, a kernel's ``ref[...]``), costs O(1)
        # instead of a scan and a fill of the region. Initially the whole buffer is one
        # box holding pair 0 (never written, no reads).
        full = self._full = tuple((0, int(n)) for n in shape)
        self._boxes: dict[Box, int] = {full: 0} if all(shape) else {}
        self._state_fresh = True  # _state is still all zeros where no box covers it
        self._writes = _Table(None)
        self._reads = _Table(())

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
        times: Times,
        is_write: bool,
        region: Region,
        mask: np.ndarray | None,
        box: Box | None = None,
        size: int = 0,
        tried_box: bool = False,
    ) -> list[Race]:
        """Record ``event`` on ``buffer[region][mask]``; return the earlier events it races with.

        ``times`` is the accessing actor's clock. ``region`` is normalised (one index per
        dimension); ``box`` and ``size`` are its box as a ``PreparedAccess`` holds them
        (computed here when not given). ``tried_box``: ``access_box`` returned False
        on it already (changing nothing): not tried again.
        """
        if box is None:
            box = box_of(region, self.shape)
            size = box_size(box) if box is not None else 0
        if mask is None and box is not None and (
            (not tried_box and self.access_box(box, size, event, times, is_write))
            or self._access_union(box, size, event, times, is_write)
        ):
            return []
        self._materialize(box)
        assert self._state is not None
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
            wid, rid = pair >> 32, pair & R_MASK
            write_counts[wid] = write_counts.get(wid, 0) + count
            read_counts[rid] = read_counts.get(rid, 0) + count
        races: list[Race] = []
        writes = self._writes
        for wid in write_counts:
            if wid:
                earlier = writes.items[wid]
                if not precedes(earlier, times):
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
            # Read sets of different ids may keep the same reads: they merge into one id.
            # Only sets made by this access can match (each ends with its serial).
            merged: dict[tuple[int, ...], int] = {}
            new_read = {
                rid: self._with_read(rid, event, times, count, merged)
                for rid, count in read_counts.items()
            }
            for rid, count in read_counts.items():
                self._drop_read_set(rid, count)
            new_pairs = [(pair >> 32) << 32 | new_read[pair & R_MASK] for pair in pairs]
            if inverse is None:
                new = new_pairs[0]
            else:
                new = np.asarray(new_pairs, np.int64)[np.reshape(inverse, old.shape)]
        if mask is None and box is not None and not isinstance(new, np.ndarray):
            self._add_box(box, new)
        elif mask is None:
            view[...] = new
        else:
            view[mask] = new
        return races

    # ----------------------------------------------------------------- uniform boxes
    def access_box(
        self, box: Box, size: int, event: Event, times: Times, is_write: bool, own: int = -1
    ) -> bool:
        """Access ``box`` in O(1) if it is (inside) a uniform box and races with
        nothing: True. Otherwise change nothing and return False (the general path
        then reports the race, or scans the region).

        ``own``: the actor's slot, whose events all happen before the access (its own,
        its slot's earlier occupants'): ``times`` may lack its entry (a forked actor's
        parent's times)."""
        boxes = self._boxes
        outer = box
        pair = boxes.get(box)
        if pair is None:
            # Newest first: the pieces left by the last split (appended last) are where a
            # block-by-block sweep goes next. Boxes are disjoint, so at most one contains
            # ``box``: the order changes only the time it takes to find it.
            for b in reversed(boxes):
                for (lo, hi), (start, stop) in zip(b, box):  # contains(b, box), inlined
                    if start < lo or hi < stop:
                        break
                else:
                    outer, pair = b, boxes[b]
                    break
            else:
                return False
        wid, rid = pair >> 32, pair & R_MASK
        if wid:
            last = self._writes.items[wid]  # not precedes(last, times): False
            if (slot := last.slot) != own and (slot >= len(times) or last.time > times[slot]):
                return False
        # The same table operations, in the same order, as the general path on a
        # region holding one pair: ids (and so reports) do not depend on the path.
        if is_write:
            if rid:
                n = len(times)
                for e in self._reads.items[rid]:
                    slot = e.slot
                    if slot != own and (slot >= n or e.time > times[slot]):
                        return False  # not precedes(e, times)
            writes = self._writes
            if rid:
                self._reads.release(rid, size)
            if wid and writes.counts[wid] == size:
                # Only this box holds the last write: releasing it frees its id and the
                # add takes that id straight back off the free list. Do both at once.
                writes.items[wid] = event
                new = wid << 32
            else:
                if wid:
                    writes.release(wid, size)
                new = writes.add(event, size) << 32
        elif rid:
            new_rid = self._with_read(rid, event, times, size, None, own)
            self._reads.release(rid, size)
            new = wid << 32 | new_rid
        else:  # no reads yet: the new read set is this read alone
            new = wid << 32 | self._reads.add((event,), size)
        if outer is not box:
            del boxes[outer]
            for piece in subtract(outer, box):
                boxes[piece] = pair
        boxes[box] = new
        return True

    def _add_box(self, box: Box, pair: int) -> None:
        if len(self._boxes) >= _MAX_BOXES:
            self._materialize(None)
        self._boxes[box] = pair

    def _materialize(self, box: Box | None) -> None:
        """Write the uniform boxes overlapping ``box`` (None: all) into ``_state``."""
        if self._state is None:
            self._state = np.zeros(self.shape, np.int64)
        boxes = self._boxes
        hit = list(boxes) if box is None else [b for b in boxes if overlaps(b, box)]
        for b in hit:
            pair = boxes.pop(b)
            if pair or not self._state_fresh:
                self._state[tuple(slice(lo, hi) for lo, hi in b)] = pair
        if hit or box is None:
            self._state_fresh = False

    def _check_reads(
        self,
        times: Times,
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
                if earlier.serial not in seen and not precedes(earlier, times):
                    seen.add(earlier.serial)
                    hits = (old & R_MASK) == rid
                    races.append((earlier, self._element(region, mask, hits)))

    def _with_read(
        self,
        rid: int,
        event: Event,
        times: Times,
        count: int,
        merged: dict[tuple[int, ...], int] | None = None,
        own: int = -1,
    ) -> int:
        """The id of (read set ``rid`` minus reads before ``event``) plus ``event``; +count
        refs. ``merged``: the sets this access made so far, by their serials (an access
        of one uniform box makes one set, and passes None); ``own``: see ``access_box``."""
        n = len(times)
        # not precedes(e, times), inlined: this runs on every read
        kept = [e for e in self._reads.items[rid]
                if e.slot != own and (e.slot >= n or e.time > times[e.slot])]
        kept.append(event)  # serials grow in program order: the tuple stays sorted
        if merged is None:
            return self._reads.add(tuple(kept), count)
        key = tuple(e.serial for e in kept)
        found = merged.get(key)
        if found is not None:
            self._reads.counts[found] += count
            return found
        new = merged[key] = self._reads.add(tuple(kept), count)
        return new

    def _drop_read_set(self, rid: int, count: int) -> None:
        if rid:
            self._reads.release(rid, count)

    # ------------------------------------------------- an access over several boxes
    def _access_union(
        self, box: Box, size: int, event: Any, times: Times, is_write: bool
    ) -> bool:
        """Do ``access`` of ``box`` (no mask) over the uniform boxes that tile it:
        True. False, having changed nothing, when they do not tile it or it races."""
        boxes = self._boxes
        by_pair: dict[int, int] = {}  # the pairs of the boxes inside, and their elements
        if box == self._full:  # the whole buffer (a block copy): every box is inside
            inside = list(boxes)
            for b, pair in boxes.items():
                by_pair[pair] = by_pair.get(pair, 0) + box_size(b)
            covered = sum(by_pair.values())
        else:
            inside = []
            covered = 0
            for b in boxes:
                if overlaps(b, box):
                    if not contains(box, b):
                        return False
                    inside.append(b)
                    n = box_size(b)
                    covered += n
                    pair = boxes[b]
                    by_pair[pair] = by_pair.get(pair, 0) + n
        if covered != size or len(inside) < 2:
            return False
        pairs = sorted(by_pair)
        write_counts: dict[int, int] = {}
        read_counts: dict[int, int] = {}
        for pair in pairs:
            count = by_pair[pair]
            wid, rid = pair >> 32, pair & R_MASK
            write_counts[wid] = write_counts.get(wid, 0) + count
            read_counts[rid] = read_counts.get(rid, 0) + count
        writes, reads = self._writes, self._reads
        for wid in write_counts:
            if wid and not precedes(writes.items[wid], times):
                return False
        if is_write:
            for rid in read_counts:
                for earlier in reads.items[rid]:
                    if not precedes(earlier, times):
                        return False
            for wid, count in write_counts.items():
                if wid:
                    writes.release(wid, count)
            for rid, count in read_counts.items():
                self._drop_read_set(rid, count)
            new = writes.add(event, size) << 32
            for b in inside:
                del boxes[b]
            self._add_box(box, new)
            return True
        merged: dict[tuple[int, ...], int] = {}
        new_read = {
            rid: self._with_read(rid, event, times, count, merged)
            for rid, count in read_counts.items()
        }
        for rid, count in read_counts.items():
            self._drop_read_set(rid, count)
        if len(pairs) == 1:  # all equal: one box, as the general path makes
            pair = pairs[0]
            for b in inside:
                del boxes[b]
            self._add_box(box, (pair >> 32) << 32 | new_read[pair & R_MASK])
            return True
        for b in inside:
            pair = boxes[b]
            boxes[b] = (pair >> 32) << 32 | new_read[pair & R_MASK]
        return True
