"""The scheduler: one core at a time, seeded schedules, deadlocks, errors, a stress run."""

import threading
import time

import numpy as np
import pytest

from palladium.shared_memory import (
    DeadlockError,
    MemorySpace,
    SemaphoreKind,
    SemaphoreLeakError,
    Simulation,
)

HBM, VMEM = MemorySpace.HBM, MemorySpace.VMEM
REGULAR, DMA = SemaphoreKind.REGULAR, SemaphoreKind.DMA


def test_one_core_waiting_forever_is_a_deadlock():
    sim = Simulation()
    sem = sim.allocate_semaphores(0, 0, kind=REGULAR, name="done_sem")

    def body():
        sim.semaphore_wait(sem, 1, core=(0, 0), site="kernel.py:12")

    with pytest.raises(DeadlockError) as info:
        sim.run({(0, 0): body})
    text = str(info.value)
    assert "device 0 core 0 waits on semaphore 'done_sem'" in text
    assert "for 1, count 0 at kernel.py:12" in text


def test_two_cores_waiting_on_each_other():
    sim = Simulation(num_devices=2)
    sems = {d: sim.allocate_semaphores(d, 0, kind=REGULAR, name="sems", shape=(2,)) for d in range(2)}

    def body(d):
        def run():
            sim.semaphore_wait(sems[d][d], 1, core=(d, 0), site=f"wait on device {d}")
            sim.semaphore_signal(sems[d][1 - d], 1, core=(d, 0), target=(1 - d, 0))
        return run

    baseline = threading.active_count()
    with pytest.raises(DeadlockError) as info:
        sim.run({(0, 0): body(0), (1, 0): body(1)})
    text = str(info.value)
    assert "device 0 core 0 waits on semaphore 'sems[0]' (id 1) for 1, count 0 at wait on device 0" in text
    assert "device 1 core 0 waits on semaphore 'sems[1]' (id 2) for 1, count 0 at wait on device 1" in text
    assert threading.active_count() == baseline


def test_waiting_for_more_bytes_than_were_sent():
    sim = Simulation()
    src = sim.allocate(HBM, 0, 0, name="x", value=np.zeros(4, np.float32))
    dst = sim.allocate(VMEM, 0, 0, name="y", shape=(4,), dtype=np.float32)
    sem = sim.allocate_semaphores(0, 0, kind=DMA, name="copy_sem")

    def body():
        sim.dma_start(src, None, dst, None, core=(0, 0), dst_sem=sem)
        sim.dma_wait(sem, 32, core=(0, 0), site="kernel.py:20")

    with pytest.raises(DeadlockError) as info:
        sim.run({(0, 0): body})
    assert "waits on DMA semaphore 'copy_sem' (id 1) for 32 bytes, count 16 bytes at kernel.py:20" in str(info.value)


def test_barrier_missed_by_a_finished_core_is_a_deadlock():
    sim = Simulation(cores_per_device=2)

    def waits():
        sim.barrier((0, 0), site="kernel.py:5")

    with pytest.raises(DeadlockError) as info:
        sim.run({(0, 0): waits, (0, 1): lambda: None})
    text = str(info.value)
    assert "device 0 core 0 waits at the barrier (1 of 2 cores arrived) at kernel.py:5" in text
    assert "finished: device 0 core 1" in text


def test_error_in_one_body_stops_the_others_cleanly():
    sim = Simulation(num_devices=3, cores_per_device=2, seed=4)
    sems = {c: sim.allocate_semaphores(*c, kind=REGULAR, name="never") for c in
            [(d, k) for d in range(3) for k in range(2)]}
    unwound = []
    started = []

    def blocked(core):
        def run():
            started.append(core)
            try:
                sim.semaphore_wait(sems[core], 1, core=core)
            finally:
                unwound.append(core)
        return run

    def failing():
        sim.yield_point()
        raise KeyError("boom in device 2 core 1")

    bodies = {c: blocked(c) for c in sems if c != (2, 1)}
    bodies[(2, 1)] = failing
    baseline = threading.active_count()
    start = time.monotonic()
    with pytest.raises(KeyError, match="boom in device 2 core 1"):
        sim.run(bodies)
    assert time.monotonic() - start < 5
    assert threading.active_count() == baseline
    assert started and sorted(unwound) == sorted(started)
    # The simulation is still usable for inspection, and a new one runs normally.
    fresh = Simulation(num_devices=2)
    fresh.run({(0, 0): lambda: None, (1, 0): lambda: None})


def test_error_caught_by_body_does_not_swallow_cancellation():
    sim = Simulation(cores_per_device=2)
    sem = sim.allocate_semaphores(0, 0, kind=REGULAR, name="s")

    def stubborn():
        try:
            sim.semaphore_wait(sem, 1, core=(0, 0))
        except Exception:  # cancellation is not an Exception: it still unwinds
            pytest.fail("cancellation was caught as an Exception")

    def failing():
        raise RuntimeError("first error")

    with pytest.raises(RuntimeError, match="first error"):
        sim.run({(0, 0): stubborn, (0, 1): failing})


