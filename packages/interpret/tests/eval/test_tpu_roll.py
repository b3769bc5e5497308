"""``pltpu.roll`` (the TPU's rotate, plain and strided) against numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams
from palladium.interpret.eval.rules_misc import tpu_roll


def _strided_reference(x, shift, axis, stride, stride_axis):
    # Brute force: slice i along stride_axis is rotated by shift + i * stride.
    out = np.empty_like(x)
    for i in range(x.shape[stride_axis]):
        index = [slice(None)] * x.ndim
        index[stride_axis] = slice(i, i + 1)
        out[tuple(index)] = np.roll(x[tuple(index)], shift + i * stride, axis)
    return out


@pytest.mark.parametrize("shift", [0, 1, 5, 127, 128, 300])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.int32, jnp.bfloat16])
def test_roll_in_a_kernel_matches_np_roll(shift, axis, dtype):
    x = (jnp.arange(8 * 128) % 251).astype(dtype).reshape(8, 128)

    def kernel(x_ref, o_ref):
        o_ref[...] = pltpu.roll(x_ref[...], shift, axis)

    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                         interpret=InterpretParams())(x)
    np.testing.assert_array_equal(np.asarray(out), np.roll(np.asarray(x), shift, axis))


@pytest.mark.parametrize("shift, stride, axis, stride_axis",
                         [(0, 1, 1, 0), (3, 2, 1, 0), (1, 1, 0, 1), (7, 5, 0, 1)])
def test_strided_roll_with_a_dynamic_shift_matches_the_brute_force_reference(
        shift, stride, axis, stride_axis):
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)

    def kernel(s_ref, x_ref, o_ref):
        o_ref[...] = pltpu.roll(x_ref[...], s_ref[0], axis, stride=stride,
                                stride_axis=stride_axis)

    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(x.shape, lambda: (0, 0))],
        interpret=InterpretParams())(jnp.array([shift], jnp.int32), x)
    np.testing.assert_array_equal(
        np.asarray(out), _strided_reference(np.asarray(x), shift, axis, stride, stride_axis))


def test_tpu_roll_on_three_dims_matches_the_brute_force_reference():
    x = np.arange(4 * 6 * 8).reshape(4, 6, 8)
    for shift, stride, axis, stride_axis in [(2, 3, 2, 0), (1, 4, 1, 2), (-3, 1, 0, 1)]:
        np.testing.assert_array_equal(tpu_roll(x, shift, axis, stride, stride_axis),
                                      _strided_reference(x, shift, axis, stride, stride_axis))
