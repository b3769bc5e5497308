"""``pltpu.get_barrier_semaphore()`` needs the kernel's ``collective_id`` (Mosaic allocates
the barrier per collective id; it and jax's TPU interpreter reject a kernel without one)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _multi_device_harness import run_on_devices
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams, KernelError, errors_as_raised

MESH_ID = pl.DeviceIdType.MESH


def _handshake(x, *, n, compiler_params):
    def kernel(x_ref, o_ref):
        me = jax.lax.axis_index("x")
        barrier = pltpu.get_barrier_semaphore()
        pl.semaphore_signal(barrier, 1, device_id=(jax.lax.rem(me + 1, n),),
                            device_id_type=MESH_ID)
        pl.semaphore_wait(barrier, 1)
        o_ref[...] = x_ref[...] + 1

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          compiler_params=compiler_params, interpret=InterpretParams())(x)


def _run(compiler_params):
    x = jnp.arange(2 * 8 * 128, dtype=jnp.float32).reshape(16, 128)
    return x, run_on_devices(
        functools.partial(_handshake, compiler_params=compiler_params), 2, x)


@pytest.mark.timeout(120)
def test_barrier_semaphore_without_collective_id_raises():
    with pytest.raises(KernelError, match=r"get_barrier_semaphore\(\) in a kernel without a "
                                          r"collective_id.*CompilerParams\(collective_id="
                                          r".*test_barrier_semaphore.py"), errors_as_raised():
        _run(None)


@pytest.mark.timeout(120)
def test_barrier_semaphore_with_collective_id_synchronises():
    x, out = _run(pltpu.CompilerParams(collective_id=0))
    np.testing.assert_array_equal(out, np.asarray(x) + 1)
