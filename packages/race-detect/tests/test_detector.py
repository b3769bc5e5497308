"""The classic cases, run against the detector and against the brute-force oracle."""

import numpy as np
import pytest

from palladium.race_detect import RaceDetector
from palladium.race_detect.oracle import BruteForceDetector


@pytest.fixture(params=[RaceDetector, BruteForceDetector], ids=["detector", "oracle"])
def det(request):
    d = request.param(on_race="collect")
    d.register_buffer("x", (8, 8), "x")
    d.register_buffer("v", (16,), "v")
    return d


def pairs(det):
    return [
        (r.first.kind, r.first.actor, r.first.site, r.second.kind, r.second.actor, r.second.site)
        for r in det.reports
    ]


def test_write_write_without_sync_races(det):
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    det.write(a, "x", (0, slice(0, 4)), site="a1")
    det.write(b, "x", (0, slice(2, 6)), site="b1")
    assert pairs(det) == [("write", "core 0", "a1", "write", "core 1", "b1")]


def test_write_read_and_read_write_without_sync_race(det):
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    det.write(a, "x", (1,), site="w")
    det.read(b, "x", (1, 3), site="r")
    det.read(b, "x", (2,), site="r2")
    det.write(a, "x", (2, 0), site="w2")
    assert pairs(det) == [
        ("write", "core 0", "w", "read", "core 1", "r"),
        ("read", "core 1", "r2", "write", "core 0", "w2"),
    ]


def test_reads_never_race_with_reads(det):
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    det.read(a, "x")
    det.read(b, "x")
    assert det.reports == []


def test_release_acquire_orders(det):
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    det.write(a, "x", (0,), site="w")
    clock = det.release(a)
    det.write(a, "x", (1,), site="w after release")
    det.acquire(b, clock)
    det.read(b, "x", (0,), site="r ordered")
    det.read(b, "x", (1,), site="r racing")
    assert pairs(det) == [("write", "core 0", "w after release", "read", "core 1", "r racing")]


def test_program_order_of_one_actor(det):
    a = det.new_actor("core 0")
    det.write(a, "x")
    det.read(a, "x")
    det.write(a, "x")
    assert det.reports == []


def test_fork_orders_the_parents_past_only(det):
    core = det.new_actor("core 0")
    det.write(core, "x", (0,), site="before fork")
    dma = det.new_actor("DMA #1", parent=core)
    det.read(dma, "x", (0,), site="dma reads")  # ordered after the core's write
    det.write(core, "x", (0,), site="core overwrites")  # the DMA may still be reading
    assert pairs(det) == [("read", "DMA #1", "dma reads", "write", "core 0", "core overwrites")]


def test_dma_is_ordered_after_start_and_before_the_waiting_observer(det):
    core = det.new_actor("core 0")
    det.write(core, "x", (slice(0, 2),), site="fill")
    dma = det.new_actor("DMA #1 x->v", parent=core)
    det.read(dma, "x", (slice(0, 2),), site="dma read")
    det.write(dma, "v", slice(0, 16), site="dma write")
    det.finish(dma)
    det.join(core, dma)
    det.read(core, "v", None, site="use")
    det.write(core, "x", (slice(0, 2),), site="refill")
    assert det.reports == []


def test_observer_that_did_not_wait_races(det):
    core0, core1 = det.new_actor("core 0"), det.new_actor("core 1")
    dma = det.new_actor("DMA #1", parent=core0)
    det.write(dma, "v", None, site="dma write")
    det.finish(dma)
    det.join(core0, dma)
    det.read(core0, "v", (3,), site="waited")
    det.read(core1, "v", (3,), site="did not wait")
    assert pairs(det) == [("write", "DMA #1", "dma write", "read", "core 1", "did not wait")]


def test_join_of_a_finished_core_into_its_parent(det):
    main = det.new_actor("main")
    cores = [det.new_actor(f"core {i}", parent=main) for i in range(2)]
    det.write(cores[0], "v", slice(0, 8), site="c0")
    det.write(cores[1], "v", slice(8, 16), site="c1")
    for c in cores:
        det.finish(c)
        det.join(main, c)
    det.read(main, "v", None, site="main reads all")
    assert det.reports == []


