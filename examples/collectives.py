"""Collectives written with remote DMAs, run on CPU devices by palladium.interpret.

Four Pallas TPU kernels that talk to the other devices of a 1-D mesh (axis "x"):

- ``right_permute``: every device sends its block to the next device on the ring;
- ``all_gather``: ring all-gather into HBM, one send/receive semaphore pair per step;
- ``all_reduce``: a barrier-semaphore handshake, then a ring through VMEM scratch;
- ``reduce_scatter``: device d receives chunk d of every device and sums them.

Each is a function ``kernel(x, *, n, interpret)`` of one device's shard, meant to run
under ``shard_map``; ``run`` does that over the first ``n`` devices. ``inputs`` and
``reference`` give each collective's input and its numpy result. The interpreter tests
(integration_tests/test_collectives.py) and the multi-device benchmark use these.

    python examples/collectives.py      runs them on 4 CPU devices, checked against numpy
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

MESH_ID = pl.DeviceIdType.MESH
LOGICAL = pl.DeviceIdType.LOGICAL
ANY = pl.BlockSpec(memory_space=pl.ANY)


def right_permute(x, *, n, interpret, id_style="tuple"):
    """Every device sends its block to the next device on the ring.

    ``id_style`` names the target as a mesh tuple ``(right,)``, a logical int, or a
    ``{"x": right}`` dict.
    """

    def kernel(x_ref, o_ref, send, recv):
        me = jax.lax.axis_index("x")
        right = jax.lax.rem(me + 1, n)
        device_id, id_type = {
            "tuple": ((right,), MESH_ID),
            "int": (right, LOGICAL),
            "dict": ({"x": right}, MESH_ID),
        }[id_style]
        copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=device_id,
                                            device_id_type=id_type)
        copy.start()
        copy.wait()

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), in_specs=[ANY],
        out_specs=ANY, scratch_shapes=[pltpu.SemaphoreType.DMA] * 2, interpret=interpret,
    )(x)


def all_gather(x, *, n, interpret):
    """Ring all-gather into HBM, one send/receive semaphore pair per step."""

    def kernel(x_ref, o_ref, local_sem, send_sems, recv_sems):
        me = jax.lax.axis_index("x")
        right = jax.lax.rem(me + 1, n)
        pltpu.make_async_copy(x_ref, o_ref.at[me], local_sem).start()
        pltpu.make_async_copy(x_ref, o_ref.at[me], local_sem).wait()
        for step in range(n - 1):
            slot = jax.lax.rem(me - step + n, n)
            copy = pltpu.make_async_remote_copy(
                o_ref.at[slot], o_ref.at[slot], send_sems.at[step], recv_sems.at[step],
                device_id=(right,), device_id_type=MESH_ID)
            copy.start()
            copy.wait()

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((n, *x.shape), x.dtype), in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA((n - 1,)),
                        pltpu.SemaphoreType.DMA((n - 1,))],
        interpret=interpret,
    )(x).reshape(n * x.shape[0], *x.shape[1:])


def all_reduce(x, *, n, interpret):
    """Barrier-semaphore handshake (collective_id), then a ring that forwards every
    device's block through VMEM scratch; each device sums what it saw."""

    def kernel(x_ref, o_ref, buf, send_sems, recv_sems):
        me = jax.lax.axis_index("x")
        right = jax.lax.rem(me + 1, n)
        left = jax.lax.rem(me - 1 + n, n)
        barrier = pltpu.get_barrier_semaphore()
        pl.semaphore_signal(barrier, 1, device_id=(left,), device_id_type=MESH_ID)
        pl.semaphore_signal(barrier, 1, device_id=(right,), device_id_type=MESH_ID)
        pl.semaphore_wait(barrier, 2)
        buf[me] = x_ref[...]
        for step in range(n - 1):
            slot = jax.lax.rem(me - step + n, n)
            copy = pltpu.make_async_remote_copy(
                buf.at[slot], buf.at[slot], send_sems.at[step], recv_sems.at[step],
                device_id=(right,), device_id_type=MESH_ID)
            copy.start()
            copy.wait()
        total = buf[0]
        for i in range(1, n):
            total = total + buf[i]
        o_ref[...] = total

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((n, *x.shape), x.dtype), pltpu.SemaphoreType.DMA((n - 1,)),
                        pltpu.SemaphoreType.DMA((n - 1,))],
        compiler_params=pltpu.CompilerParams(collective_id=0),
        interpret=interpret,
    )(x)


