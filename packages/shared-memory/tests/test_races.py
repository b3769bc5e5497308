"""Race detection through the simulator: every access, DMA actors, semaphore edges."""

import numpy as np
import pytest
from _race_scenarios import dma_then_read

from palladium.shared_memory import (
    DataRaceError,
    MemorySpace,
    SemaphoreKind,
    Simulation,
)

HBM, VMEM = MemorySpace.HBM, MemorySpace.VMEM


@pytest.mark.parametrize("mode", ["eager", "on_wait"])
def test_dma_write_racing_with_read_before_wait_is_reported(mode):
    with pytest.raises(DataRaceError) as info:
        dma_then_read(mode, read_before_wait=True)
    text = str(info.value)
    assert "x_vmem" in text and "DMA #0 x->x_vmem" in text and "device 0 core 0" in text
    assert "kernel.py:11" in text


@pytest.mark.parametrize("mode", ["eager", "on_wait"])
def test_wait_then_read_is_not_a_race(mode):
    sim = dma_then_read(mode, read_before_wait=False)
    assert sim.race_detector is not None and sim.race_detector.reports == []


def test_collect_policy_keeps_running():
    sim = dma_then_read("eager", read_before_wait=True, on_race="collect")
    reports = sim.race_detector.reports
    assert len(reports) >= 1
    assert {reports[0].first.kind, reports[0].second.kind} == {"read", "write"}


def _two_cores_share(sync, order_seed=0):
    sim = Simulation(cores_per_device=2, detect_races=True, on_race="collect", seed=order_seed)
    shared = sim.allocate(HBM, 0, 0, name="shared", value=np.zeros(4, np.int32))
    sem = sim.allocate_semaphores(0, 1, kind=SemaphoreKind.REGULAR, name="ready")
    sim.allocate_semaphores(0, 0, kind=SemaphoreKind.REGULAR, name="ready")

    def producer():
        sim.write(shared, (slice(0, 2),), np.ones(2, np.int32), core=(0, 0), site="producer")
        if sync:
            sim.semaphore_signal(sem, 1, core=(0, 0), target=(0, 1))

    def consumer():
        if sync:
            sim.semaphore_wait(sem, 1, core=(0, 1))
        sim.read(shared, (slice(1, 3),), core=(0, 1), site="consumer")

    sim.run({(0, 0): producer, (0, 1): consumer})
    return sim.race_detector.reports


def test_cores_racing_on_hbm_and_semaphore_synchronised():
    racy = _two_cores_share(sync=False)
    assert len(racy) == 1
    assert {racy[0].first.actor, racy[0].second.actor} == {"device 0 core 0", "device 0 core 1"}
    assert racy[0].first.buffer.startswith("shared")
    assert _two_cores_share(sync=True) == []


def test_masked_write_reports_only_written_elements():
    sim = Simulation(cores_per_device=2, detect_races=True, on_race="collect")
    buf = sim.allocate(HBM, 0, 0, name="m", value=np.zeros(4, np.float32))

    def writer_a():
        sim.write(buf, None, np.ones(4, np.float32), mask=np.array([1, 1, 0, 0], bool), core=(0, 0))

    def writer_b():
        sim.write(buf, None, np.ones(4, np.float32), mask=np.array([0, 0, 1, 1], bool), core=(0, 1))

    sim.run({(0, 0): writer_a, (0, 1): writer_b})
    assert sim.race_detector.reports == []


def test_masked_read_reports_only_read_elements():
    sim = Simulation(cores_per_device=2, detect_races=True, on_race="collect")
    buf = sim.allocate(HBM, 0, 0, name="m", value=np.zeros(4, np.float32))

    def reader():
        sim.read(buf, (slice(2, 6),), mask=np.array([1, 1, 0, 0], bool), core=(0, 0))

    def writer():
        sim.write(buf, (slice(0, 2),), np.ones(2, np.float32), core=(0, 1))

    sim.run({(0, 0): reader, (0, 1): writer})
    assert sim.race_detector.reports == []

    def wide_reader():
        sim.read(buf, (slice(0, 4),), mask=np.array([0, 1, 0, 0], bool), core=(0, 0))

    sim.run({(0, 0): wide_reader, (0, 1): writer})
    assert len(sim.race_detector.reports) == 1
    assert "at element (1,)" in str(sim.race_detector.reports[0])


