"""DMAs of reshaped and bitcast refs (source and destination) and add=True DMAs, against
numpy references."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import DataRaceError, InterpretParams, errors_as_raised

ANY = pl.BlockSpec(memory_space=pl.ANY)
VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)
PARAMS = [InterpretParams(detect_races=True), InterpretParams(dma_execution_mode="eager")]


def _run(kernel, x, out, scratch, params, in_spec=ANY, out_spec=VMEM):
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(*out),
        in_specs=[in_spec],
        out_specs=out_spec,
        scratch_shapes=[*scratch, pltpu.SemaphoreType.DMA],
        interpret=params,
    )(x)


def _ours(kernel, x, out, scratch, **kw):
    """palladium's result, the same under each of PARAMS. (jax 0.10.2's own interpreter
    fails on DMAs of reshaped or bitcast refs: 'ReshapeTransform' object has no
    attribute 'indices'; so these compare with numpy only.)"""
    ours = [np.asarray(_run(kernel, x, out, scratch, p, **kw)) for p in PARAMS]
    for o in ours[1:]:
        np.testing.assert_array_equal(o, ours[0])
    return ours[0]


X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)


def test_dma_from_a_reshaped_source():
    def kernel(x_hbm, o_ref, buf, sem):
        pltpu.make_async_copy(x_hbm.at[pl.ds(2, 4)].reshape(2, 256), buf, sem).start()
        pltpu.make_async_copy(x_hbm.at[pl.ds(2, 4)].reshape(2, 256), buf, sem).wait()
        o_ref[...] = buf[...] * 2

    ours = _ours(kernel, X, ((2, 256), jnp.float32), [pltpu.VMEM((2, 256), jnp.float32)])
    np.testing.assert_array_equal(ours, np.asarray(X[2:6]).reshape(2, 256) * 2)


def test_dma_into_a_reshaped_destination():
    def kernel(x_hbm, o_hbm, buf, sem):
        buf[...] = jnp.zeros((8, 128), jnp.float32) - 1
        copy_in = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 2)], buf.at[pl.ds(4, 4)].reshape(2, 256), sem)
        copy_in.start()
        copy_in.wait()
        pltpu.sync_copy(buf, o_hbm)

    x = jnp.arange(2 * 256, dtype=jnp.float32).reshape(2, 256) + 5
    ours = _ours(kernel, jnp.concatenate([x, x]), ((8, 128), jnp.float32),
                         [pltpu.VMEM((8, 128), jnp.float32)], out_spec=ANY)
    expected = np.full((8, 128), -1.0, np.float32)
    expected[4:] = np.asarray(x).reshape(4, 128)
    np.testing.assert_array_equal(ours, expected)


def test_dma_from_a_bitcast_source_and_into_a_bitcast_destination():
    bits = jnp.arange(16 * 128, dtype=jnp.uint32).reshape(16, 128) * jnp.uint32(2654435761)

    def kernel(x_hbm, o_hbm, buf, sem):
        pltpu.sync_copy(x_hbm.bitcast(jnp.float32), buf)       # same width
        buf[...] = buf[...]
        c = pltpu.make_async_copy(buf, o_hbm.bitcast(jnp.float32), sem)
        c.start()
        c.wait()

    ours = _ours(kernel, bits, ((16, 128), jnp.uint32),
                         [pltpu.VMEM((16, 128), jnp.float32)], out_spec=ANY)
    np.testing.assert_array_equal(ours, np.asarray(bits))


def test_dma_through_a_width_changing_bitcast():
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128).astype(jnp.bfloat16)

    def kernel(x_hbm, o_ref, buf, sem):
        c = pltpu.make_async_copy(x_hbm.bitcast(jnp.uint32), buf, sem)
        c.start()
        c.wait()
        o_ref[...] = buf[...]

    ours = _ours(kernel, x, ((8, 128), jnp.uint32), [pltpu.VMEM((8, 128), jnp.uint32)])
    halves = np.asarray(x).view(np.uint16).astype(np.uint32)
    np.testing.assert_array_equal(ours, halves[0::2] | (halves[1::2] << 16))


def _halves_kernel(second_start):
    """Two DMAs in flight at once into rows [0:4] and [second_start:second_start+4] of a
    (8, 128) view of a (4, 256) buffer, then one wait for both."""

    def kernel(x_hbm, o_ref, sem):
        view = o_ref.reshape(8, 128)
        a = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 4)], view.at[pl.ds(0, 4)], sem)
        b = pltpu.make_async_copy(x_hbm.at[pl.ds(4, 4)], view.at[pl.ds(second_start, 4)], sem)
        a.start()
        b.start()
        a.wait()
        b.wait()

    return kernel


def test_dma_into_part_of_a_reshaped_destination_touches_only_that_part():
    out = pl.pallas_call(
        _halves_kernel(4),
        out_shape=jax.ShapeDtypeStruct((4, 256), jnp.float32),
        in_specs=[ANY],
        scratch_shapes=[pltpu.SemaphoreType.DMA],
        interpret=InterpretParams(detect_races=True, dma_order="random"),
    )(X)
    np.testing.assert_array_equal(out, np.asarray(X).reshape(4, 256))


def test_overlapping_dmas_into_a_reshaped_destination_race():
    with pytest.raises(DataRaceError) as info, errors_as_raised():
        pl.pallas_call(
            _halves_kernel(2),
            out_shape=jax.ShapeDtypeStruct((4, 256), jnp.float32),
            in_specs=[ANY],
            scratch_shapes=[pltpu.SemaphoreType.DMA],
            interpret=InterpretParams(detect_races=True),
        )(X)
    msg = str(info.value)
    assert "'x_hbm->o_ref'" in msg and "element (1, 0)" in msg, msg


@pytest.mark.parametrize("params", PARAMS, ids=["on_wait", "eager"])
def test_add_dma_accumulates_into_the_destination(params):
    # numpy reference only: jax 0.10.2's interpreter ignores add=True (it overwrites).
    def kernel(x_hbm, o_hbm, buf, sem):
        buf[...] = jnp.full((8, 128), 100.0, jnp.float32)
        pltpu.async_copy(x_hbm, buf, sem, add=True).wait()          # buf = 100 + x
        pltpu.async_copy(x_hbm.at[pl.ds(0, 4)], buf.at[pl.ds(4, 4)], sem, add=True).wait()
        pltpu.async_copy(buf, o_hbm, sem).wait()
        pltpu.async_copy(x_hbm, o_hbm, sem, add=True).wait()        # HBM destination too

    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        # jax 0.10.2's Mosaic lowering has no add=True DMAs: the lowering check is off.
        interpret=dataclasses.replace(params, check_lowering=False),
    )(X)
    x = np.asarray(X)
    expected = 100 + x + x
    expected[4:] += x[:4]
    np.testing.assert_array_equal(out, expected)
