"""A failed launch's exception carries ``snapshot``: each core's grid point, state and
line, every semaphore's count, the DMAs in flight, and the buffers' contents (bounded by
``InterpretParams.failure_snapshot_bytes``; the failure log keeps the contents of its
newest few entries only)."""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import (
    DataRaceError,
    DeadlockError,
    InterpretParams,
    OutOfBoundsError,
    Snapshot,
    errors_as_raised,
)
from palladium.interpret.state.failures import FailureLog
from palladium.shared_memory import BufferState

pytestmark = pytest.mark.timeout(120)

ANY = pl.BlockSpec(memory_space=pl.ANY)
F32 = jnp.float32


def waits_forever(x_ref, o_ref, s, sem):
    s[...] = x_ref[...] * 3.0
    pl.semaphore_signal(sem, 2)
    pl.semaphore_wait(sem, 5)  # BUG: only 2 were signalled
    o_ref[...] = s[...]


def _deadlock():
    f = pl.pallas_call(waits_forever, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                       scratch_shapes=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.REGULAR],
                       interpret=InterpretParams())
    with pytest.raises(DeadlockError) as e, errors_as_raised():
        jax.block_until_ready(f(jnp.full((8, 128), 2.0, F32)))
    return e.value


def test_a_deadlock_keeps_the_buffers_semaphores_and_each_cores_state():
    snap = _deadlock().snapshot
    assert isinstance(snap, Snapshot)
    np.testing.assert_array_equal(snap.buffer("s"), np.full((8, 128), 6.0, np.float32))
    np.testing.assert_array_equal(snap.buffer("x_ref", space="VMEM"), 2.0)
    assert snap.semaphore("sem") == 2
    [core] = snap.cores
    assert (core.core, core.state, core.grid_point) == ((0, 0), "failed", ())
    summary = snap.summary()
    assert summary.startswith("simulated state at the failure (DeadlockError):\ncores:\n"
                              "  device 0 core 0 at grid point () failed")
    assert "'sem' (regular, device 0 core 0) = 2" in summary
    assert "'s' (VMEM, device 0 core 0) float32[8, 128]" in summary


def racy(x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    o_ref[...] = buf[...] * 2.0  # BUG: reads the DMA's destination before the wait
    copy.wait()


def test_a_race_keeps_the_dma_in_flight():
    f = pl.pallas_call(racy, out_shape=jax.ShapeDtypeStruct((8, 128), F32), in_specs=[ANY],
                       scratch_shapes=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA],
                       interpret=InterpretParams(detect_races=True, dma_execution_mode="eager"))
    with pytest.raises(DataRaceError) as e, errors_as_raised():
        jax.block_until_ready(f(jnp.ones((8, 128), F32)))
    snap = e.value.snapshot
    np.testing.assert_array_equal(snap.buffer("buf"), 1.0)  # eager: the DMA landed
    assert snap.semaphore("sem") == 8 * 128 * 4  # its bytes, not yet waited for


def test_a_pending_dma_is_listed_with_its_line():
    f = pl.pallas_call(racy, out_shape=jax.ShapeDtypeStruct((8, 128), F32), in_specs=[ANY],
                       scratch_shapes=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA],
                       interpret=InterpretParams(detect_races=True, uninitialized_reads="raise"))
    with pytest.raises(Exception) as e, errors_as_raised():  # the read: a race or unwritten
        jax.block_until_ready(f(jnp.ones((8, 128), F32)))
    [dma] = e.value.snapshot.dmas
    assert (dma.core, dma.state, dma.nbytes) == ((0, 0), "started", 4096)
    line = racy.__code__.co_firstlineno + 2
    assert f"test_failure_snapshot.py:{line}" in dma.site
    assert "x_hbm->buf (4096 bytes, started) at kernel 'racy'" in e.value.snapshot.summary()


def out_of_bounds(x_ref, o_ref):
    i = pl.program_id(0)
    o_ref[...] = x_ref[pl.ds(i * 8, 8), :]  # BUG at i == 1: rows 8:16 of an 8-row block


