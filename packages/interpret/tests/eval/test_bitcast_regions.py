"""An access through a same-width ``ref.bitcast()`` covers only the elements its later
indexers select: no false race with a DMA into another part of the buffer, and the real
race on the same part is still found."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import DataRaceError, InterpretParams, errors_as_raised

X = jnp.arange(2 * 8 * 128, dtype=jnp.float32).reshape(2, 8, 128) / 3


def _call(read_half, mode="on_wait"):
    def kernel(x_hbm, o_ref, buf, sem):   # buf: VMEM (2, 2, 8, 128) float32
        buf[...] = jnp.zeros(buf.shape, jnp.float32) + 5.0
        cp = pltpu.make_async_copy(x_hbm, buf.at[1], sem)
        cp.start()
        o_ref[...] = pltpu.bitcast(buf.bitcast(jnp.uint32).at[read_half][...], jnp.float32)
        cp.wait()

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((2, 2, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        interpret=InterpretParams(detect_races=True, dma_execution_mode=mode))


@pytest.mark.parametrize("mode", ["on_wait", "eager"])
def test_read_of_another_half_through_a_bitcast_does_not_race_with_the_dma(mode):
    out = _call(0, mode)(X)
    np.testing.assert_array_equal(out, np.full(X.shape, 5.0, np.float32))


def test_read_of_the_dma_destination_through_a_bitcast_still_races():
    with pytest.raises(DataRaceError) as info, errors_as_raised():
        _call(1)(X)
    assert "data race on 'buf" in str(info.value) and "element (1, 0, 0, 0)" in str(info.value)


def test_write_and_read_through_a_same_width_bitcast_index_the_right_elements():
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)
        bits = o_ref.bitcast(jnp.int32)
        bits.at[1][...] = pltpu.bitcast(x_ref[0], jnp.int32)
        o_ref[0] = pltpu.bitcast(bits.at[1][...] , jnp.float32) * 2

    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
                         interpret=InterpretParams(detect_races=True))(X)
    np.testing.assert_array_equal(out, np.stack([np.asarray(X[0]) * 2, np.asarray(X[0])]))
