"""What the issue-24 features cost under palladium.interpret (short runs).

* jax's own ``emit_pipeline`` primitive (``jax_use_emit_pipeline_primitive``) against the
  inlined ``pltpu.emit_pipeline`` (the flag off) on a 256x512x512 f32 matmul pipeline
  (grid 4x4x4 of 64x128 / 128x128 blocks): first call and steady state per call, the
  predicted TPU time and the DMA bytes each simulates;
* the explicit MXU operations (v7x) against ``jnp.dot`` in the same kernel shape (a
  1024x256 @ 256x256 bf16 product): steady state per call and predicted time.

Run: ``JAX_PLATFORMS=cpu python benchmarks/parity_features.py [--calls N]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import AbstractMesh

import palladium.interpret as pi
from palladium.interpret import _jax_compat as jc

M, K, N = 256, 512, 512


def matmul_kernel(x_hbm, y_hbm, o_hbm):
    def body(x, y, o):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o[...] = jnp.zeros_like(o)

        o[...] += jnp.dot(x[...], y[...], preferred_element_type=jnp.float32)

    pltpu.emit_pipeline(
        body, grid=(M // 64, N // 128, K // 128),
        in_specs=[pl.BlockSpec((64, 128), lambda i, j, k: (i, k)),
                  pl.BlockSpec((128, 128), lambda i, j, k: (k, j))],
        out_specs=[pl.BlockSpec((64, 128), lambda i, j, k: (i, j))])(x_hbm, y_hbm, o_hbm)


def _pipeline_call(primitive: bool):
    call = pl.pallas_call(
        matmul_kernel, out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        interpret=pi.InterpretParams(compile_check="approximate"))
    x = jax.random.normal(jax.random.key(0), (M, K), jnp.float32)
    y = jax.random.normal(jax.random.key(1), (K, N), jnp.float32)
    mesh = AbstractMesh((), (), axis_types=(),
                        abstract_device=jc.abstract_device(device_kind="TPU v5 lite",
                                                           num_cores=1))
    jax.config.update("jax_use_emit_pipeline_primitive", primitive)
    try:
        with jax.sharding.use_abstract_mesh(mesh):
            compiled = jax.jit(call).trace(x, y).lower().compile()
    finally:
        jax.config.update("jax_use_emit_pipeline_primitive", False)
    return compiled, (x, y)


def _mxu_call(explicit: bool):
    def kernel(x_ref, y_ref, o_ref):
        if explicit:
            pltpu.matmul_push_rhs(y_ref[...], staging_register=0, mxu_index=0)
            pltpu.matmul_acc_lhs(acc_addr=0, lhs=x_ref[...], mxu_index=0, load_staged_rhs=0)
            o_ref[...] = pltpu.matmul_pop(acc_addr=0, shape=(1024, 256), dtype=jnp.float32,
                                          mxu_index=0)
        else:
            o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    call = jax.jit(pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((1024, 256), jnp.float32),
        interpret=pi.InterpretParams(chip="v7x", compile_check="approximate")))
    x = jax.random.normal(jax.random.key(0), (1024, 256), jnp.bfloat16)
    y = jax.random.normal(jax.random.key(1), (256, 256), jnp.bfloat16)
    return call, (x, y)


def _measure(call, args, calls: int) -> tuple[float, float, object]:
    t0 = time.perf_counter()
    jax.block_until_ready(call(*args))
    first = time.perf_counter() - t0
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(call(*args))
        times.append(time.perf_counter() - t0)
    with pi.timeline() as tl:
        jax.block_until_ready(call(*args))
    return first, sorted(times)[len(times) // 2], tl.launches[-1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5)
    calls = parser.parse_args().calls
    print("| case | first call | steady (median) | predicted TPU time | DMA bytes |")
    print("|---|---|---|---|---|")
    for name, (call, args) in [
        ("pltpu.emit_pipeline inlined (flag off)", _pipeline_call(False)),
        ("jax's emit_pipeline primitive (flag on)", _pipeline_call(True)),
        ("jnp.dot, v7x", _mxu_call(False)),
        ("explicit MXU ops, v7x", _mxu_call(True)),
    ]:
        first, steady, launch = _measure(call, args, calls)
        print(f"| {name} | {first:.3f} s | {steady * 1e3:.1f} ms | "
              f"{launch.predicted_seconds * 1e6:.2f} us | {launch.dma_bytes:,} |")


if __name__ == "__main__":
    main()
