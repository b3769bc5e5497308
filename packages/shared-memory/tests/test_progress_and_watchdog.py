"""Scheduling points let pending DMAs land (seeded); the watchdog ends a run that loops.

Before: in ``on_wait`` mode a DMA nobody waited for never landed while its issuer lived,
so a core polling its destination spun forever; a core looping forever was never
reported."""

import threading

import numpy as np
import pytest

from palladium.shared_memory import MemorySpace, SemaphoreKind, Simulation, WatchdogError

pytestmark = pytest.mark.serial  # watchdog and progress deadlines: not beside a parallel run

HBM, VMEM = MemorySpace.HBM, MemorySpace.VMEM


def _poll_run(seed, dma_order, via):
    sim = Simulation(cores_per_device=2, seed=seed, dma_order=dma_order)
    src = sim.allocate(HBM, 0, 0, name="x", value=np.ones(4, np.float32))
    flag = sim.allocate(HBM, 0, 0, name="flag", value=np.zeros(4, np.float32))
    sem = int(sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="sem"))
    polls = []

    def issuer():
        sim.dma_start(src, None, flag, None, core=(0, 0), dst_sem=sem)

    def poller():
        n = 0
        while sim.read(flag, (0,), core=(0, 1))[()] == 0:
            n += 1
            if via == "delay":
                sim.yield_point(site="poll.py:3")
            else:
                sim.semaphore_read(sem, core=(0, 1), site="poll.py:3")
        polls.append(n)

    sim.run({(0, 0): issuer, (0, 1): poller}, check_leaks=False)
    return polls[0], sim.value(flag)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("via", ["delay", "semaphore_read"])
@pytest.mark.parametrize("dma_order", ["issue", "random"])
def test_a_polled_dma_lands_and_the_run_is_seeded(via, dma_order):
    counts = []
    for seed in range(8):
        polls, flag = _poll_run(seed, dma_order, via)
        np.testing.assert_array_equal(flag, np.ones(4, np.float32))
        assert (polls, flag.tolist()) == (_poll_run(seed, dma_order, via)[0], flag.tolist())
        counts.append(polls)
    assert len(set(counts)) > 1  # the seed decides when the DMA lands


@pytest.mark.timeout(30)
def test_watchdog_names_every_core():
    sim = Simulation(cores_per_device=3, watchdog=0.2, watchdog_hint="Raise the budget.")
    sem = int(sim.allocate_semaphores(0, 1, kind=SemaphoreKind.REGULAR, name="done"))
    baseline = threading.active_count()

    def looping():
        while True:
            sim.yield_point(site="loop.py:7")  # the other cores get to run

    def blocked():
        sim.semaphore_wait(sem, 1, core=(0, 1), site="wait.py:9")

    with pytest.raises(WatchdogError) as info:
        sim.run({(0, 0): looping, (0, 1): blocked, (0, 2): lambda: None})
    assert str(info.value).splitlines() == [
        "watchdog: the run is still going after 0.2 s (a core loops and nothing ends it); "
        "each core:",
        "  device 0 core 0 is looping at loop.py:7",
        "  device 0 core 1 is blocked: waits on semaphore 'done' (id 1) for 1, count 0 at "
        "wait.py:9; nothing ever signalled 'done' (no semaphore_signal, remote signal or DMA "
        "reached it)",
        "  device 0 core 2 finished",
        "Raise the budget.",
    ]
    assert threading.active_count() == baseline


@pytest.mark.timeout(30)
def test_watchdog_on_a_single_core_and_off_by_default():
    sim = Simulation(watchdog=0.1)
    with pytest.raises(WatchdogError, match="device 0 core 0 is looping at spin.py:1"):
        sim.run({(0, 0): lambda: [sim.tick(site="spin.py:1") for _ in iter(int, 1)]})
    assert Simulation().watchdog is None
