"""A run freezes the heap from before it (gc.freeze) and gives it back after."""

import gc

import numpy as np
import pytest

from palladium.shared_memory import MemorySpace, SemaphoreKind, Simulation, collector
from palladium.shared_memory.collector import frozen_heap


@pytest.fixture(autouse=True)
def _unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_run_freezes_the_heap_from_before_it_and_unfreezes_it_after():
    sim = Simulation(num_devices=2)
    x = sim.allocate(MemorySpace.HBM, 0, 0, name="x", value=np.arange(4.0, dtype=np.float32))
    y = sim.allocate(MemorySpace.HBM, 1, 0, name="y", shape=(4,), dtype=np.float32)
    sem = int(sim.allocate_semaphores(1, 0, kind=SemaphoreKind.DMA, name="sem"))
    seen = []

    def send():
        seen.append(gc.get_freeze_count())
        sim.dma_start(x, None, y, None, core=(0, 0), dst_sem=sem, dst_core=(1, 0))

    def receive():
        sim.dma_wait(sem, 16, core=(1, 0))
        seen.append(gc.get_freeze_count())

    sim.run({(0, 0): send, (1, 0): receive})
    assert min(seen) > 0  # the run's bodies ran over a frozen heap
    assert gc.get_freeze_count() == 0
    np.testing.assert_array_equal(sim.value(y), np.arange(4.0, dtype=np.float32))


def test_nested_runs_unfreeze_once_at_the_outermost_end():
    with frozen_heap():
        outer = gc.get_freeze_count()
        with frozen_heap():
            assert gc.get_freeze_count() >= outer > 0
        assert gc.get_freeze_count() == outer  # the inner one did not unfreeze
    assert gc.get_freeze_count() == 0


def test_a_heap_the_process_froze_itself_is_left_alone():
    gc.freeze()
    before = gc.get_freeze_count()
    with frozen_heap():
        pass
    assert gc.get_freeze_count() == before > 0


def test_an_error_in_the_run_still_unfreezes():
    with pytest.raises(ValueError), frozen_heap():
        raise ValueError("boom")
    assert gc.get_freeze_count() == 0


def test_a_run_raises_the_young_threshold_and_restores_it_after():
    before = gc.get_threshold()
    with frozen_heap():
        inside = gc.get_threshold()
        with frozen_heap():
            assert gc.get_threshold() == inside
    assert inside == (max(before[0], collector.YOUNG), *before[1:])
    assert gc.get_threshold() == before


def test_an_error_in_the_run_still_restores_the_threshold():
    before = gc.get_threshold()
    with pytest.raises(ValueError), frozen_heap():
        raise ValueError("boom")
    assert gc.get_threshold() == before


class _Node:
    """A reference cycle (only the collector frees it)."""

    def __init__(self) -> None:
        self.me = self


def _cycles(n: int) -> list[_Node]:
    return [_Node() for _ in range(n)]


def test_a_collecting_block_that_allocated_much_frees_its_cyclic_garbage_on_leaving():
    import weakref

    before = collector.collection_count()
    with frozen_heap(collect=True):
        kept = _cycles(3 * collector.YOUNG)  # survives young collections: a large launch
        probe = weakref.ref(kept[0])
        assert collector.collection_count() > before
        del kept
        assert probe() is not None  # a cycle: refcounting alone does not free it
    assert probe() is None  # collected on leaving, before the heap was unfrozen
    assert gc.get_freeze_count() == 0


def test_a_small_collecting_block_leaves_its_garbage_to_the_collector():
    import weakref

    gc.collect()  # a fresh young generation: the block below triggers no collection
    with frozen_heap(collect=True):
        node = _Node()
        probe = weakref.ref(node)
        del node
    assert probe() is not None  # not worth a collection of its own
    gc.collect()
    assert probe() is None


def test_a_non_collecting_block_does_not_collect_on_leaving():
    import weakref

    with frozen_heap():
        kept = _cycles(3 * collector.YOUNG)
        probe = weakref.ref(kept[0])
        del kept
    assert probe() is not None
    gc.collect()
    assert probe() is None


def test_a_collecting_block_raises_the_middle_threshold_and_restores_it_after():
    before = gc.get_threshold()
    with frozen_heap(collect=True):
        inside = gc.get_threshold()
    assert inside == (max(before[0], collector.YOUNG), max(before[1], collector.MIDDLE),
                      *before[2:])
    assert gc.get_threshold() == before
    with frozen_heap():
        assert gc.get_threshold()[1] == before[1]  # only a collecting block does
