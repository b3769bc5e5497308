"""Semaphores, DMAs (eager / on_wait, local / remote, orderings), barriers, leaks."""

import numpy as np
import pytest

from palladium.shared_memory import (
    DmaView,
    MemorySpace,
    OutOfBoundsError,
    SemaphoreKind,
    SemaphoreLeakError,
    Simulation,
    SimulationError,
)

HBM, VMEM = MemorySpace.HBM, MemorySpace.VMEM
DMA = SemaphoreKind.DMA


def _copy_setup(mode, **kwargs):
    sim = Simulation(dma_execution_mode=mode, **kwargs)
    src = sim.allocate(HBM, 0, 0, name="x", value=np.arange(8, dtype=np.float32))
    dst = sim.allocate(VMEM, 0, 0, name="x_vmem", shape=(4,), dtype=np.float32)
    sems = sim.allocate_semaphores(0, 0, kind=DMA, name="copy_sems", shape=(2,))
    return sim, src, dst, sems


def test_on_wait_dma_data_visible_only_after_wait():
    sim, src, dst, sems = _copy_setup("on_wait")
    seen = {}

    def body():
        sim.dma_start(src, (slice(2, 6),), dst, None, core=(0, 0), dst_sem=sems[0])
        seen["before"] = sim.read(dst, None, core=(0, 0))
        sim.dma_wait(sems[0], 16, core=(0, 0))
        seen["after"] = sim.read(dst, None, core=(0, 0))

    sim.run({(0, 0): body})
    assert np.isnan(seen["before"]).all()
    np.testing.assert_array_equal(seen["after"], [2, 3, 4, 5])


def test_eager_dma_executes_at_start():
    sim, src, dst, sems = _copy_setup("eager")
    seen = {}

    def body():
        sim.dma_start(src, (slice(4, 8),), dst, None, core=(0, 0), dst_sem=sems[0], src_sem=sems[1])
        seen["count"] = sim.semaphore_read(sems[0], core=(0, 0))
        seen["before_wait"] = sim.read(dst, None, core=(0, 0))
        sim.dma_wait(sems[1], 16, core=(0, 0))
        sim.dma_wait(sems[0], 16, core=(0, 0))

    sim.run({(0, 0): body})
    assert seen["count"] == 16
    np.testing.assert_array_equal(seen["before_wait"], [4, 5, 6, 7])


def test_on_wait_send_semaphore_runs_only_the_read_phase():
    sim, src, dst, sems = _copy_setup("on_wait")
    seen = {}

    def body():
        sim.dma_start(src, (slice(0, 4),), dst, None, core=(0, 0), dst_sem=sems[0], src_sem=sems[1])
        sim.dma_wait(sems[1], 16, core=(0, 0))  # the source was read ...
        sim.write(src, (slice(0, 4),), np.zeros(4, np.float32), core=(0, 0))  # ... so reuse it
        seen["dst_after_send"] = sim.read(dst, None, core=(0, 0))
        sim.dma_wait(sems[0], 16, core=(0, 0))
        seen["dst"] = sim.read(dst, None, core=(0, 0))

    sim.run({(0, 0): body})
    assert np.isnan(seen["dst_after_send"]).all()
    np.testing.assert_array_equal(seen["dst"], [0, 1, 2, 3])


def test_dma_shape_mismatch_is_value_error():
    sim, src, dst, sems = _copy_setup("on_wait")
    with pytest.raises(ValueError, match="'x' \\(HBM, device 0\\)\\[0:3\\].*shapes differ"):
        sim.dma_start(src, (slice(0, 3),), dst, None, core=(0, 0), dst_sem=sems[0])


@pytest.mark.parametrize("mode", ["on_wait", "eager"])
def test_dma_strided_and_int_regions(mode):
    sim = Simulation(dma_execution_mode=mode)
    src = sim.allocate(HBM, 0, 0, name="m", value=np.arange(36, dtype=np.int32).reshape(6, 6))
    dst = sim.allocate(VMEM, 0, 0, name="v", value=np.zeros((3, 2), np.int32))
    sem = sim.allocate_semaphores(0, 0, kind=DMA, name="s")

    def body():
        sim.dma_start(src, (slice(0, 6, 2), slice(5, 0, -4)), dst, None, core=(0, 0), dst_sem=sem)
        sim.dma_start(src, (3, slice(0, 2)), dst, (1,), core=(0, 0), dst_sem=sem)
        sim.dma_wait(sem, 3 * 2 * 4 + 2 * 4, core=(0, 0))

    sim.run({(0, 0): body})
    expected = np.arange(36).reshape(6, 6)[0:6:2, 5:0:-4].copy()
    expected[1] = [18, 19]
    np.testing.assert_array_equal(sim.value(dst), expected)


