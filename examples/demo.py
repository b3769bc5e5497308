"""palladium demo: run TPU kernels on this CPU, then catch a data race and a deadlock.

    nox -s demo        (or: python examples/demo.py)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi


def matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += x_ref[...] @ y_ref[...]

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul(x, y, params, block=128):
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // block, n // block, k // block),
        in_specs=[
            pl.BlockSpec((block, block), lambda i, j, k: (i, k)),
            pl.BlockSpec((block, block), lambda i, j, k: (k, j)),
        ],
        out_specs=pl.BlockSpec((block, block), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((block, block), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")
        ),
        interpret=params,
    )(x, y)


def racy_kernel(x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    o_ref[...] = buf[...] * 2.0  # BUG: reads the DMA's destination before waiting for it
    copy.wait()


def deadlocking_kernel(x_ref, o_ref, sem):
    pl.semaphore_wait(sem, 1)  # BUG: nobody ever signals `sem`
    o_ref[...] = x_ref[...]


def main() -> None:
    x = jax.random.normal(jax.random.key(0), (256, 384), jnp.float32)
    y = jax.random.normal(jax.random.key(1), (384, 256), jnp.float32)
    params = pi.InterpretParams(detect_races=True, num_cores_or_threads=2)
    out = jax.jit(lambda a, b: matmul(a, b, params))(x, y)
    err = float(jnp.max(jnp.abs(out - x @ y)))
    print(f"1. matmul 256x384x256 on 2 simulated TPU cores, races checked: max error {err:.2e}")
    assert np.allclose(out, x @ y, atol=1e-3)

    racy = pl.pallas_call(
        racy_kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        interpret=pi.InterpretParams(detect_races=True),
    )
    try:
        with pi.errors_as_raised():
            jax.jit(racy)(jnp.ones((8, 128), jnp.float32)).block_until_ready()
    except pi.DataRaceError as e:
        print(f"2. data race found:\n   {e}")
    else:
        raise AssertionError("the race was not reported")

    stuck = pl.pallas_call(
        deadlocking_kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.SemaphoreType.REGULAR],
        interpret=pi.InterpretParams(),
    )
    try:
        with pi.errors_as_raised():
            stuck(jnp.ones((8, 128), jnp.float32)).block_until_ready()
    except pi.DeadlockError as e:
        print(f"3. deadlock reported instead of a hang:\n   {e}")
    else:
        raise AssertionError("the deadlock was not reported")


if __name__ == "__main__":
    main()
