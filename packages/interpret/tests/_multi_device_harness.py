"""Shared helpers of palladium.interpret's multi-device tests: a kernel function under
``jit(shard_map)`` over the first ``n`` CPU devices (the tests' conftest asks for 8), and
the remote copy over a 2x2 mesh that the ``device_id`` tests send with.

The kernels stay in the tests: their names (and source lines) are what the messages
under test must name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

ANY = pl.BlockSpec(memory_space=pl.ANY)


def mesh(n: int) -> jax.sharding.Mesh:
    """A one-axis mesh (``"x"``) over the first ``n`` devices."""
    return jax.make_mesh((n,), ("x",), devices=jax.devices()[:n])


def sharded(x: Any, on: jax.sharding.Mesh) -> jax.Array:
    """``x`` split along its first axis over the mesh ``on``."""
    return jax.device_put(x, NamedSharding(on, P("x")))


def on_devices(fn: Callable[..., Any], n: int, **shard_kwargs: Any) -> Callable[..., Any]:
    """``fn`` (of one shard) under ``jit(shard_map)`` over ``mesh(n)``, split along "x"."""
    return jax.jit(jax.shard_map(fn, mesh=mesh(n), in_specs=P("x"), out_specs=P("x"),
                                 check_vma=False, **shard_kwargs))


def run_on_devices(kernel_fn: Callable[..., Any], n: int, x: Any, **shard_kwargs: Any) -> np.ndarray:
    """``kernel_fn(x_shard, n=n)`` over the first ``n`` devices, on ``x`` split along its
    first axis; the result as numpy."""
    f = on_devices(functools.partial(kernel_fn, n=n), n, **shard_kwargs)
    return np.asarray(f(sharded(x, mesh(n))))


def remote_copy_on_2x2(device_id: Any, device_id_type: Any, interpret: Any) -> tuple[jax.Array, np.ndarray]:
    """Every device of a 2x2 mesh ("a", "b") copies its (8, 128) block of a (16, 256)
    iota to ``device_id`` (a value, or a function of no arguments called in the kernel);
    the input and the output."""
    grid = jax.make_mesh((2, 2), ("a", "b"), devices=jax.devices()[:4])

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
            interpret=interpret)(x)

    x = jnp.arange(16 * 256, dtype=jnp.float32).reshape(16, 256)
    g = jax.jit(jax.shard_map(f, mesh=grid, in_specs=P("a", "b"), out_specs=P("a", "b"),
                              check_vma=False))
    return x, np.asarray(g(jax.device_put(x, NamedSharding(grid, P("a", "b")))))
