"""buffer_bounds="padded" and the simulated chip: reads into TPU tile padding are allowed
(uninitialised values) with "padded" and rejected with "logical"; the padding comes from
InterpretParams.chip, else the TPU of the abstract mesh's abstract device."""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

from palladium.interpret import InterpretParams, OutOfBoundsError, errors_as_raised

X = jnp.arange(100 * 128, dtype=jnp.float32).reshape(100, 128)


def _ragged_last_block(params):
    """Copies rows start:start+8 of x (an HBM operand) as a pipeline would copy the ragged
    last block of a (100, 128) array rounded up to the (8, 128) tile: rows 96:104."""

    def ragged_kernel(s_ref, x_hbm, o_ref, buf):
        pltpu.sync_copy(x_hbm.at[pl.ds(s_ref[0], 8)], buf)
        o_ref[...] = buf[...]

    return pl.pallas_call(
        ragged_kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
        interpret=params,
    )


def test_ragged_block_read_is_out_of_bounds_with_logical_bounds():
    with pytest.raises(OutOfBoundsError) as info, errors_as_raised():
        _ragged_last_block(InterpretParams())(jnp.array([96], jnp.int32), X)
    msg = str(info.value)
    for part in ("'x_hbm'", "[96:104, 0:128]", "(100, 128)", "kernel 'ragged_kernel'",
                 "grid point ()", "core 0", "test_bounds.py:"):
        assert part in msg, (part, msg)


def test_ragged_block_read_into_padding_is_uninitialised_with_padded_bounds():
    out = np.asarray(
        _ragged_last_block(InterpretParams(buffer_bounds="padded"))(jnp.array([96], jnp.int32), X)
    )
    np.testing.assert_array_equal(out[:4], X[96:])
    assert np.isnan(out[4:]).all()
    zero = InterpretParams(buffer_bounds="padded", uninitialized_memory="zero")
    out = _ragged_last_block(zero)(jnp.array([96], jnp.int32), X)
    np.testing.assert_array_equal(out, np.concatenate([X[96:], np.zeros((4, 128))]))


def test_reads_beyond_the_padding_still_fail_with_padded_bounds():
    with pytest.raises(OutOfBoundsError, match=r"padded to \(104, 128\)"), errors_as_raised():
        _ragged_last_block(InterpretParams(buffer_bounds="padded"))(jnp.array([100], jnp.int32), X)


def test_writes_into_padding_are_dropped_with_padded_bounds():
    def ragged_store(s_ref, x_ref, o_hbm, buf):
        buf[...] = x_ref[...] * 2
        pltpu.sync_copy(buf, o_hbm.at[pl.ds(s_ref[0], 8)])

    def call(params):
        return pl.pallas_call(
            ragged_store,
            out_shape=jax.ShapeDtypeStruct((6, 128), jnp.float32),  # padded to (8, 128)
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec((8, 128), lambda: (0, 0))],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
            interpret=params,
        )(jnp.array([0], jnp.int32), X[:8])

    np.testing.assert_array_equal(call(InterpretParams(buffer_bounds="padded")), X[:6] * 2)
    with pytest.raises(OutOfBoundsError, match="o_hbm"), errors_as_raised():
        call(InterpretParams())


# A (1, 128) float32 array pads to (1, 128) on TPU v4 and newer but to (2, 128) on v2/v3
# (Mosaic's tiling factor starts at 2 there), so reading 2 rows tells the chips apart.
def _two_rows_of_one(params):
    def two_rows(s_ref, x_hbm, o_ref):
        pltpu.sync_copy(x_hbm.at[pl.ds(s_ref[0], 2)], o_ref)

    return pl.pallas_call(
        two_rows,
        out_shape=jax.ShapeDtypeStruct((2, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        interpret=params,
    )(jnp.array([0], jnp.int32), jnp.ones((1, 128), jnp.float32))


def _tpu_mesh(kind):
    platform = {"platform": "tpu"} if "platform" in inspect.signature(AbstractDevice).parameters else {}
    device = AbstractDevice(device_kind=kind, num_cores=1, **platform)
    return use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=device))


def _pads_two_rows(params, mesh_kind=None) -> bool:
    try:
        with errors_as_raised():
            if mesh_kind is None:
                out = _two_rows_of_one(params)
            else:
                with _tpu_mesh(mesh_kind):
                    out = _two_rows_of_one(params)
    except OutOfBoundsError as e:
        assert "'x_hbm'" in str(e) and "kernel 'two_rows'" in str(e)
        return False
    out = np.asarray(out)
    np.testing.assert_array_equal(out[0], 1.0)
    assert np.isnan(out[1]).all()
    return True


def test_chip_field_decides_the_padding():
    assert _pads_two_rows(InterpretParams(buffer_bounds="padded", chip="v3"))
    assert _pads_two_rows(InterpretParams(buffer_bounds="padded", chip="v2"))
    assert not _pads_two_rows(InterpretParams(buffer_bounds="padded", chip="v5e"))
    assert not _pads_two_rows(InterpretParams(buffer_bounds="padded"))  # default: v5e
    assert not _pads_two_rows(InterpretParams(chip="v3"))  # logical bounds ignore chips


