"""The simulator's DMA copies bytes between buffers of one dtype: a plain DMA between
dtypes is rejected (it would otherwise convert values)."""

import numpy as np
import pytest

from palladium.shared_memory import MemorySpace, SemaphoreKind, Simulation


def test_simulator_rejects_a_dtype_changing_dma():
    sim = Simulation(num_devices=1, cores_per_device=1)
    x = sim.allocate(MemorySpace.HBM, 0, 0, name="x", value=np.full(4, -300.5, np.float32))
    v = sim.allocate(MemorySpace.VMEM, 0, 0, name="v", shape=(4,), dtype=np.int32)
    sem = int(sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="sem"))

    def body():
        sim.dma_start(x, None, v, None, core=(0, 0), dst_sem=sem)

    with pytest.raises(ValueError, match=r"DMA from .*x.* \(float32\) to .*v.* \(int32\): the "
                                         r"dtypes differ; a DMA copies bytes"):
        sim.run({(0, 0): body})