def test_the_failing_cores_grid_point_at_an_out_of_bounds_read():
    spec = pl.BlockSpec((8, 128), lambda i: (0, 0))
    f = pl.pallas_call(out_of_bounds, out_shape=jax.ShapeDtypeStruct((8, 128), F32), grid=(2,),
                       in_specs=[spec], out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
                       interpret=InterpretParams())
    with pytest.raises(OutOfBoundsError) as e, errors_as_raised():
        jax.block_until_ready(f(jnp.ones((8, 128), F32)))
    [core] = e.value.snapshot.cores
    assert (core.state, core.grid_point) == ("failed", (1,))


def test_the_contents_are_bounded_by_failure_snapshot_bytes():
    f = pl.pallas_call(waits_forever, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                       scratch_shapes=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.REGULAR],
                       interpret=InterpretParams(failure_snapshot_bytes=3 * 4096))
    with pytest.raises(DeadlockError) as e, errors_as_raised():
        jax.block_until_ready(f(jnp.full((8, 128), 2.0, F32)))
    snap = e.value.snapshot
    kept = [b for b in snap.buffers if b.data is not None]
    assert len(snap.buffers) == 5 and len(kept) == 3 and snap.nbytes == 3 * 4096
    with pytest.raises(DeadlockError) as e, errors_as_raised():
        jax.block_until_ready(pl.pallas_call(
            waits_forever, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
            scratch_shapes=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.REGULAR],
            interpret=InterpretParams(failure_snapshot_bytes=0))(jnp.ones((8, 128), F32)))
    snap = e.value.snapshot
    assert snap.nbytes == 0 and snap.semaphore("sem") == 2
    with pytest.raises(KeyError, match="its contents were not kept"):
        snap.buffer("s")


def test_the_snapshot_is_freed_with_the_exception():
    error = _deadlock()
    ref = weakref.ref(error.snapshot)
    del error
    gc.collect()
    assert ref() is None


def test_the_failure_log_keeps_the_contents_of_its_newest_entries_only():
    log = FailureLog(capacity=8, snapshots_with_contents=2)
    errors = []
    for i in range(5):
        e = DeadlockError(f"failure {i}")
        e.snapshot = Snapshot(buffers=(BufferState("s", "VMEM", 0, 0, (4,), "float32",
                                                   np.zeros(4, np.float32)),))
        log.record(e)
        errors.append(e)
    kept = [log.claim(str(e)) for e in errors]
    assert [k.snapshot.nbytes for k in kept] == [0, 0, 0, 16, 16]
    assert all(k.snapshot.buffers[0].shape == (4,) for k in kept)


def each_core_waits(x_ref, o_ref, sem):
    o_ref[...] = x_ref[...]
    pl.semaphore_wait(sem, 1)  # BUG: nobody signals


def test_with_two_cores_each_cores_grid_point_and_wait_are_kept():
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    f = pl.pallas_call(each_core_waits, out_shape=jax.ShapeDtypeStruct((16, 128), F32),
                       grid=(2,), in_specs=[spec], out_specs=spec,
                       scratch_shapes=[pltpu.SemaphoreType.REGULAR],
                       compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
                       interpret=InterpretParams(num_cores_or_threads=2))
    with pytest.raises(DeadlockError) as e, errors_as_raised():
        jax.block_until_ready(f(jnp.ones((16, 128), F32)))
    cores = {c.core: c for c in e.value.snapshot.cores}
    assert {c: (s.grid_point, s.state) for c, s in cores.items()} in (
        {(0, 0): ((0,), "failed"), (0, 1): ((1,), "blocked")},
        {(0, 0): ((0,), "blocked"), (0, 1): ((1,), "failed")},
    )
    blocked = next(s for s in cores.values() if s.state == "blocked")
    assert "semaphore 'sem'" in blocked.where
    line = each_core_waits.__code__.co_firstlineno + 2
    assert f"test_failure_snapshot.py:{line}" in blocked.where
