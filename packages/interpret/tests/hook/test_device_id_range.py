"""Every form of a remote ``device_id`` is range-checked per mesh axis: an out-of-range
minor coordinate must not silently name another device (row-major ids)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from palladium.interpret import InterpretParams, KernelError, errors_as_raised

ANY = pl.BlockSpec(memory_space=pl.ANY)


def _send_to(device_id, device_id_type):
    mesh = jax.make_mesh((2, 2), ("a", "b"), devices=jax.devices()[:4])

    def kernel(x_ref, o_ref, send, recv):
        target = device_id() if callable(device_id) else device_id
        copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=target,
                                            device_id_type=device_id_type)
        copy.start()
        copy.wait()

    def f(x):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), in_specs=[ANY],
            out_specs=ANY, scratch_shapes=[pltpu.SemaphoreType.DMA] * 2,
            interpret=InterpretParams(check_lowering=False))(x)

    x = jnp.arange(16 * 256, dtype=jnp.float32).reshape(16, 256)
    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("a", "b"), out_specs=P("a", "b"),
                              check_vma=False))
    return x, np.asarray(g(jax.device_put(x, NamedSharding(mesh, P("a", "b")))))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("device_id", [{"b": 2}, {"a": 2}, {"a": -1}, {"a": 0, "b": 5}])
def test_dict_device_id_out_of_range_on_any_axis_raises(device_id):
    axis, value = [(k, v) for k, v in device_id.items() if not 0 <= v < 2][0]
    with pytest.raises(KernelError, match=rf"coordinate {value} is outside mesh axis "
                                          rf"'{axis}' of size 2"), errors_as_raised():
        _send_to(device_id, pl.DeviceIdType.MESH)


@pytest.mark.timeout(120)
def test_tuple_device_id_out_of_range_raises():
    with pytest.raises(KernelError, match=r"coordinate 2 is outside mesh axis 'b' of size 2"), \
            errors_as_raised():
        _send_to((0, 2), pl.DeviceIdType.MESH)


@pytest.mark.timeout(120)
def test_in_range_dict_device_id_sends_along_the_named_axis():
    x, out = _send_to(lambda: {"b": 1 - jax.lax.axis_index("b")}, pl.DeviceIdType.MESH)
    blocks = np.asarray(x).reshape(2, 8, 2, 128)
    np.testing.assert_array_equal(np.asarray(out).reshape(2, 8, 2, 128), blocks[:, :, ::-1])
