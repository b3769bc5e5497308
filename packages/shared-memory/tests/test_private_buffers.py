"""Private buffers (``Simulation.allocate(private=True)``): VMEM/SMEM only its core
touches; the race detector does not hear of their accesses until a DMA of that core
reaches them, and another core's DMA on one is an error. Read-only buffers
(``read_only=True``): nothing writes them, their reads are not recorded, a write is an
error."""

import numpy as np
import pytest

from palladium.shared_memory import (
    ConfigError,
    DataRaceError,
    MemorySpace,
    SemaphoreKind,
    Simulation,
)

HBM, VMEM, SMEM = MemorySpace.HBM, MemorySpace.VMEM, MemorySpace.SMEM


def _records(sim):
    return sim.race_detector.live_records()


def test_a_private_buffers_accesses_are_not_told_to_the_detector():
    sim = Simulation(detect_races=True)
    scratch = sim.allocate(VMEM, 0, 0, name="acc", shape=(8,), dtype=np.float32, private=True)
    shared = sim.allocate(VMEM, 0, 0, name="seen", shape=(8,), dtype=np.float32)

    def body():
        sim.write(scratch, None, np.ones(8, np.float32), core=(0, 0), site="k.py:1")
        assert _records(sim) == 0
        np.testing.assert_array_equal(sim.read(scratch, None, core=(0, 0)), np.ones(8))
        assert _records(sim) == 0
        sim.write(shared, None, np.ones(8, np.float32), core=(0, 0), site="k.py:3")
        assert _records(sim) > 0

    sim.run({(0, 0): body})


def _staging(**options):
    """A private VMEM staging buffer, an HBM destination and a DMA semaphore."""
    sim = Simulation(detect_races=True, **options)
    src = sim.allocate(VMEM, 0, 0, name="staging", shape=(8,), dtype=np.float32, private=True)
    dst = sim.allocate(HBM, 0, 0, name="out", shape=(8,), dtype=np.float32)
    return sim, src, dst, sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="sem")


def test_a_dma_of_its_own_core_makes_it_shared_and_later_races_are_found():
    sim, src, dst, sem = _staging(dma_execution_mode="eager")

    def body():
        sim.write(src, None, np.arange(8, dtype=np.float32), core=(0, 0), site="k.py:1")
        sim.dma_start(src, None, dst, None, core=(0, 0), dst_sem=sem, site="k.py:2")
        # the DMA reads ``staging`` until the wait: this store races with it
        sim.write(src, (slice(0, 2),), np.zeros(2, np.float32), core=(0, 0), site="k.py:3")
        sim.dma_wait(sem, 32, core=(0, 0), site="k.py:4")

    with pytest.raises(DataRaceError) as info:
        sim.run({(0, 0): body})
    text = str(info.value)
    assert "staging" in text and "k.py:3" in text and "DMA #0 staging->out" in text


def test_the_first_store_before_the_dma_is_ordered_before_it():
    sim, src, dst, sem = _staging()

    def body():
        sim.write(src, None, np.arange(8, dtype=np.float32), core=(0, 0), site="k.py:1")
        sim.dma_start(src, None, dst, None, core=(0, 0), dst_sem=sem, site="k.py:2")
        sim.dma_wait(sem, 32, core=(0, 0), site="k.py:4")
        sim.write(src, None, np.zeros(8, np.float32), core=(0, 0), site="k.py:5")

    sim.run({(0, 0): body})
    assert sim.race_detector.reports == []
    np.testing.assert_array_equal(sim.contents(dst), np.arange(8))


def test_another_cores_dma_on_a_private_buffer_is_an_error():
    sim = Simulation(num_devices=2, detect_races=True)
    src = sim.allocate(VMEM, 0, 0, name="x", value=np.arange(4, dtype=np.int32))
    dst = sim.allocate(VMEM, 1, 0, name="landing", shape=(4,), dtype=np.int32, private=True)
    sem = sim.allocate_semaphores(1, 0, kind=SemaphoreKind.DMA, name="sem")
    sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="sem")

    def sender():
        sim.dma_start(src, None, dst, None, core=(0, 0), dst_sem=sem, dst_core=(1, 0),
                      site="k.py:7")

    with pytest.raises(ConfigError) as info:
        sim.run({(0, 0): sender, (1, 0): lambda: None})
    assert str(info.value).startswith(
        "device 0 core 0: a DMA reaches 'landing' (VMEM, device 1 core 0), which was "
        "allocated private to device 1 core 0 at k.py:7: only that core's own DMAs may "
        "reach a private buffer")