def test_barrier_orders_everyone(det):
    cores = [det.new_actor(f"core {i}") for i in range(3)]
    for i, c in enumerate(cores):
        det.write(c, "v", slice(i, i + 1), site=f"w{i}")
    det.barrier(cores)
    det.read(cores[0], "v", None, site="after barrier")
    det.write(cores[1], "v", slice(0, 1), site="after barrier too")  # races with the read
    assert pairs(det) == [
        ("read", "core 0", "after barrier", "write", "core 1", "after barrier too")
    ]


def test_disjoint_regions_do_not_race(det):
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    det.write(a, "x", (slice(0, 4), slice(0, 8)))
    det.write(b, "x", (slice(4, 8), slice(0, 8)))
    det.write(a, "x", (slice(0, 4), 3))
    assert det.reports == []


def test_strided_interleaved_regions_do_not_race(det):
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    det.write(a, "v", slice(0, None, 2))
    det.write(b, "v", slice(1, None, 2))
    det.write(a, "x", (slice(None), slice(7, None, -2)))  # columns 7, 5, 3, 1
    det.write(b, "x", (slice(None), slice(None, None, 2)))  # columns 0, 2, 4, 6
    assert det.reports == []
    det.read(b, "v", slice(None, None, -3), site="15,12,..,0")  # 12, 6, 0 are even
    assert pairs(det) == [("write", "core 0", None, "read", "core 1", "15,12,..,0")]


def test_masks_restrict_the_touched_elements(det):
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    even = np.arange(16) % 2 == 0
    det.write(a, "v", None, mask=even, site="even")
    det.write(b, "v", None, mask=~even, site="odd")
    assert det.reports == []
    det.read(b, "v", slice(0, 3), mask=np.array([False, True, True]), site="1,2")
    assert pairs(det) == [("write", "core 0", "even", "read", "core 1", "1,2")]
    assert det.reports[0].first.masked and det.reports[0].second.masked


def test_concurrent_reads_are_all_kept_until_a_write(det):
    # Two unordered readers: the write must race with both (a read vector clock).
    w = det.new_actor("core 0")
    r1 = det.new_actor("DMA #1", parent=w)
    r2 = det.new_actor("DMA #2", parent=w)
    det.read(r1, "v", None, site="r1")
    det.read(r2, "v", None, site="r2")
    det.write(w, "v", (5,), site="w")
    assert sorted(pairs(det)) == [
        ("read", "DMA #1", "r1", "write", "core 0", "w"),
        ("read", "DMA #2", "r2", "write", "core 0", "w"),
    ]


def test_one_report_per_pair_of_accesses_not_per_element(det):
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    det.write(a, "x")
    det.write(b, "x")
    assert len(det.reports) == 1
    assert det.reports[0].element is not None


def test_only_the_last_write_is_checked(det):
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    det.write(a, "v", (0,), site="a")
    det.write(b, "v", (0,), site="b")  # races with a
    clock = det.release(b)
    det.acquire(a, clock)
    det.read(a, "v", (0,), site="a reads")  # ordered after b's write, the last one
    assert pairs(det) == [("write", "core 0", "a", "write", "core 1", "b")]


def test_a_read_ordered_after_another_actors_read_replaces_it(det):
    # r1 -> r2 (release/acquire); the write races with r2 only: r1 was pruned, since
    # whatever is unordered with r1 is unordered with r2 too.
    a, b, c = (det.new_actor(f"core {i}") for i in range(3))
    det.read(a, "v", (0,), site="r1")
    det.acquire(b, det.release(a))
    det.read(b, "v", (0,), site="r2")
    det.write(c, "v", (0,), site="w")
    assert pairs(det) == [("read", "core 1", "r2", "write", "core 2", "w")]


def test_free_buffers_drops_the_shadow_state_and_keeps_reports_actors_and_clocks():
    from palladium.race_detect import UnknownBufferError

    det = RaceDetector(on_race="collect")
    det.register_buffer("x", (4,), "x")
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    det.write(a, "x", (0,), site="a1")
    det.write(b, "x", (0,), site="b1")
    assert det.live_records() == 1  # core 1's write
    det.free_buffers()
    assert det.live_records() == 0
    assert [(r.first.site, r.second.site) for r in det.reports] == [("a1", "b1")]
    assert a.clock().entries() == (("core 0", 1),)
    with pytest.raises(UnknownBufferError, match=r"read by 'core 0' at a2: no buffer with key 'x' is registered"):
        det.read(a, "x", (0,), site="a2")
