"""0-d operands: a scalar output keeps its shape () (SMEM and VMEM)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams


@pytest.mark.parametrize("space", [pltpu.SMEM, pltpu.VMEM])
def test_scalar_outputs_of_an_unstacked_vector_have_shape_0d(space):
    x = np.array([1.5, -2.0], np.float32)

    def kernel(x_ref, a_ref, b_ref):
        a, b = jnp.unstack(x_ref[...], axis=0)
        a_ref[...] = a
        b_ref[...] = b

    a, b = pl.pallas_call(
        kernel, out_specs=(pl.BlockSpec(memory_space=space),) * 2,
        out_shape=(jax.ShapeDtypeStruct((), jnp.float32),) * 2,
        # Mosaic rejects rank-0 VMEM blocks: the TPU lowering check is off.
        interpret=InterpretParams(check_lowering=False))(x)
    assert a.shape == () and b.shape == ()
    np.testing.assert_array_equal(a, x[0])
    np.testing.assert_array_equal(b, x[1])