def test_barrier_orders_accesses():
    sim = Simulation(num_devices=2, detect_races=True, on_race="collect")
    buf = sim.allocate(HBM, 0, 0, name="b", value=np.zeros(2, np.float32))

    def body(d):
        def run():
            sim.write(buf, (d,), 1.0, core=(d, 0))
            sim.barrier((d, 0))
            sim.read(buf, None, core=(d, 0))
        return run

    sim.run({(0, 0): body(0), (1, 0): body(1)})
    assert sim.race_detector.reports == []


def test_remote_dma_observed_by_the_receiver_is_ordered():
    sim = Simulation(num_devices=2, detect_races=True, seed=9)
    src = sim.allocate(HBM, 0, 0, name="src", value=np.arange(4, dtype=np.float32))
    dst = sim.allocate(HBM, 1, 0, name="dst", shape=(4,), dtype=np.float32)
    sems = {d: sim.allocate_semaphores(d, 0, kind=SemaphoreKind.DMA, name="s", shape=(2,)) for d in range(2)}

    def sender():
        sim.dma_start(src, None, dst, None, core=(0, 0), dst_sem=sems[0][0], src_sem=sems[0][1],
                      dst_core=(1, 0))
        sim.dma_wait(sems[0][1], 16, core=(0, 0))
        sim.write(src, None, np.zeros(4, np.float32), core=(0, 0))  # safe: the source was read

    def receiver():
        sim.dma_wait(sems[1][0], 16, core=(1, 0))
        sim.read(dst, None, core=(1, 0))

    sim.run({(0, 0): sender, (1, 0): receiver})
    assert sim.race_detector.reports == []
    np.testing.assert_array_equal(sim.value(dst), np.arange(4))


def _dma_loop(sim, core, src, dst, sem, steps):
    for _ in range(steps):
        sim.dma_start(src, None, dst, None, core=core, dst_sem=sem)
        sim.dma_wait(sem, 16, core=core)
        sim.read(dst, None, core=core)


@pytest.mark.parametrize("mode", ["eager", "on_wait"])
def test_a_waited_dma_gives_its_clock_slot_to_the_next_one(mode):
    # A DMA's last release carries its final time, so the core that waited on it may give
    # its slot to the next DMA: the clocks stay at (cores + DMAs in flight) entries instead
    # of growing by one per DMA (a ring collective's per-DMA cost grew with its length).
    def slots(steps):
        sim = Simulation(detect_races=True, dma_execution_mode=mode)
        src = sim.allocate(HBM, 0, 0, name="x", value=np.arange(4, dtype=np.float32))
        dst = sim.allocate(VMEM, 0, 0, name="x_vmem", shape=(4,), dtype=np.float32)
        sem = sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="sem")
        sim.run({(0, 0): lambda: _dma_loop(sim, (0, 0), src, dst, sem, steps)})
        assert sim.race_detector.reports == []
        return sim.race_detector.num_slots

    assert slots(50) == slots(1) == 3  # the launch's root, the core, one DMA


def test_a_ring_of_remote_dmas_reuses_clock_slots():
    # Each device waits for its neighbour's DMA, then sends on (the pattern of a ring
    # all-gather): the receiver saw the DMA's final time, so its DMA takes that slot.
    n, rounds = 4, 12
    sim = Simulation(num_devices=n, detect_races=True)
    src = {d: sim.allocate(HBM, d, 0, name="send", value=np.full(4, d, np.float32))
           for d in range(n)}
    dst = {d: sim.allocate(HBM, d, 0, name="recv", shape=(4,), dtype=np.float32)
           for d in range(n)}
    sems = {d: sim.allocate_semaphores(d, 0, kind=SemaphoreKind.DMA, name="sem") for d in range(n)}
    seen = {d: [] for d in range(n)}

    def device(d):
        for r in range(rounds):
            if d != 0 or r > 0:
                sim.dma_wait(sems[d], 16, core=(d, 0))
                seen[d].append(sim.read(dst[d], None, core=(d, 0))[0])
            if d != n - 1 or r < rounds - 1:
                sim.dma_start(src[d], None, dst[(d + 1) % n], None, core=(d, 0),
                              dst_sem=sems[d], dst_core=((d + 1) % n, 0))

    sim.run({(d, 0): (lambda d=d: device(d)) for d in range(n)})
    assert seen[1] == [0.0] * rounds and seen[0] == [float(n - 1)] * (rounds - 1)
    assert sim.race_detector.reports == []
    assert sim.race_detector.num_slots <= 1 + 2 * n  # the root, n cores, n DMAs in flight
