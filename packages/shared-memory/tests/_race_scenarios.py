"""A race scenario shared by this package's race tests: one core starts a DMA into VMEM,
maybe reads part of it before waiting (the race), waits, then reads it all."""

import numpy as np

from palladium.shared_memory import MemorySpace, SemaphoreKind, Simulation

HBM, VMEM = MemorySpace.HBM, MemorySpace.VMEM


def dma_then_read(mode, read_before_wait, on_race="raise", race_memo=None):
    """The scenario run in a new ``Simulation`` (DMA execution ``mode``); the simulation."""
    sim = Simulation(detect_races=True, dma_execution_mode=mode, on_race=on_race,
                     race_memo=race_memo)
    src = sim.allocate(HBM, 0, 0, name="x", value=np.arange(8, dtype=np.float32))
    dst = sim.allocate(VMEM, 0, 0, name="x_vmem", shape=(8,), dtype=np.float32)
    sem = sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="sem")

    def body():
        sim.dma_start(src, None, dst, None, core=(0, 0), dst_sem=sem, site="kernel.py:10")
        if read_before_wait:
            sim.read(dst, (slice(0, 4),), core=(0, 0), site="kernel.py:11")
        sim.dma_wait(sem, 32, core=(0, 0), site="kernel.py:12")
        sim.read(dst, None, core=(0, 0), site="kernel.py:13")

    sim.run({(0, 0): body})
    return sim
