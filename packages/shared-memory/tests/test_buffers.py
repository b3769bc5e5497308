"""Buffers: fills, padding, regions, masks, swap, out-of-bounds policies, refcounts."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from palladium.shared_memory import (
    ConfigError,
    MemorySpace,
    OutOfBoundsError,
    Simulation,
    SimulationError,
    SimulationOptions,
    padded_shape,
    uninitialized_value,
)

CORE = (0, 0)
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize(
    ("dtype", "nan_fill"),
    [
        (np.float32, np.nan),
        (BF16, np.nan),
        (np.int8, 127),
        (np.int32, 2**31 - 1),
        (np.uint8, 255),
        (np.bool_, True),
    ],
)
def test_uninitialised_fill_per_dtype(dtype, nan_fill):
    sim = Simulation()
    buf = sim.allocate(MemorySpace.VMEM, 0, 0, name="v", shape=(2, 3), dtype=dtype)
    got = sim.value(buf)
    assert got.dtype == np.dtype(dtype)
    expected = np.full((2, 3), nan_fill, dtype)
    np.testing.assert_array_equal(got.astype(np.float64), expected.astype(np.float64))
    zero = sim.allocate(MemorySpace.VMEM, 0, 0, name="z", shape=(2,), dtype=dtype, fill="zero")
    np.testing.assert_array_equal(sim.value(zero), np.zeros(2, dtype))
    zsim = Simulation(uninitialized="zero")
    buf = zsim.allocate(MemorySpace.SMEM, 0, 0, name="s", shape=(4,), dtype=dtype)
    np.testing.assert_array_equal(zsim.value(buf), np.zeros(4, dtype))


def test_allocate_with_value_copies():
    sim = Simulation()
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    buf = sim.allocate(MemorySpace.HBM, 0, 0, name="x", value=src)
    src[0, 0] = 100
    assert buf.shape == (2, 3) and buf.dtype == np.float32 and buf.name == "x"
    np.testing.assert_array_equal(sim.value(buf), np.arange(6, dtype=np.float32).reshape(2, 3))


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int8, np.uint8, np.bool_])
@pytest.mark.parametrize("fill", [None, "zero"])
def test_allocate_into_storage_fills_it_as_a_new_buffer(dtype, fill):
    sim = Simulation(num_devices=2)
    block = np.zeros((2, 3, 4), dtype) if fill is None else np.ones((2, 3, 4), dtype)
    refs = [sim.allocate(MemorySpace.HBM, d, 0, name=f"o{d}", shape=(3, 4), dtype=dtype,
                         fill=fill, storage=block[d, ...]) for d in range(2)]
    fresh = sim.allocate(MemorySpace.HBM, 0, 0, name="f", shape=(3, 4), dtype=dtype, fill=fill)
    for ref in refs:
        assert sim.contents(ref).base is block  # the storage itself, no copy
        np.testing.assert_array_equal(sim.value(ref), sim.value(fresh))  # bit for bit
        assert sim.value(ref).tobytes() == sim.value(fresh).tobytes()
    sim.write(refs[1], (slice(0, 1),), np.zeros((1, 4), dtype), core=(1, 0))
    assert block[1, 0].tobytes() == np.zeros(4, dtype).tobytes()
    assert block[0, 0].tobytes() == sim.value(fresh)[0].tobytes()


def test_allocate_into_storage_of_another_shape_is_refused():
    sim = Simulation()
    with pytest.raises(ConfigError, match=r"^buffer 'o': storage is float32\[3\], not a "
                                          r"writable C-contiguous float32\[4\]$"):
        sim.allocate(MemorySpace.HBM, 0, 0, name="o", shape=(4,), dtype=np.float32,
                     storage=np.empty(3, np.float32))
    read_only = np.empty(4, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ConfigError, match=r"storage is a read-only float32\[4\]"):
        sim.allocate(MemorySpace.HBM, 0, 0, name="o", shape=(4,), dtype=np.float32,
                     storage=read_only)
    with pytest.raises(ConfigError, match=r"storage is int32\[4\]"):
        sim.allocate(MemorySpace.HBM, 0, 0, name="o", shape=(4,), dtype=np.float32,
                     storage=np.empty(4, np.int32))
    with pytest.raises(ConfigError, match=r"not a writable C-contiguous float32\[4\]"):
        sim.allocate(MemorySpace.HBM, 0, 0, name="o", shape=(4,), dtype=np.float32,
                     storage=np.empty(8, np.float32)[::2])


def test_allocate_into_storage_without_data_leaves_it_alone():
    # floats without data (keep_float_data=False) hold no array: the storage is unused
    sim = Simulation(options=SimulationOptions(keep_float_data=False))
    storage = np.zeros(4, np.float32)
    ref = sim.allocate(MemorySpace.HBM, 0, 0, name="o", shape=(4,), dtype=np.float32,
                       storage=storage)
    assert sim.contents(ref).base is not storage
    np.testing.assert_array_equal(storage, np.zeros(4, np.float32))


@pytest.mark.parametrize(
    ("shape", "dtype", "expected"),
    [
        ((), np.float32, ()),
        ((5,), np.float32, (128,)),
        ((5,), BF16, (256,)),
        ((5,), np.int8, (512,)),
        ((3, 5), np.float32, (4, 128)),
        ((1, 5), np.float32, (1, 128)),
        ((8, 128), np.float32, (8, 128)),
        ((20, 130), np.float32, (24, 256)),
        ((20, 130), BF16, (24, 256)),
        ((20, 130), np.int8, (24, 256)),
        ((40, 1), np.int8, (40, 128)),
        ((3, 5), BF16, (4, 128)),
        ((2, 9, 129), np.float32, (2, 16, 256)),
        ((2, 9, 129), np.bool_, (2, 16, 256)),
        ((2, 40, 129), np.bool_, (2, 40, 256)),
    ],
)
def test_padded_shape(shape, dtype, expected):
    assert padded_shape(shape, dtype) == expected
    assert padded_shape(shape, dtype, generation=4) == expected


@pytest.mark.parametrize(
    ("shape", "dtype", "expected"),
    [
        ((5,), np.float32, (256,)),
        ((5,), BF16, (512,)),
        ((1, 5), np.float32, (2, 128)),
        ((3, 5), BF16, (4, 128)),
        ((1, 5), BF16, (4, 128)),
        ((20, 130), np.float32, (24, 256)),
    ],
)
def test_padded_shape_before_tpu_v4(shape, dtype, expected):
    # Mosaic's tiling factor starts at 2 * packing on TPU v2/v3.
    assert padded_shape(shape, dtype, generation=3) == expected


def test_simulation_pads_for_its_tpu_generation():
    for generation, rows in ((5, 1), (3, 2)):
        sim = Simulation(bounds="padded", tpu_generation=generation)
        buf = sim.allocate(MemorySpace.VMEM, 0, 0, name="x", value=np.ones((1, 128), np.float32))
        got = sim.read(buf, (slice(0, rows),), core=CORE)
        assert got.shape == (rows, 128)
        with pytest.raises(OutOfBoundsError):
            sim.read(buf, (slice(0, rows + 1),), core=CORE)


@pytest.mark.parametrize(
    "region",
    [
        None,
        (),
        (1,),
        (slice(1, 3),),
        (slice(None), 2),
        (slice(0, 4, 2), slice(1, 5, 3)),
        (slice(3, None, -1), slice(None, None, -2)),
        (slice(3, 0, -2), 4),
        (2, slice(5, 5)),
        (np.int64(2), slice(np.int32(1), np.int64(4))),
    ],
)
def test_read_matches_numpy(region):
    sim = Simulation()
    ref = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    buf = sim.allocate(MemorySpace.VMEM, 0, 0, name="x", value=ref)
    got = sim.read(buf, region, core=CORE)
    expected = ref[region if region is not None else ()]
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, expected)
    got[...] = -1  # a copy
    np.testing.assert_array_equal(sim.value(buf), ref)


def test_write_and_masked_write():
    sim = Simulation()
    buf = sim.allocate(MemorySpace.VMEM, 0, 0, name="x", value=np.zeros((4, 6), np.int32))
    sim.write(buf, (slice(0, 4, 2), slice(1, 4)), np.ones((2, 3), np.int32), core=CORE)
    mask = np.array([True, False, True])
    sim.write(buf, (3, slice(0, 3)), np.full(3, 7, np.int32), mask=mask, core=CORE)
    sim.write(buf, (1, 5), 9, core=CORE)
    expected = np.zeros((4, 6), np.int32)
    expected[0:4:2, 1:4] = 1
    expected[3, [0, 2]] = 7
    expected[1, 5] = 9
    np.testing.assert_array_equal(sim.value(buf), expected)


def test_swap_returns_old_and_respects_mask():
    sim = Simulation()
    buf = sim.allocate(MemorySpace.SMEM, 0, 0, name="s", value=np.arange(5, dtype=np.float32))
    old = sim.swap(buf, (slice(1, 4),), np.array([10, 20, 30], np.float32),
                   mask=np.array([True, False, True]), core=CORE)
    np.testing.assert_array_equal(old, [1, 2, 3])
    np.testing.assert_array_equal(sim.value(buf), [0, 10, 2, 30, 4])
    old = sim.swap(buf, (0,), np.float32(-1), core=CORE)
    assert old.shape == () and old == 0
    assert sim.value(buf)[0] == -1


def test_out_of_bounds_read_raises_with_names():
    sim = Simulation()
    buf = sim.allocate(MemorySpace.VMEM, 0, 1 - 1, name="x_block", shape=(8, 128), dtype=np.float32)
    with pytest.raises(OutOfBoundsError) as info:
        sim.read(buf, (slice(4, 12),), core=(0, 0), site="kernel.py:41")
    text = str(info.value)
    for part in ("'x_block'", "VMEM, device 0 core 0", "[4:12]", "(8, 128)", "device 0 core 0",
                 "kernel.py:41", "out_of_bounds='uninitialized'"):
        assert part in text
    with pytest.raises(OutOfBoundsError, match="read"):
        sim.read(buf, (-1,), core=(0, 0))
    assert issubclass(OutOfBoundsError, SimulationError)


def test_out_of_bounds_read_uninitialized_policy():
    sim = Simulation(out_of_bounds="uninitialized")
    buf = sim.allocate(MemorySpace.VMEM, 0, 0, name="x", value=np.arange(6, dtype=np.float32))
    got = sim.read(buf, (slice(4, 9),), core=CORE)
    np.testing.assert_array_equal(got, [4, 5, np.nan, np.nan, np.nan])
    got = sim.read(buf, (slice(-2, 3),), core=CORE)
    np.testing.assert_array_equal(got, [np.nan, np.nan, 0, 1, 2])
    got = sim.read(buf, (slice(8, 2, -2),), core=CORE)
    np.testing.assert_array_equal(got, [np.nan, np.nan, 4])
    np.testing.assert_array_equal(sim.read(buf, (10,), core=CORE), np.float32(np.nan))
    ints = sim.allocate(MemorySpace.VMEM, 0, 0, name="i", value=np.arange(3, dtype=np.int16))
    np.testing.assert_array_equal(sim.read(ints, (slice(1, 5),), core=CORE), [1, 2, 32767, 32767])


def test_out_of_bounds_write_always_raises():
    for policy in ("raise", "uninitialized"):
        sim = Simulation(out_of_bounds=policy)
        buf = sim.allocate(MemorySpace.HBM, 1 - 1, 0, name="o", value=np.zeros(4, np.float32))
        with pytest.raises(OutOfBoundsError, match="'o' \\(HBM, device 0\\)"):
            sim.write(buf, (slice(2, 6),), np.ones(4, np.float32), core=CORE, site="k.py:3")
        np.testing.assert_array_equal(sim.value(buf), np.zeros(4))  # nothing written


def test_masked_write_out_of_bounds_only_if_mask_true_there():
    sim = Simulation()
    buf = sim.allocate(MemorySpace.VMEM, 0, 0, name="x", value=np.zeros(4, np.float32))
    sim.write(buf, (slice(2, 6),), np.ones(4, np.float32),
              mask=np.array([True, True, False, False]), core=CORE)
    np.testing.assert_array_equal(sim.value(buf), [0, 0, 1, 1])
    with pytest.raises(OutOfBoundsError, match="masked write"):
        sim.write(buf, (slice(2, 6),), np.ones(4, np.float32),
                  mask=np.array([True, True, False, True]), core=CORE)
    with pytest.raises(OutOfBoundsError, match="swap"):
        sim.swap(buf, (slice(2, 6),), np.ones(4, np.float32), core=CORE)


def test_masked_read_out_of_bounds_only_if_mask_true_there():
    sim = Simulation()
    buf = sim.allocate(MemorySpace.VMEM, 0, 0, name="x", value=np.arange(4, dtype=np.float32))
    got = sim.read(buf, (slice(2, 6),), mask=np.array([True, True, False, False]), core=CORE)
    np.testing.assert_array_equal(got[:2], [2, 3])  # the rest is the fill
    assert np.isnan(got[2:]).all()
    with pytest.raises(OutOfBoundsError, match="masked read of 'x'"):
        sim.read(buf, (slice(2, 6),), mask=np.array([True, False, False, True]), core=CORE)
    with pytest.raises(OutOfBoundsError, match="Out-of-bounds read of 'x'"):
        sim.read(buf, (slice(2, 6),), core=CORE)


def test_padded_bounds_allow_padding_but_drop_writes():
    sim = Simulation(bounds="padded")
    buf = sim.allocate(MemorySpace.VMEM, 0, 0, name="x", value=np.ones((3, 5), np.float32))
    got = sim.read(buf, (slice(0, 4), slice(0, 128)), core=CORE)
    assert got.shape == (4, 128)
    np.testing.assert_array_equal(got[:3, :5], 1)
    assert np.isnan(got[3]).all() and np.isnan(got[:, 5:]).all()
    sim.write(buf, (slice(0, 4), slice(0, 8)), np.full((4, 8), 2, np.float32), core=CORE)
    np.testing.assert_array_equal(sim.value(buf), np.full((3, 5), 2, np.float32))
    with pytest.raises(OutOfBoundsError, match="padded to \\(4, 128\\)"):
        sim.read(buf, (slice(0, 5),), core=CORE)
    # SMEM is never padded.
    smem = sim.allocate(MemorySpace.SMEM, 0, 0, name="s", value=np.ones((3, 5), np.int32))
    with pytest.raises(OutOfBoundsError, match="'s' \\(SMEM"):
        sim.read(smem, (slice(0, 4),), core=CORE)
    # Logical bounds reject the padding.
    strict = Simulation()
    buf = strict.allocate(MemorySpace.VMEM, 0, 0, name="x", value=np.ones((3, 5), np.float32))
    with pytest.raises(OutOfBoundsError):
        strict.read(buf, (slice(0, 4),), core=CORE)


def test_hbm_is_shared_by_cores_and_vmem_is_not():
    sim = Simulation(num_devices=2, cores_per_device=2)
    hbm = sim.allocate(MemorySpace.HBM, 1, 1, name="h", value=np.zeros(2, np.float32))
    assert hbm.core == 0 and hbm.device == 1
    sim.write(hbm, (0,), 5, core=(1, 1))
    assert sim.read(hbm, (0,), core=(1, 0)) == 5
    a = sim.allocate(MemorySpace.VMEM, 0, 0, name="v", shape=(2,), dtype=np.float32)
    b = sim.allocate(MemorySpace.VMEM, 0, 1, name="v", shape=(2,), dtype=np.float32)
    assert a.key != b.key and b.core == 1


def test_refcounted_free():
    sim = Simulation()
    buf = sim.allocate(MemorySpace.HBM, 0, 0, name="h", shape=(2,), dtype=np.float32)
    sim.incref(buf)
    sim.free(buf)
    assert sim.is_allocated(buf)
    sim.read(buf, None, core=CORE)
    sim.free(buf)
    assert not sim.is_allocated(buf)
    with pytest.raises(SimulationError, match="'h' \\(HBM, device 0\\) was used after it was freed"):
        sim.read(buf, None, core=CORE)


def test_bad_arguments():
    sim = Simulation()
    with pytest.raises(ValueError, match="dma_execution_mode"):
        Simulation(dma_execution_mode="later")
    with pytest.raises(ValueError, match="shape and a dtype"):
        sim.allocate(MemorySpace.VMEM, 0, 0, name="x")
    with pytest.raises(SimulationError, match="device 3 core 0 does not exist"):
        sim.allocate(MemorySpace.VMEM, 3, 0, name="x", shape=(1,), dtype=np.float32)
    buf = sim.allocate(MemorySpace.VMEM, 0, 0, name="x", shape=(2, 2), dtype=np.float32)
    with pytest.raises(ValueError, match="rank-2"):
        sim.read(buf, (0, 0, 0), core=CORE)


_index = st.one_of(
    st.integers(-3, 9),
    st.builds(slice, st.none() | st.integers(-3, 9), st.none() | st.integers(-3, 9),
              st.none() | st.sampled_from([1, 2, 3, -1, -2])),
)


def _literal_indices(r, n):
    """Brute force: the literal indices a region entry selects."""
    if isinstance(r, slice):
        step = r.step or 1
        if step > 0:
            start = 0 if r.start is None else r.start
            stop = n if r.stop is None else r.stop
        else:
            start = n - 1 if r.start is None else r.start
            stop = -1 if r.stop is None else r.stop
        return list(range(start, stop, step)), False
    return [r], True


@settings(max_examples=300, deadline=None)
@given(region=st.tuples(_index, _index))
def test_uninitialized_reads_agree_with_brute_force(region):
    shape = (5, 7)
    ref = np.arange(35, dtype=np.float64).reshape(shape)
    sim = Simulation(out_of_bounds="uninitialized")
    buf = sim.allocate(MemorySpace.VMEM, 0, 0, name="x", value=ref)
    got = sim.read(buf, region, core=CORE)
    (rows, drop_r), (cols, drop_c) = (_literal_indices(r, n) for r, n in zip(region, shape))
    expected = np.full((len(rows), len(cols)), np.nan)
    for i, a in enumerate(rows):
        for j, b in enumerate(cols):
            if 0 <= a < 5 and 0 <= b < 7:
                expected[i, j] = ref[a, b]
    if drop_r:
        expected = expected[0]
    if drop_c:
        expected = expected[..., 0]
    np.testing.assert_array_equal(got, expected)
    strict = Simulation()
    buf = strict.allocate(MemorySpace.VMEM, 0, 0, name="x", value=ref)
    inside = all(0 <= a < 5 for a in rows) and all(0 <= b < 7 for b in cols)
    if inside:
        np.testing.assert_array_equal(strict.read(buf, region, core=CORE), expected)
    else:
        with pytest.raises(OutOfBoundsError):
            strict.read(buf, region, core=CORE)


@settings(max_examples=200, deadline=None)
@given(
    region=_index,
    mask_bits=st.lists(st.booleans(), min_size=12, max_size=12),
    bounds=st.sampled_from(["logical", "padded"]),
)
def test_masked_writes_agree_with_brute_force(region, mask_bits, bounds):
    n = 6
    sim = Simulation(bounds=bounds)
    buf = sim.allocate(MemorySpace.VMEM, 0, 0, name="x", value=np.zeros(n, np.float32))
    indices, dropped = _literal_indices(region, n)
    count = 1 if dropped else len(indices)
    shape = () if dropped else (count,)
    mask = np.array(mask_bits[:count], bool).reshape(shape)
    value = np.arange(1, count + 1, dtype=np.float32).reshape(shape)
    limit = 128 if bounds == "padded" else n
    written = [(i, v) for i, v, m in zip(indices, value.reshape(-1), mask.reshape(-1)) if m]
    if any(not 0 <= i < limit for i, _ in written):
        with pytest.raises(OutOfBoundsError):
            sim.write(buf, (region,), value, mask=mask, core=CORE)
        return
    sim.write(buf, (region,), value, mask=mask, core=CORE)
    expected = np.zeros(n, np.float32)
    for i, v in written:
        if i < n:  # writes into tile padding are dropped
            expected[i] = v
    np.testing.assert_array_equal(sim.value(buf), expected)


@pytest.mark.parametrize(
    ("shape", "dtype", "expected"),
    [
        # int4 packs 8 per 32-bit word (Mosaic counts its bits); (3, 128) -> an 8-row tile.
        ((3, 128), ml_dtypes.int4, (8, 128)),
        ((9, 128), ml_dtypes.int4, (16, 128)),
        ((5,), ml_dtypes.int4, (1024,)),
        # Mosaic's tiling inference packs uint4 by its itemsize (1 byte), like int8.
        ((3, 128), ml_dtypes.uint4, (4, 128)),
    ],
)
def test_padded_shape_of_4_bit_types(shape, dtype, expected):
    assert padded_shape(shape, dtype) == expected


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4, np.int8, np.uint16])
def test_uninitialized_integers_hold_their_maximum(dtype):
    assert int(uninitialized_value(dtype, "nan")) == int(ml_dtypes.iinfo(dtype).max)
    assert int(uninitialized_value(dtype, "zero")) == 0


def test_one_option_vocabulary_for_the_simulator_and_the_interpreter_params():
    from palladium.shared_memory import ConfigError, SimulationOptions
    from palladium.shared_memory.options import CHOICES

    assert CHOICES["bounds"] == ("logical", "padded")
    options = SimulationOptions(bounds="padded", uninitialized="zero", seed=3)
    sim = Simulation(options=options)
    assert (sim.bounds, sim.uninitialized, sim.seed, sim.options) == ("padded", "zero", 3, options)
    with pytest.raises(ConfigError, match="out_of_bounds must be one of"):
        Simulation(out_of_bounds="ignore")
