"""An access whose box is exactly a union of uniform boxes, without the dense state.

A block written row by row (a recurrent scan's ``o_ref[t] = h``, paged attention's
page-by-page DMAs into one VMEM buffer) is a set of uniform boxes; the whole-block read
that follows (the copy-out, the compute's ``ref[...]``) covers several of them. The
general path materialises them into the dense int64 state and scans it (``np.unique``),
and the region then stays dense, so the next step's row accesses take the general path
too. Here the same table operations run, in the same order (distinct pairs in ascending
order, as ``np.unique`` gives them), over the boxes themselves: the boxes keep their
places (a read) or merge into the access's box (a write). An access that races goes
back to the general path, which finds and reports the race exactly as before.
"""

from __future__ import annotations

from typing import Any

from palladium.race_detect.boxes import _R_MASK, Box, _contains, _overlaps, _precedes, _size


def access_union(
    shadow: Any, box: Box, size: int, event: Any, times: list[int], is_write: bool
) -> bool:
    """Do ``shadow.access`` of ``box`` (no mask) over the uniform boxes that tile it:
    True. False, having changed nothing, when they do not tile it or it races."""
    boxes = shadow._boxes
    inside: list[Box] = []
    covered = 0
    for b in boxes:
        if _overlaps(b, box):
            if not _contains(box, b):
                return False
            inside.append(b)
            covered += _size(b)
    if covered != size or len(inside) < 2:
        return False
    by_pair: dict[int, int] = {}
    for b in inside:
        pair = boxes[b]
        by_pair[pair] = by_pair.get(pair, 0) + _size(b)
    pairs = sorted(by_pair)
    write_counts: dict[int, int] = {}
    read_counts: dict[int, int] = {}
    for pair in pairs:
        count = by_pair[pair]
        wid, rid = pair >> 32, pair & _R_MASK
        write_counts[wid] = write_counts.get(wid, 0) + count
        read_counts[rid] = read_counts.get(rid, 0) + count
    writes, reads = shadow._writes, shadow._reads
    for wid in write_counts:
        if wid and not _precedes(writes.items[wid], times):
            return False
    if is_write:
        for rid in read_counts:
            for earlier in reads.items[rid]:
                if not _precedes(earlier, times):
                    return False
        for wid, count in write_counts.items():
            if wid:
                writes.release(wid, count)
        for rid, count in read_counts.items():
            shadow._drop_read_set(rid, count)
        new = writes.add(event, size) << 32
        for b in inside:
            del boxes[b]
        shadow._add_box(box, new)
        return True
    merged: dict[tuple[int, ...], int] = {}
    new_read = {
        rid: shadow._with_read(rid, event, times, count, merged)
        for rid, count in read_counts.items()
    }
    for rid, count in read_counts.items():
        shadow._drop_read_set(rid, count)
    if len(pairs) == 1:  # all equal: one box, as the general path makes
        pair = pairs[0]
        for b in inside:
            del boxes[b]
        shadow._add_box(box, (pair >> 32) << 32 | new_read[pair & _R_MASK])
        return True
    for b in inside:
        pair = boxes[b]
        boxes[b] = (pair >> 32) << 32 | new_read[pair & _R_MASK]
    return True
