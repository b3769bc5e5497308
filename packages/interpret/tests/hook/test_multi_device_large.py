"""Multi-device launches with operands of ordinary size (2 MiB+ per device).

jax's ``pure_callback`` copies every operand onto CPU device 0 before calling Python; a
copy above ~100 KiB runs on XLA's CPU thread pool, which the devices' callbacks occupy
while they wait for each other in the rendezvous, so a launch on 8 devices with 256 KiB
per device deadlocked. The launch's host callback now takes its operands as XLA hands
them over (``palladium.interpret.hook.host_call``). Each kernel here is checked against numpy
on 2, 4 and 8 devices, called eagerly, under ``jax.jit`` and under ``jax.set_mesh``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from palladium.interpret import InterpretParams
from palladium.interpret.hook.jax_hook import in_flight_rendezvous

ROWS, COLS = 2048, 256  # 2 MiB of float32 per device
# Short enough that a launch whose devices cannot meet fails inside the test's timeout,
# long enough for a loaded machine: in the full suite on 2 cores the 8-device eager call
# took 23.5 s (its devices waited for one that was still preparing the kernel), past
# the 20 s this was before.
PARAMS = InterpretParams(rendezvous_timeout=100.0)
ANY = pl.BlockSpec(memory_space=pl.ANY)


def _double_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def _ring_kernel(x_ref, o_ref, send, recv, *, n):
    """Send the whole (HBM) shard to the right neighbour's output."""
    me = jax.lax.axis_index("x")
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv,
                                        device_id=((me + 1) % n,),
                                        device_id_type=pl.DeviceIdType.MESH)
    copy.start()
    copy.wait()


def _double(x, n):
    del n
    return pl.pallas_call(_double_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=PARAMS)(x)


def _ring(x, n):
    return pl.pallas_call(
        functools.partial(_ring_kernel, n=n), out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[ANY], out_specs=ANY, scratch_shapes=[pltpu.SemaphoreType.DMA] * 2,
        interpret=PARAMS)(x)


def _expected_double(x, n):
    del n
    return x * 2


def _expected_ring(x, n):
    return np.roll(x.reshape(n, ROWS, COLS), 1, axis=0).reshape(x.shape)


KERNELS = {"double": (_double, _expected_double), "ring": (_ring, _expected_ring)}


def _call(kernel, n, mode):
    mesh = jax.make_mesh((n,), ("x",), devices=jax.devices()[:n])
    x = np.random.default_rng(n).standard_normal((n * ROWS, COLS), dtype=np.float32)
    body = jax.shard_map(functools.partial(kernel, n=n), mesh=mesh, in_specs=P("x"),
                         out_specs=P("x"), check_vma=False)
    xs = jax.device_put(jnp.asarray(x), NamedSharding(mesh, P("x")))
    if mode == "eager":
        out = body(xs)
    elif mode == "jit":
        out = jax.jit(body)(xs)
    else:
        with jax.set_mesh(mesh):
            out = jax.jit(body)(xs)
    return x, np.asarray(out)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["eager", "jit", "set_mesh"])
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_two_mib_per_device(name, n, mode):
    kernel, expected = KERNELS[name]
    x, out = _call(kernel, n, mode)
    np.testing.assert_array_equal(out, expected(x, n))
    assert in_flight_rendezvous() == 0