def _two_dmas_one_semaphore(order, seed):
    """Two DMAs write the same destination and signal one semaphore; wait for one."""
    sim = Simulation(dma_order=order, seed=seed)
    a = sim.allocate(HBM, 0, 0, name="a", value=np.full(4, 1, np.float32))
    b = sim.allocate(HBM, 0, 0, name="b", value=np.full(4, 2, np.float32))
    dst = sim.allocate(VMEM, 0, 0, name="dst", shape=(4,), dtype=np.float32)
    sem = sim.allocate_semaphores(0, 0, kind=DMA, name="sem")
    seen = []

    def body():
        sim.dma_start(a, None, dst, None, core=(0, 0), dst_sem=sem)
        sim.dma_start(b, None, dst, None, core=(0, 0), dst_sem=sem)
        sim.dma_wait(sem, 16, core=(0, 0))
        seen.append(float(sim.read(dst, (0,), core=(0, 0))))
        sim.dma_wait(sem, 16, core=(0, 0))
        seen.append(float(sim.read(dst, (0,), core=(0, 0))))

    sim.run({(0, 0): body})
    return tuple(seen)


def test_dma_order_issue_and_random():
    assert {_two_dmas_one_semaphore("issue", s) for s in range(8)} == {(1.0, 2.0)}
    random_orders = {_two_dmas_one_semaphore("random", s) for s in range(16)}
    assert random_orders == {(1.0, 2.0), (2.0, 1.0)}
    assert _two_dmas_one_semaphore("random", 3) == _two_dmas_one_semaphore("random", 3)


@pytest.mark.parametrize("mode", ["on_wait", "eager"])
def test_remote_dma_and_remote_signal_between_devices(mode):
    sim = Simulation(num_devices=2, dma_execution_mode=mode, seed=1)
    src = sim.allocate(HBM, 0, 0, name="send_buf", value=np.arange(4, dtype=np.float32))
    dst = sim.allocate(HBM, 1, 0, name="recv_buf", shape=(4,), dtype=np.float32)
    sems = {d: sim.allocate_semaphores(d, 0, kind=DMA, name="sems", shape=(2,)) for d in range(2)}
    ready = {d: int(sim.allocate_semaphores(d, 0, kind=SemaphoreKind.REGULAR, name="ready")) for d in range(2)}
    assert (sems[0] == sems[1]).all() and ready[0] == ready[1]
    got = {}

    def sender():
        sim.semaphore_wait(ready[0], 1, core=(0, 0))  # device 1 is ready to receive
        sim.dma_start(src, None, dst, None, core=(0, 0), dst_sem=sems[0][0], src_sem=sems[0][1],
                      dst_core=(1, 0))
        sim.dma_wait(sems[0][1], 16, core=(0, 0))

    def receiver():
        sim.semaphore_signal(ready[1], 1, core=(1, 0), target=(0, 0))
        sim.dma_wait(sems[1][0], 16, core=(1, 0))
        got["data"] = sim.read(dst, None, core=(1, 0))

    sim.run({(0, 0): sender, (1, 0): receiver})
    np.testing.assert_array_equal(got["data"], [0, 1, 2, 3])


def test_remote_dma_default_dst_core_is_same_core_on_destination_device():
    sim = Simulation(num_devices=2, cores_per_device=2)
    src = sim.allocate(HBM, 0, 0, name="s", value=np.ones(2, np.float32))
    dst = sim.allocate(HBM, 1, 0, name="d", shape=(2,), dtype=np.float32)
    sem = {c: sim.allocate_semaphores(*c, kind=DMA, name="sem") for c in [(0, 1), (1, 1)]}

    def body():
        sim.dma_start(src, None, dst, None, core=(0, 1), dst_sem=sem[(0, 1)])

    def receiver():
        sim.dma_wait(sem[(1, 1)], 8, core=(1, 1))

    sim.run({(0, 1): body, (1, 1): receiver})
    np.testing.assert_array_equal(sim.value(dst), [1, 1])


def test_barrier_orders_all_cores_of_all_devices():
    sim = Simulation(num_devices=2, cores_per_device=2, seed=5)
    board = sim.allocate(HBM, 0, 0, name="board", value=np.zeros(4, np.int32))
    seen = {}

    def body(d, c):
        def run():
            sim.write(board, (2 * d + c,), 1, core=(0, 0))
            sim.barrier((d, c), site=f"barrier of {d},{c}")
            seen[(d, c)] = sim.read(board, None, core=(0, 0)).sum()
            sim.barrier((d, c))
        return run

    sim.run({(d, c): body(d, c) for d in range(2) for c in range(2)})
    assert seen == {(d, c): 4 for d in range(2) for c in range(2)}


