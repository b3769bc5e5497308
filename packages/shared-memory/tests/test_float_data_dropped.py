"""``SimulationOptions(keep_float_data=False)``: floating-point buffers hold no data (for
predictions that need shapes only). Reads give the fill, writes and DMAs check their
bounds and move no bytes; semaphores count the DMAs' bytes as ever; integer buffers keep
their data."""

import numpy as np
import pytest

from palladium.shared_memory import (
    MemorySpace,
    OutOfBoundsError,
    SemaphoreKind,
    Simulation,
    SimulationOptions,
)

HBM, VMEM, SMEM = MemorySpace.HBM, MemorySpace.VMEM, MemorySpace.SMEM
try:  # shared_memory needs only numpy; bfloat16 where ml_dtypes (jax's) is installed
    import ml_dtypes

    FLOATS = [np.float32, np.float16, ml_dtypes.bfloat16]
except ImportError:
    FLOATS = [np.float32, np.float16]


def dropped(**kw):
    return Simulation(options=SimulationOptions(keep_float_data=False, **kw))


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_buffers_hold_no_data_and_read_the_fill(dtype):
    sim = dropped()
    x = sim.allocate(HBM, 0, 0, name="x", value=np.arange(4096, dtype=np.float32).astype(dtype))
    v = sim.allocate(VMEM, 0, 0, name="v", shape=(64, 64), dtype=dtype)
    out = {}

    def body():
        sim.write(v, (slice(0, 8),), np.ones((8, 64), dtype), core=(0, 0))
        out["v"] = sim.read(v, (slice(0, 8),), core=(0, 0))
        out["x"] = sim.read(x, (slice(0, 4),), core=(0, 0))
        sim.copy(x, (slice(0, 64),), v, (0,), core=(0, 0))

    sim.run({(0, 0): body})
    assert out["v"].shape == (8, 64) and out["v"].dtype == np.dtype(dtype)
    assert np.isnan(out["v"].astype(np.float32)).all()  # the fill, not the ones written
    assert np.isnan(out["x"].astype(np.float32)).all()  # the input was not kept either
    assert out["v"].strides == (0, 0)  # no memory behind it
    whole = sim.value(x)
    assert whole.shape == (4096,) and np.isnan(whole.astype(np.float32)).all()


def test_integer_buffers_keep_their_data():
    sim = dropped()
    idx = sim.allocate(SMEM, 0, 0, name="idx", value=np.array([3, 1, 2], np.int32))
    out = {}

    def body():
        sim.write(idx, (0,), np.int32(7), core=(0, 0))
        out["idx"] = sim.read(idx, None, core=(0, 0))

    sim.run({(0, 0): body})
    np.testing.assert_array_equal(out["idx"], [7, 1, 2])


def test_out_of_bounds_writes_and_dma_reads_still_raise():
    sim = dropped()
    v = sim.allocate(VMEM, 0, 0, name="v", shape=(8, 128), dtype=np.float32)

    with pytest.raises(OutOfBoundsError, match=r"Out-of-bounds write of 'v'"):
        sim.run({(0, 0): lambda: sim.write(v, (slice(4, 12),), np.zeros((8, 128), np.float32),
                                           core=(0, 0))})
    sim = dropped()
    x = sim.allocate(HBM, 0, 0, name="x", shape=(16, 128), dtype=np.float32)
    v = sim.allocate(VMEM, 0, 0, name="v", shape=(8, 128), dtype=np.float32)
    (sem,) = sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="s", shape=(1,))

    def body():
        sim.dma_start(x, (slice(12, 20),), v, None, core=(0, 0), dst_sem=sem)
        sim.dma_wait(sem, 8 * 128 * 4, core=(0, 0))

    with pytest.raises(OutOfBoundsError, match=r"'x'"):
        sim.run({(0, 0): body})


def test_a_dma_signals_its_bytes_without_moving_them():
    sim = dropped()
    x = sim.allocate(HBM, 0, 0, name="x", shape=(16, 128), dtype=np.float32)
    v = sim.allocate(VMEM, 0, 0, name="v", shape=(8, 128), dtype=np.float32)
    (sem,) = sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="s", shape=(1,))
    done = []

    def body():
        sim.dma_start(x, (slice(8, 16),), v, None, core=(0, 0), dst_sem=sem)
        sim.dma_wait(sem, 8 * 128 * 4, core=(0, 0))  # the exact byte count, or a deadlock
        done.append(True)

    sim.run({(0, 0): body})
    assert done == [True]


def test_a_dma_between_buffers_without_data_signals_both_semaphores_in_its_phases():
    """Such a DMA (``Dma.hollow``) runs no read or write: its read phase signals the send
    semaphore, its write phase the receive one, and a write out of bounds raised at the
    start."""
    sim = dropped()
    x = sim.allocate(HBM, 0, 0, name="x", shape=(16, 128), dtype=np.float32)
    v = sim.allocate(VMEM, 0, 0, name="v", shape=(8, 128), dtype=np.float32)
    send, recv = sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="s", shape=(2,))
    counts = []

    def body():
        sim.dma_start(x, (slice(0, 8),), v, None, core=(0, 0), dst_sem=recv, src_sem=send)
        sim.dma_wait(send, 8 * 128 * 4, core=(0, 0))  # the read phase only
        counts.append(sim.semaphore_read(recv, core=(0, 0)))
        sim.dma_wait(recv, 8 * 128 * 4, core=(0, 0))

    sim.run({(0, 0): body})
    assert counts in ([0], [8 * 128 * 4])  # (a polling point may let the write land)

    sim = dropped()
    x = sim.allocate(HBM, 0, 0, name="x", shape=(16, 128), dtype=np.float32)
    v = sim.allocate(VMEM, 0, 0, name="v", shape=(8, 128), dtype=np.float32)
    (sem,) = sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="s", shape=(1,))
    with pytest.raises(OutOfBoundsError, match=r"'v'"):
        sim.run({(0, 0): lambda: sim.dma_start(x, (slice(0, 8),), v, (slice(4, 12),),
                                               core=(0, 0), dst_sem=sem)})
