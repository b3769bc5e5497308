"""A kernel whose outputs are all 0-size never runs: XLA drops the host callback of an
empty result, so neither the kernel body nor the grid_point_recorder is called (and no
error inside the kernel can surface). Documented in the package README."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from palladium.interpret import InterpretParams


@pytest.mark.parametrize("jit", [False, True])
def test_zero_size_output_kernel_never_runs(jit):
    points = []

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((0, 128), jnp.float32), grid=(2,),
        interpret=InterpretParams(check_lowering=False,
                                  grid_point_recorder=lambda point, core: points.append(point)))
    out = (jax.jit(call) if jit else call)(jnp.zeros((0, 128), jnp.float32))
    assert np.asarray(out).shape == (0, 128)
    assert points == []