def test_barrier_semaphore_between_neighbours():
    n = 4
    sim = Simulation(num_devices=n, seed=2)
    order = []

    def body(d):
        def run():
            barrier = sim.barrier_semaphore(d)
            for peer in ((d + 1) % n, (d - 1) % n):
                sim.semaphore_signal(barrier, 1, core=(d, 0), target=(peer, 0))
            sim.semaphore_wait(barrier, 2, core=(d, 0))
            order.append(d)
        return run

    sim.run({(d, 0): body(d) for d in range(n)})
    assert sorted(order) == list(range(n))
    assert all(sim.barrier_semaphore(d) == sim.barrier_semaphore(0) for d in range(n))


def test_semaphore_leak_at_exit_names_semaphore_and_core():
    sim = Simulation(num_devices=1, cores_per_device=2)
    sims = sim.allocate_semaphores(0, 1, kind=SemaphoreKind.REGULAR, name="flags", shape=(3,))

    def body():
        sim.semaphore_signal(sims[2], 1, core=(0, 1))

    with pytest.raises(SemaphoreLeakError) as info:
        sim.run({(0, 1): body})
    text = str(info.value)
    assert "'flags[2]'" in text and "device 0 core 1" in text and "count 1" in text
    sim.run({(0, 1): lambda: None}, check_leaks=False)


def test_dma_never_waited_for_runs_at_exit_and_leaks():
    sim, src, dst, sems = _copy_setup("on_wait")

    def body():
        sim.dma_start(src, (slice(0, 4),), dst, None, core=(0, 0), dst_sem=sems[1])

    with pytest.raises(SemaphoreLeakError, match=r"DMA semaphore 'copy_sems\[1\]'.*count 16 bytes"):
        sim.run({(0, 0): body})
    np.testing.assert_array_equal(sim.value(dst), [0, 1, 2, 3])


def test_free_semaphores_leak_checks_the_scope():
    sim = Simulation()
    ids = sim.allocate_semaphores(0, 0, kind=SemaphoreKind.REGULAR, name="scoped", shape=(2,))
    sim.semaphore_signal(ids[1], 2, core=(0, 0))
    with pytest.raises(SemaphoreLeakError, match=r"'scoped\[1\]'.*device 0 core 0: count 2"):
        sim.free_semaphores(ids, device=0, core=0, site="kernel.py:7")
    clean = sim.allocate_semaphores(0, 0, kind=SemaphoreKind.REGULAR, name="clean")
    assert int(clean) == int(ids[-1]) + 1  # ids keep increasing in program order
    sim.free_semaphores(clean, device=0, core=0)
    sim.check_semaphores()


def test_semaphore_ids_follow_program_order_per_core():
    sim = Simulation(num_devices=2, cores_per_device=2)
    ids = [sim.allocate_semaphores(d, c, kind=DMA, name="s", shape=(2, 3)) for d in range(2) for c in range(2)]
    for other in ids[1:]:
        np.testing.assert_array_equal(other, ids[0])
    assert ids[0].dtype == np.int64 and ids[0].shape == (2, 3)
    assert sim.barrier_semaphore(0) not in ids[0]


@pytest.mark.parametrize("mode", ["eager", "on_wait"])
def test_dma_view_maps_and_masks_both_sides(mode):
    sim = Simulation(dma_execution_mode=mode, detect_races=True)
    src = sim.allocate(HBM, 0, 0, name="x", value=np.arange(8, dtype=np.float32))
    dst = sim.allocate(VMEM, 0, 0, name="y", value=np.zeros((2, 4), np.float32))
    sems = sim.allocate_semaphores(0, 0, kind=DMA, name="s", shape=(1,))
    # Read x[4:12] (elements past 8 masked off), write them reversed into y's row 1.
    view = DmaView(
        src_mask=np.arange(8) < 4,
        dst_mask=np.array([[False] * 4, [True] * 4]),
        convert=lambda data: np.stack([np.zeros(4, np.float32), data[:4][::-1]]),
    )

    def body():
        sim.dma_start(src, (slice(4, 12),), dst, None, core=(0, 0), dst_sem=sems[0], view=view)
        sim.dma_wait(sems[0], 16, core=(0, 0))  # the bytes of the 4 elements read

    sim.run({(0, 0): body})
    np.testing.assert_array_equal(sim.value(dst), [[0, 0, 0, 0], [7, 6, 5, 4]])
    with pytest.raises(OutOfBoundsError, match="DMA read of 'x'"):
        bad = DmaView(src_mask=np.arange(8) < 5, convert=view.convert)
        sim.run({(0, 0): lambda: sim.dma_start(src, (slice(4, 12),), dst, None, core=(0, 0),
                                                 dst_sem=sems[0], view=bad)})