@pytest.mark.parametrize("space", [HBM, MemorySpace.HOST])
def test_only_core_memory_can_be_private(space):
    sim = Simulation()
    with pytest.raises(ConfigError, match="belongs to the device; only VMEM and SMEM"):
        sim.allocate(space, 0, 0, name="x", shape=(4,), dtype=np.int32, private=True)


def test_private_without_race_detection_changes_nothing():
    sim = Simulation()
    s = sim.allocate(SMEM, 0, 0, name="flag", value=np.zeros(1, np.int32), private=True)

    def body():
        sim.write(s, None, np.ones(1, np.int32), core=(0, 0))

    sim.run({(0, 0): body})
    np.testing.assert_array_equal(sim.contents(s), [1])


def test_a_read_only_buffers_reads_are_not_recorded_even_by_dmas():
    sim = Simulation(detect_races=True)
    x = sim.allocate(HBM, 0, 0, name="x", value=np.arange(8, dtype=np.float32), read_only=True)
    land = sim.allocate(VMEM, 0, 0, name="land", shape=(8,), dtype=np.float32)
    sem = sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="sem")

    def body():
        np.testing.assert_array_equal(sim.read(x, None, core=(0, 0)), np.arange(8))
        assert _records(sim) == 0
        sim.dma_start(x, None, land, None, core=(0, 0), dst_sem=sem, site="k.py:2")
        sim.dma_wait(sem, 32, core=(0, 0), site="k.py:3")

    sim.run({(0, 0): body})
    np.testing.assert_array_equal(sim.contents(land), np.arange(8))
    assert sim.race_detector.reports == []


@pytest.mark.parametrize("how", ["store", "dma"])
def test_a_write_to_a_read_only_buffer_is_an_error(how):
    sim = Simulation(detect_races=True)
    x = sim.allocate(HBM, 0, 0, name="x", value=np.zeros(8, np.float32), read_only=True)
    src = sim.allocate(VMEM, 0, 0, name="src", value=np.ones(8, np.float32))
    sem = sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="sem")

    def body():
        if how == "store":
            sim.write(x, None, np.ones(8, np.float32), core=(0, 0), site="k.py:5")
        else:
            sim.dma_start(src, None, x, None, core=(0, 0), dst_sem=sem, site="k.py:5")

    with pytest.raises(ConfigError) as info:
        sim.run({(0, 0): body})
    what = "a store" if how == "store" else "a DMA into x"
    assert str(info.value).startswith(
        f"device 0 core 0: {what} writes 'x' (HBM, device 0), which was allocated read-only "
        f"(nothing was to write it during the run, so reads of it were not recorded) at k.py:5")


def test_a_read_only_buffer_holds_the_value_itself_and_numpy_refuses_writes_to_it():
    value = np.arange(8, dtype=np.float32)
    sim = Simulation(uninitialized_reads="raise")
    x = sim.allocate(HBM, 0, 0, name="x", value=value, read_only=True)
    held = sim.contents(x)
    assert np.shares_memory(held, value) and not held.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        held[0] = 1.0
    copied = sim.allocate(HBM, 0, 0, name="y", value=value)
    assert not np.shares_memory(sim.contents(copied), value)
    # every element of a read-only input counts as written
    np.testing.assert_array_equal(sim.read(x, None, core=(0, 0)), value)
    assert value[0] == 0.0


def test_watched_says_whose_accesses_the_detector_hears_of():
    sim, src, dst, sem = _staging(dma_execution_mode="eager")
    x = sim.allocate(HBM, 0, 0, name="x", value=np.zeros(8, np.float32), read_only=True)
    assert not sim.watched(src) and sim.watched(dst) and not sim.watched(x)

    def body():
        sim.dma_start(src, None, dst, None, core=(0, 0), dst_sem=sem, site="k.py:2")
        assert sim.watched(src)  # its own core's DMA made it shared
        sim.dma_wait(sem, 32, core=(0, 0), site="k.py:4")

    sim.run({(0, 0): body})
    quiet = Simulation()  # no race detector: nothing is heard
    y = quiet.allocate(VMEM, 0, 0, name="y", shape=(8,), dtype=np.float32)
    assert not quiet.watched(y)