def test_padding_follows_the_abstract_mesh_device_unless_a_chip_is_named():
    assert _pads_two_rows(InterpretParams(buffer_bounds="padded"), "TPU v3")
    assert not _pads_two_rows(InterpretParams(buffer_bounds="padded"), "TPU v5 lite")
    assert not _pads_two_rows(InterpretParams(buffer_bounds="padded", chip="v6e"), "TPU v3")


@pytest.mark.skipif(
    "buffer_bounds" not in {f.name for f in dataclasses.fields(pltpu.InterpretParams)},
    reason="this jax's own interpreter has no buffer_bounds to compare with",
)
def test_ragged_block_with_padded_bounds_matches_jax_interpreter():
    start = jnp.array([96], jnp.int32)
    ours = _ragged_last_block(InterpretParams(buffer_bounds="padded"))(start, X)
    with _tpu_mesh("TPU v5 lite"):
        theirs = _ragged_last_block(pltpu.InterpretParams(buffer_bounds="padded"))(start, X)
    np.testing.assert_array_equal(ours, theirs)  # NaN where both read padding


def _masked_tail_load(rows_valid, *, reshape=False, detect_races=False):
    """Loads rows 12:20 of a (16, 128) VMEM block with a mask that keeps ``rows_valid``
    rows: rows past 16 are out of bounds but masked off when rows_valid <= 4."""

    def masked_tail_kernel(x_ref, o_ref):
        start = pl.program_id(0) + 12
        mask = jax.lax.broadcasted_iota(jnp.int32, (8, 128), 0) < rows_valid
        view = x_ref.at[pl.ds(start, 8)]
        if reshape:
            flat_mask = mask.reshape(8 * 128 // 256, 256)
            v = pltpu.load(view.reshape(8 * 128 // 256, 256), mask=flat_mask).reshape(8, 128)
        else:
            v = pltpu.load(view, mask=mask)
        o_ref[...] = jnp.where(mask, v, -1.0)

    return pl.pallas_call(
        masked_tail_kernel,
        grid=(1,),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        # jax 0.10.2's Mosaic lowering has no masked loads: the TPU lowering check is off.
        interpret=InterpretParams(detect_races=detect_races, check_lowering=False),
    )


@pytest.mark.parametrize("reshape", [False, True])
def test_masked_load_may_reach_out_of_bounds_where_the_mask_is_false(reshape):
    x = X[:16]
    out = _masked_tail_load(4, reshape=reshape, detect_races=True)(x)
    expected = np.full((8, 128), -1.0, np.float32)
    expected[:4] = np.asarray(x[12:16])
    np.testing.assert_array_equal(out, expected)


def test_masked_load_raises_when_a_true_element_is_out_of_bounds():
    with pytest.raises(OutOfBoundsError) as info, errors_as_raised():
        _masked_tail_load(5)(X[:16])
    msg = str(info.value)
    for part in ("masked read", "'x_ref'", "[12:20, 0:128]", "(16, 128)", "test_bounds.py:"):
        assert part in msg, (part, msg)


@pytest.mark.parametrize("dtype", [jnp.int4, jnp.uint4, jnp.int8, jnp.float32])
def test_masked_off_elements_read_the_uninitialised_fill_of_every_dtype(dtype):
    # One fill function for the interpreter and the simulator: int4/uint4 hold their max.
    def masked_kernel(x_ref, o_ref):
        mask = jax.lax.broadcasted_iota(jnp.int32, (8, 128), 0) < 3
        o_ref[...] = pltpu.load(x_ref, mask=mask)

    x = (jnp.arange(8 * 128) % 5).astype(dtype).reshape(8, 128)
    # jax 0.10.2's Mosaic lowering has no masked loads: the TPU lowering check is off.
    out = pl.pallas_call(masked_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), dtype),
                         interpret=InterpretParams(check_lowering=False))(x)
    got = np.asarray(out).astype(np.float64)
    np.testing.assert_array_equal(got[:3], np.asarray(x[:3]).astype(np.float64))
    fill = np.nan if dtype == jnp.float32 else float(jnp.iinfo(dtype).max)
    np.testing.assert_array_equal(got[3:], np.full((5, 128), fill))


def test_chip_facts_come_from_jax_and_name_every_chip():
    from palladium.interpret import CHIPS, ChipFacts, ConfigError, chip_facts

    assert CHIPS == ("v2", "v3", "v4", "v4i", "v5e", "v5p", "v6e", "v7", "v7x", "v8i")
    v5e = chip_facts("v5e")
    assert isinstance(v5e, ChipFacts) and v5e.generation == 5
    assert (v5e.vmem_capacity_bytes, v5e.smem_capacity_bytes) == (128 * 2**20, 2**20)
    assert v5e.default_scoped_vmem_limit_bytes == 16 * 2**20
    with pytest.raises(dataclasses.FrozenInstanceError):
        v5e.generation = 6  # type: ignore[misc]
    with pytest.raises(ConfigError, match="v9"):
        chip_facts("v9")