@pytest.mark.parametrize("mode", ["eager", "on_wait"])
def test_add_dma_accumulates(mode):
    sim, src, dst, sems = _copy_setup(mode)

    def body():
        sim.write(dst, None, np.full(4, 10, np.float32), core=(0, 0))
        sim.dma_start(src, (slice(2, 6),), dst, None, core=(0, 0), dst_sem=sems[0], add=True)
        sim.dma_wait(sems[0], 16, core=(0, 0))
        sim.dma_start(src, (slice(0, 4),), dst, None, core=(0, 0), dst_sem=sems[0], add=True)
        sim.dma_wait(sems[0], 16, core=(0, 0))

    sim.run({(0, 0): body})
    np.testing.assert_array_equal(sim.value(dst), [12, 14, 16, 18])


@pytest.mark.timeout(60)
def test_a_wait_on_a_semaphore_whose_dmas_all_completed_is_a_deadlock():
    """A blocked wait is ready while some pending DMA will still signal its semaphore
    (the semaphore's ``live`` count); once every DMA signalled, a short count deadlocks."""
    from palladium.shared_memory import DeadlockError

    sim, src, dst, sems = _copy_setup("on_wait", cores_per_device=2)
    sim2 = {}

    def body():
        for start in (0, 4):
            sim.dma_start(src, (slice(start, start + 4),), dst, None, core=(0, 0),
                          dst_sem=sems[0], src_sem=sems[1])
        table = sim.semaphores.by_core[(0, 0)]
        sim2["live"] = (table[int(sems[0])].live, table[int(sems[1])].live)
        sim.dma_wait(sems[1], 32, core=(0, 0))  # both read phases
        sim2["after_send"] = (table[int(sems[0])].live, table[int(sems[1])].live)
        sim.dma_wait(sems[0], 48, core=(0, 0))  # only 32 bytes will ever arrive

    def other():
        sim.yield_point()

    with pytest.raises(DeadlockError, match="copy_sems"):
        sim.run({(0, 0): body, (0, 1): other})
    assert sim2 == {"live": (2, 2), "after_send": (2, 0)}


def test_completed_dmas_leave_the_queue_and_their_semaphores_and_in_flight_keeps_issue_order():
    # 600 DMAs: every other one waited for at once, the others left in flight; completed
    # ones are pruned as the queue grows (freed soon after they complete), and the ones
    # in flight stay in the order they were issued.
    n = 600
    sim = Simulation(dma_execution_mode="on_wait")
    src = sim.allocate(HBM, 0, 0, name="x", value=np.arange(n, dtype=np.float32))
    dst = sim.allocate(VMEM, 0, 0, name="y", shape=(n,), dtype=np.float32)
    sems = sim.allocate_semaphores(0, 0, kind=DMA, name="s", shape=(n,))
    seen = {}

    def body():
        longest = 0
        for i in range(n):
            sim.dma_start(src, (slice(i, i + 1),), dst, (slice(i, i + 1),), core=(0, 0),
                          dst_sem=sems[i])
            if i % 2 == 0:
                sim.dma_wait(sems[i], 4, core=(0, 0))
            longest = max(longest, len(sim.dma_queue.pending))
        seen["longest"] = longest
        seen["in_flight"] = [d.dst_sem.id for d in sim.dma_queue.in_flight()]
        seen["waited_pending"] = [sim.semaphores.get((0, 0), sems[i]).pending
                                  for i in range(0, n, 2)]
        for i in range(1, n, 2):
            sim.dma_wait(sems[i], 4, core=(0, 0))

    sim.run({(0, 0): body})
    assert seen["in_flight"] == [int(sems[i]) for i in range(1, n, 2)]
    assert seen["waited_pending"] == [()] * (n // 2)
    assert seen["longest"] < n
    np.testing.assert_array_equal(sim.read(dst, None, core=(0, 0)), np.arange(n))


def test_a_cleared_table_forgets_every_semaphore_and_keeps_the_cores():
    sim = Simulation(num_devices=2)
    ids = sim.allocate_semaphores(1, 0, kind=DMA, name="s", shape=(3,))
    sim.semaphore_signal(int(ids[1]), 2, core=(1, 0))
    assert sim.semaphores.get((1, 0), int(ids[1])).count == 2
    sim.semaphores.clear()
    assert list(sim.semaphores) == []
    assert sim.semaphores.check_core((1, 0)) == (1, 0)
    with pytest.raises(SimulationError, match=rf"^device 1 core 0: semaphore id {int(ids[1])} "
                                              r"was never allocated$"):
        sim.semaphores.get((1, 0), int(ids[1]))