def reduce_scatter(x, *, n, interpret):
    """Device d receives chunk d of every device (one receive semaphore, N-1 waits) and
    sums the chunks; x is (n, rows, 128) per device."""

    def kernel(x_ref, o_ref, buf, send_sem, recv_sem):
        me = jax.lax.axis_index("x")
        buf[me] = x_ref[me]
        copies = []
        for k in range(1, n):
            target = jax.lax.rem(me + k, n)
            copy = pltpu.make_async_remote_copy(
                x_ref.at[target], buf.at[me], send_sem, recv_sem,
                device_id=(target,), device_id_type=MESH_ID)
            copy.start()
            copies.append(copy)
        for copy in copies:
            copy.wait_send()
        for copy in copies:
            copy.wait_recv()
        total = buf[0]
        for i in range(1, n):
            total = total + buf[i]
        o_ref[...] = total

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA,
                        pltpu.SemaphoreType.DMA],
        interpret=interpret,
    )(x)


COLLECTIVES = {
    "right_permute": right_permute,
    "all_gather": all_gather,
    "all_reduce": all_reduce,
    "reduce_scatter": reduce_scatter,
}


def mesh(n):
    """A 1-D mesh with axis "x" over the first ``n`` devices."""
    return jax.make_mesh((n,), ("x",), devices=jax.devices()[:n])


def sharded(x, on_mesh):
    """``x`` split along its first axis over the devices of ``on_mesh``."""
    return jax.device_put(x, NamedSharding(on_mesh, P("x")))


def run(kernel_fn, n, x, **shard_kwargs):
    """``kernel_fn(x_shard, n=n)`` under jit(shard_map) over the first ``n`` devices."""
    m = mesh(n)
    f = jax.jit(jax.shard_map(functools.partial(kernel_fn, n=n), mesh=m, in_specs=P("x"),
                              out_specs=P("x"), check_vma=False, **shard_kwargs))
    return np.asarray(f(sharded(x, m)))


def iota(shape):
    """0, 1, 2, ... as float32 in ``shape``."""
    return jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)


def inputs(name, n):
    """The global input of collective ``name`` on ``n`` devices (small exact floats)."""
    if name == "reduce_scatter":
        return iota((n * n, 8, 128)) % 97
    return iota((n * 8, 128)) % 251


def reference(name, x, n):
    """What collective ``name`` returns for global input ``x`` on ``n`` devices, by numpy."""
    blocks = np.asarray(x).reshape(n, -1, *x.shape[1:])
    if name == "right_permute":
        return np.concatenate([blocks[(d - 1) % n] for d in range(n)])
    if name == "all_gather":
        return np.concatenate([np.asarray(x)] * n)
    if name == "all_reduce":
        return np.concatenate([blocks.sum(0)] * n)
    # reduce_scatter: device d gets sum over devices e of x_e[d]
    per_device = np.asarray(x).reshape(n, n, *x.shape[1:])
    return per_device.sum(0).reshape(-1, *x.shape[2:])


def main(n=4):
    """Run every collective on ``n`` CPU devices with race detection; check against numpy."""
    import palladium.interpret as pi

    params = pi.InterpretParams(detect_races=True)
    for name, kernel in COLLECTIVES.items():
        x = inputs(name, n)
        out = run(functools.partial(kernel, interpret=params), n, x)
        np.testing.assert_array_equal(out, reference(name, x, n))
        print(f"{name} on {n} devices: matches numpy")


if __name__ == "__main__":
    # Before jax initialises its backends (it does so lazily, at the first device query).
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_force_host_platform_device_count=4").strip()
    main()