def test_exactly_one_body_runs_at_a_time():
    sim = Simulation(num_devices=4, cores_per_device=2, seed=7)
    running = []
    overlaps = []

    def body(core):
        def run():
            for _ in range(20):
                running.append(core)
                if len(running) > 1:
                    overlaps.append(tuple(running))
                time.sleep(0.0001)  # a real thread switch would expose concurrency here
                running.remove(core)
                sim.yield_point()
        return run

    sim.run({(d, c): body((d, c)) for d in range(4) for c in range(2)})
    assert overlaps == []


def _interleaving(seed):
    sim = Simulation(num_devices=2, cores_per_device=2, seed=seed)
    log = []

    def body(core):
        def run():
            for step in range(5):
                log.append((core, step))
                sim.yield_point()
        return run

    sim.run({(d, c): body((d, c)) for d in range(2) for c in range(2)})
    return tuple(log), tuple(sim.schedule)


def test_same_seed_same_schedule_different_seeds_differ():
    first = _interleaving(11)
    assert first == _interleaving(11)
    log, schedule = first
    assert sorted(log) == sorted(((d, c), s) for d in range(2) for c in range(2) for s in range(5))
    others = {_interleaving(seed)[0] for seed in range(6)}
    assert len(others) > 1


def test_current_core_inside_and_outside_run():
    sim = Simulation(num_devices=2)
    seen = {}

    def body(d):
        def run():
            sim.yield_point()
            seen[d] = sim.current_core()
        return run

    assert sim.current_core() is None
    sim.run({(0, 0): body(0), (1, 0): body(1)})
    sim.run({(1, 0): lambda: seen.setdefault("single", sim.current_core())})
    assert seen == {0: (0, 0), 1: (1, 0), "single": (1, 0)}
    assert sim.current_core() is None


@pytest.mark.parametrize(("mode", "detect_races"), [("on_wait", False), ("eager", False), ("on_wait", True)])
def test_ring_of_remote_dmas_16_devices_2_cores(mode, detect_races):
    n, cores, rounds, width = 16, 2, 3, 8
    sim = Simulation(num_devices=n, cores_per_device=cores, dma_execution_mode=mode, seed=3,
                     dma_order="random", detect_races=detect_races)
    bufs = {}
    sems = {}
    for d in range(n):
        for c in range(cores):
            bufs[(d, c)] = sim.allocate(
                VMEM, d, c, name="ring_buf", value=np.full((rounds + 1, width), 100 * d + c, np.int32))
            sems[(d, c)] = sim.allocate_semaphores(d, c, kind=DMA, name="ring_sems", shape=(2,))
            sems[(d, c), "credit"] = sim.allocate_semaphores(d, c, kind=REGULAR, name="credit")

    def body(d, c):
        me, right, left = (d, c), ((d + 1) % n, c), ((d - 1) % n, c)
        send, recv = sems[me]

        def run():
            for r in range(rounds):
                # Tell the left neighbour it may write row r + 1 of our buffer.
                sim.semaphore_signal(sems[me, "credit"], 1, core=me, target=left)
                sim.semaphore_wait(sems[me, "credit"], 1, core=me)
                sim.dma_start(bufs[me], (r,), bufs[right], (r + 1,), core=me,
                              dst_sem=recv, src_sem=send, dst_core=right, site=f"round {r}")
                sim.dma_wait(send, width * 4, core=me)
                sim.dma_wait(recv, width * 4, core=me)
        return run

    start = time.monotonic()
    sim.run({(d, c): body(d, c) for d in range(n) for c in range(cores)})
    elapsed = time.monotonic() - start
    for d in range(n):
        for c in range(cores):
            got = sim.value(bufs[(d, c)])
            expected = [100 * ((d - r) % n) + c for r in range(rounds + 1)]
            np.testing.assert_array_equal(got[:, 0], expected)
    assert elapsed < 30
    if detect_races:
        assert sim.race_detector.reports == []


def test_simulation_usable_after_a_failed_run():
    sim = Simulation(cores_per_device=2)
    sem = sim.allocate_semaphores(0, 0, kind=REGULAR, name="s")

    def failing():
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        sim.run({(0, 0): lambda: sim.semaphore_wait(sem, 1, core=(0, 0)), (0, 1): failing})
    sim.semaphore_signal(sem, 1, core=(0, 0))
    with pytest.raises(SemaphoreLeakError) as info:
        sim.check_semaphores()
    assert "'s'" in str(info.value)
    sim.semaphore_wait(sem, 1, core=(0, 0))
    sim.check_semaphores()


@pytest.mark.timeout(60)
def test_hundreds_of_cores_with_deep_bodies():
    # Every body is 60 Python frames deep at each switch. A body first entered from
    # another body's stack (not the run's) would stack on it: 256 of them would exceed
    # the recursion limit (RecursionError in 256-device launches before).
    n, rounds = 256, 3
    sim = Simulation(num_devices=n, seed=1)
    sems = [sim.allocate_semaphores(d, 0, kind=REGULAR, name="token") for d in range(n)]
    received = [0] * n

    def deep(k, f):
        return f() if k == 0 else deep(k - 1, f)

    def body(d):
        def ring():
            for _ in range(rounds):
                sim.semaphore_signal(sems[(d + 1) % n], 1, core=(d, 0), target=((d + 1) % n, 0))
                sim.semaphore_wait(sems[d], 1, core=(d, 0))
                received[d] += 1
        return lambda: deep(60, ring)

    sim.run({(d, 0): body(d) for d in range(n)})
    assert received == [rounds] * n
    assert len(sim.schedule) > n * rounds
