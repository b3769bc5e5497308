"""A DMA moves bytes: between refs of different dtypes it is a KernelError naming both refs
(Mosaic rejects it), never a value conversion; a bitcast view makes a byte copy explicit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams, KernelError, errors_as_raised

ANY = pl.BlockSpec(memory_space=pl.ANY)


def _copy_into(x, out_dtype):
    def kernel(x_ref, o_ref, sem):
        copy = pltpu.make_async_copy(x_ref, o_ref, sem)
        copy.start()
        copy.wait()

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, out_dtype), in_specs=[ANY],
        out_specs=ANY, scratch_shapes=[pltpu.SemaphoreType.DMA],
        interpret=InterpretParams(check_lowering=False))(x)


@pytest.mark.parametrize("out_dtype", [jnp.int32, jnp.int8, jnp.bfloat16])
def test_dma_between_dtypes_is_a_kernel_error(out_dtype):
    x = jnp.full((8, 128), -300.5, jnp.float32)
    with pytest.raises(KernelError) as info, errors_as_raised():
        _copy_into(x, out_dtype)
    text = str(info.value)
    assert "DMA from 'x_ref' (float32) to 'o_ref'" in text
    assert f"({np.dtype(out_dtype)})" in text
    assert "dtypes differ" in text and "bitcast" in text
    assert "test_dma_dtypes.py" in text


def test_dma_through_a_bitcast_view_copies_bytes():
    x = jnp.full((8, 128), -300.5, jnp.float32)

    def kernel(x_ref, o_ref, sem):
        copy = pltpu.make_async_copy(x_ref.bitcast(jnp.int32), o_ref, sem)
        copy.start()
        copy.wait()

    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.int32), in_specs=[ANY],
        out_specs=ANY, scratch_shapes=[pltpu.SemaphoreType.DMA],
        interpret=InterpretParams(check_lowering=False))(x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x).view(np.int32))


def test_same_dtype_dma_still_copies():
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    np.testing.assert_array_equal(np.asarray(_copy_into(x, jnp.float32)), np.asarray(x))

