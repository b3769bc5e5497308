"""Bounded state: clock slots recycle, shadow records are freed; errors name things."""

import numpy as np
import pytest

from palladium.race_detect import (
    ActorError,
    RaceDetector,
    RegionError,
    UnknownBufferError,
)


def test_dma_slots_recycle_once_the_dma_was_waited_for():
    det = RaceDetector(on_race="collect")
    det.register_buffer("x", (64,), "x")
    core = det.new_actor("core 0")
    for i in range(100):
        dma = det.new_actor(f"DMA #{i}", parent=core)
        det.write(dma, "x", slice(i % 8 * 8, i % 8 * 8 + 8))
        det.finish(dma)
        det.join(core, dma)
        det.read(core, "x", slice(i % 8 * 8, i % 8 * 8 + 8))
    assert det.num_slots == 2
    assert det.reports == []


def test_a_dma_finished_before_its_last_release_recycles_through_a_semaphore():
    # The simulator's order: the DMA finishes, then releases (signals its semaphore) without
    # a tick, so the waiter's acquire holds the DMA's final time. Finished DMAs nobody
    # waited for stay around as free slots nobody may reuse; they must not be taken.
    det = RaceDetector(on_race="collect")
    det.register_buffer("x", (64,), "x")
    core = det.new_actor("core 0")
    for i in range(5):
        det.finish(det.new_actor(f"unwaited #{i}", parent=core))
    for i in range(100):
        dma = det.new_actor(f"DMA #{i}", parent=core)
        det.write(dma, "x", slice(i % 8 * 8, i % 8 * 8 + 8))
        det.finish(dma)
        clock = det.release(dma)
        assert clock.finished_slot == dma.slot and clock.time(dma.slot) == dma.time
        det.acquire(core, clock)
        det.read(core, "x", slice(i % 8 * 8, i % 8 * 8 + 8))
    assert det.num_slots == 1 + 5 + 1
    assert det.reports == []


def test_a_finished_dma_nobody_waited_for_keeps_its_slot():
    det = RaceDetector(on_race="collect")
    det.register_buffer("x", (4,), "x")
    core = det.new_actor("core 0")
    first = det.new_actor("DMA #1", parent=core)
    det.write(first, "x")
    det.finish(first)  # completed, but the core did not wait on its semaphore
    second = det.new_actor("DMA #2", parent=core)
    assert second.slot != first.slot
    det.write(second, "x")  # so this still races with DMA #1
    assert [(r.first.actor, r.second.actor) for r in det.reports] == [("DMA #1", "DMA #2")]


def test_reused_slot_keeps_old_epochs_exact():
    det = RaceDetector(on_race="collect")
    det.register_buffer("x", (4,), "x")
    core0, core1 = det.new_actor("core 0"), det.new_actor("core 1")
    old = det.new_actor("DMA #1", parent=core0)
    det.write(old, "x", (0,), site="old")
    det.finish(old)
    det.join(core0, old)
    new = det.new_actor("DMA #2", parent=core0)
    assert new.slot == old.slot
    det.write(new, "x", (1,), site="new")
    det.join(core1, new)  # core 1 hears of DMA #2, hence of DMA #1 before it
    det.read(core1, "x", (slice(0, 2),))
    assert det.reports == []
    det.write(new, "x", (2,), site="after join")
    det.read(core1, "x", (2,), site="racing")
    assert [(r.first.site, r.second.site) for r in det.reports] == [("after join", "racing")]


def test_shadow_records_stay_bounded():
    det = RaceDetector(on_race="collect")
    det.register_buffer("x", (16, 16), "x")
    cores = [det.new_actor(f"core {i}") for i in range(2)]
    for step in range(300):
        core = cores[step % 2]
        rows = slice(step % 4 * 4, step % 4 * 4 + 4)
        det.read(core, "x", (rows, slice(step % 16, None, 3)))
        det.write(
            core, "x", (rows,), mask=np.broadcast_to(np.arange(16) % (step % 3 + 1) == 0, (4, 16))
        )
        det.barrier(cores)
    assert det.live_records() <= 2 * 16 * 16
    assert det.reports == []


def test_free_buffer_forgets_it():
    det = RaceDetector(on_race="collect")
    det.register_buffer("x", (4,), "x")
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    det.write(a, "x")
    det.free_buffer("x")
    with pytest.raises(UnknownBufferError, match="no buffer with key 'x'"):
        det.write(b, "x")
    det.register_buffer("x", (4,), "x")
    det.write(b, "x")
    assert det.reports == []


def test_access_after_finish_is_an_error():
    det = RaceDetector()
    det.register_buffer("x", (4,), "x")
    dma = det.new_actor("DMA #1")
    det.finish(dma)
    with pytest.raises(ActorError, match=r"'DMA #1' accessed 'x' at copy after it finished"):
        det.read(dma, "x", site="copy")


@pytest.mark.parametrize(
    "region, mask, message",
    [
        ((4,), None, r"index 4 is out of bounds on axis 0"),
        ((0, 0, 0), None, r"3 indices for 2 dimensions"),
        ((slice(0, 4, 0),), None, "step cannot be zero"),
        ((1.5,), None, "not an int or a slice"),
        ((True,), None, "not an int or a slice"),
        ((slice(0, 2),), np.ones((2,), bool), r"a boolean array of shape \(2, 5\)"),
        (None, np.ones((4, 5), int), "mask of dtype int"),
    ],
)
def test_bad_regions_name_the_buffer(region, mask, message):
    det = RaceDetector()
    det.register_buffer("x", (4, 5), "x (HBM)")
    with pytest.raises(RegionError, match=message) as info:
        det.write(det.new_actor("core 0"), "x", region, mask=mask)
    assert "'x (HBM)'" in str(info.value)


def test_negative_indices_and_steps():
    det = RaceDetector(on_race="collect")
    det.register_buffer("x", (4, 5), "x")
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    det.write(a, "x", (-1, slice(None, None, -2)))  # row 3, columns 4, 2, 0
    det.write(b, "x", (3, slice(-2, 0, -2)))  # row 3, columns 3, 1
    assert det.reports == []
    det.read(b, "x", (slice(-1, -2, -1), 0))
    assert det.reports[0].element == (3, 0)


def test_empty_regions_touch_nothing():
    det = RaceDetector()
    det.register_buffer("x", (4,), "x")
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    det.write(a, "x", slice(2, 2))
    det.write(b, "x", slice(2, 2))
    det.write(a, "x", None, mask=np.zeros(4, bool))
    det.write(b, "x", None, mask=np.zeros(4, bool))
    assert det.reports == []


def test_zero_dimensional_buffer():
    det = RaceDetector(on_race="collect")
    det.register_buffer("s", (), "smem scalar")
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    det.write(a, "s")
    det.read(b, "s", ())
    assert det.reports[0].element == ()
    assert "smem scalar[...]" in str(det.reports[0])


def test_importing_does_not_import_jax():
    import subprocess
    import sys

    code = "import sys, palladium.race_detect; assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
