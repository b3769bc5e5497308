"""The ``Simulation`` is a facade over collaborators that own their operations: its
public operations are their bound methods (no forwarding call on the hot paths), it
sets no attribute it does not declare, and it inherits from nothing."""

import numpy as np
import pytest

from palladium.shared_memory import MemorySpace, SemaphoreKind, Simulation
from palladium.shared_memory.sim_buffers import BufferStore
from palladium.shared_memory.sim_dmas import DmaIssuer
from palladium.shared_memory.sim_semaphores import SemaphoreService

HOT = {
    "plan": BufferStore, "read": BufferStore, "write": BufferStore, "swap": BufferStore,
    "copy": BufferStore, "allocate": BufferStore, "free": BufferStore,
    "dma_start": DmaIssuer, "dma_wait": SemaphoreService,
    "semaphore_signal": SemaphoreService, "semaphore_wait": SemaphoreService,
    "semaphore_read": SemaphoreService, "allocate_semaphores": SemaphoreService,
}


@pytest.mark.parametrize("name", sorted(HOT))
def test_each_operation_is_its_collaborators_bound_method(name):
    sim = Simulation(2, 2, detect_races=True)
    op = getattr(sim, name)
    assert type(op.__self__) is HOT[name]
    assert op.__func__ is getattr(HOT[name], name)


def test_the_facade_inherits_nothing_and_declares_every_attribute():
    assert Simulation.__bases__ == (object,)
    sim = Simulation()
    assert not hasattr(sim, "__dict__")
    with pytest.raises(AttributeError):
        sim.scratch = 1  # type: ignore[attr-defined]


def test_the_partition_seam_is_public_on_the_collaborators():
    """What ``partition.Rounds`` reads of a simulation, by its public names."""
    sim = Simulation(1, 2, detect_races=True)
    x = sim.allocate(MemorySpace.HBM, 0, 0, name="x", value=np.arange(4.0, dtype=np.float32))
    sem = int(sim.allocate_semaphores(0, 1, kind=SemaphoreKind.REGULAR, name="s"))
    assert sim.buffers.by_key[x.key].data.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert sim.semaphores.get((0, 1), sem).name == "s"
    seen = []

    def body(core):
        def run():
            seen.append((core, list(sim.kernel_barrier.participants)))
            sim.barrier(core)
        return run

    sim.run({(0, 1): body((0, 1)), (0, 0): body((0, 0))})
    assert seen and all(p == [(0, 0), (0, 1)] for _, p in seen)
    assert sim.kernel_barrier.participants == [] and sim.kernel_barrier.arrived == []
    assert sim.races is not None and sim.races.actor((0, 0)) is sim.races.actor((0, 0))
    assert sim.race_detector is sim.races.detector
