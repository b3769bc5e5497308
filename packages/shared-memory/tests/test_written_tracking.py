"""``uninitialized_reads``: per-element written-ness, carried by DMAs and block copies,
reported at reads; and ``Simulation.snapshot``. A brute-force oracle (a set of written
indices) checks every read of random writes and copies."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from palladium.shared_memory import (
    MemorySpace,
    SemaphoreKind,
    Simulation,
    UninitializedReadError,
    UninitializedReadWarning,
)

pytestmark = pytest.mark.timeout(120)
CORE = (0, 0)


def _sim(mode="raise", **kw):
    return Simulation(uninitialized_reads=mode, **kw)


def test_off_tracks_nothing():
    sim = Simulation()
    v = sim.allocate(MemorySpace.VMEM, 0, 0, name="v", shape=(4,), dtype=np.float32)
    assert np.isnan(sim.read(v, None, core=CORE)).all()
    assert sim.unwritten(v, None) is None


def test_a_read_names_the_region_nothing_wrote():
    sim = _sim(cores_per_device=2)
    v = sim.allocate(MemorySpace.VMEM, 0, 1, name="v", shape=(4, 8), dtype=np.float32)
    sim.write(v, (slice(0, 2),), np.ones((2, 8)), core=(0, 1))
    np.testing.assert_array_equal(sim.read(v, (slice(0, 2),), core=(0, 1)), 1.0)
    with pytest.raises(UninitializedReadError) as e:
        sim.read(v, (slice(1, 3), slice(2, 5)), core=(0, 1), site="k.py:3")
    assert str(e.value) == (
        "device 0 core 1: read of never-written memory: 'v' (VMEM, device 0 core 1) region "
        "[2:3, 2:5] (3 of the 6 elements read were never written by a store, DMA, block copy "
        "or input) at k.py:3. On a TPU these bytes are whatever an earlier kernel left there. "
        "Write it first (a store, a DMA into it), or pass uninitialized_reads='off'.")


def test_masks_count_only_their_true_elements():
    sim = _sim()
    v = sim.allocate(MemorySpace.VMEM, 0, 0, name="v", shape=(8,), dtype=np.int32)
    low = np.arange(8) < 3
    sim.write(v, None, np.arange(8), mask=low, core=CORE)
    np.testing.assert_array_equal(sim.read(v, None, mask=low, core=CORE)[:3], [0, 1, 2])
    with pytest.raises(UninitializedReadError, match=r"region \[3:4\] \(1 of the 8"):
        sim.read(v, None, mask=np.arange(8) < 4, core=CORE)


def test_warn_warns_once_per_buffer_and_line_and_keeps_every_report():
    sim = _sim("warn")
    v = sim.allocate(MemorySpace.SMEM, 0, 0, name="v", shape=(4,), dtype=np.int32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            sim.read(v, (1,), core=CORE, site="k.py:1")
        sim.read(v, (2,), core=CORE, site="k.py:2")
    assert [w.category for w in caught] == [UninitializedReadWarning] * 2
    assert len(sim.uninitialized_reports) == 4


def _dma(sim, src, src_region, dst, dst_region, nbytes):
    sem = int(sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="sem"))

    def body():
        sim.dma_start(src, src_region, dst, dst_region, core=CORE, dst_sem=sem)
        sim.dma_wait(sem, nbytes, core=CORE)

    sim.run({CORE: body})


@pytest.mark.parametrize("mode", ["on_wait", "eager"])
def test_a_dma_carries_written_ness_and_reports_a_wholly_unwritten_source(mode):
    sim = _sim(dma_execution_mode=mode)
    a = sim.allocate(MemorySpace.VMEM, 0, 0, name="a", shape=(8,), dtype=np.float32)
    b = sim.allocate(MemorySpace.VMEM, 0, 0, name="b", shape=(8,), dtype=np.float32)
    sim.write(a, (slice(0, 4),), np.ones(4), core=CORE)
    _dma(sim, a, None, b, None, 32)  # half written: carried, not reported
    assert sim.unwritten(b, None) == ("[4:8]", 4, 8)
    c = sim.allocate(MemorySpace.VMEM, 0, 0, name="c", shape=(4,), dtype=np.float32)
    with pytest.raises(UninitializedReadError, match=r"a DMA \(DMA #1 a->c\) reads "
                       r"never-written memory: 'a' \(VMEM, device 0 core 0\) region \[4:8\]"):
        _dma(sim, a, (slice(4, 8),), c, None, 16)


def test_a_block_copy_counts_elements_past_the_source_as_written():
    sim = _sim(out_of_bounds="uninitialized")
    x = sim.allocate(MemorySpace.HBM, 0, 0, name="x", value=np.arange(6.0))
    v = sim.allocate(MemorySpace.VMEM, 0, 0, name="v", shape=(4,), dtype=np.float64)
    sim.copy(x, (slice(4, 8),), v, None, core=CORE)  # a partial edge block
    assert sim.unwritten(v, None) is None
    sim.mark_written(v, False)
    assert sim.unwritten(v, None) == ("[0:4]", 4, 4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["write", "copy"]), st.integers(0, 11),
                          st.integers(1, 6)), max_size=8),
       st.integers(0, 11), st.integers(1, 12))
def test_reads_agree_with_a_set_of_written_indices(ops, lo, size):
    sim = _sim("warn")
    src = sim.allocate(MemorySpace.VMEM, 0, 0, name="src", shape=(12,), dtype=np.float32)
    dst = sim.allocate(MemorySpace.VMEM, 0, 0, name="dst", shape=(12,), dtype=np.float32)
    written_src, written_dst = set(), set()
    for op, start, n in ops:
        stop = min(start + n, 12)
        if op == "write":
            sim.write(src, (slice(start, stop),), np.zeros(stop - start), core=CORE)
            written_src |= set(range(start, stop))
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sim.copy(src, (slice(start, stop),), dst, (slice(start, stop),), core=CORE)
            for i in range(start, stop):
                (written_dst.add if i in written_src else written_dst.discard)(i)
    hi = min(lo + size, 12)
    missing = [i for i in range(lo, hi) if i not in written_dst]
    found = sim.unwritten(dst, (slice(lo, hi),))
    if not missing:
        assert found is None
    else:
        assert found == (f"[{min(missing)}:{max(missing) + 1}]", len(missing), hi - lo)


def test_a_failed_run_carries_a_snapshot_taken_before_the_cores_unwind():
    sim = _sim("off", num_devices=1, cores_per_device=2, snapshot_bytes=1 << 20)
    sim.allocate(MemorySpace.VMEM, 0, 0, name="v", value=np.arange(4.0))
    [sem] = sim.allocate_semaphores(0, 1, kind=SemaphoreKind.REGULAR, name="sem", shape=(1,))
    sim.grid_point_of = lambda core: (core[1], 7)

    def waits():
        sim.semaphore_wait(int(sem), 1, core=(0, 1), site="k.py:9")

    def fails():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError) as e:
        sim.run({(0, 0): fails, (0, 1): waits})
    snap = e.value.snapshot
    states = {c.core: (c.state, c.grid_point) for c in snap.cores}
    assert states[(0, 0)] == ("failed", (0, 7))
    assert states[(0, 1)][1] == (1, 7)
    np.testing.assert_array_equal(snap.buffer("v"), np.arange(4.0))
    assert snap.summary().startswith("simulated state at the failure (RuntimeError):")
