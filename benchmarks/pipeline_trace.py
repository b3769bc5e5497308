"""Trace + lower time of palladium.pipeline.emit_pipeline vs jax's, by grid size.

Each kernel is a double-buffered elementwise pipeline over a (steps*8, 128) f32 array,
exported for TPU v5e (``jax.export``, platforms=["tpu"], under an abstract mesh whose
abstract device is a TPU): this traces the kernel and lowers it to Mosaic. A fresh
kernel closure per measurement defeats jax's tracing caches.

    python benchmarks/pipeline_trace.py [--repeats N]

Target: ratio (palladium / jax) <= 1 and flat in the number of steps (the grid loop is
a scan, not unrolled).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

import palladium.pipeline as pp

GRIDS = (8, 64, 512, 4096)


def _kernel(emit, steps):
    def kernel(x_hbm, o_hbm):
        def body(x, o):
            o[...] = x[...] * 2.0 + 1.0

        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        emit(body, grid=(steps,), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

    return kernel


def _trace_and_lower(emit, steps: int) -> float:
    shape = (steps * 8, 128)
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    call = pl.pallas_call(_kernel(emit, steps), out_shape=jax.ShapeDtypeStruct(shape, jnp.float32),
                          in_specs=[any_spec], out_specs=any_spec)
    device = AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
    mesh = AbstractMesh((1,), ("x",), abstract_device=device)
    start = time.perf_counter()
    with use_abstract_mesh(mesh):
        exported = jax.export.export(jax.jit(call), platforms=["tpu"])(
            jax.ShapeDtypeStruct(shape, jnp.float32))
        exported.mlir_module()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    emitters = {"palladium": pp.emit_pipeline, "jax": pltpu.emit_pipeline}
    for emit in emitters.values():  # warm up jax's own caches (lowering rules, MLIR)
        _trace_and_lower(emit, 8)
    print(f"{'steps':>6} {'palladium ms':>13} {'jax ms':>9} {'ratio':>6}")
    for steps in GRIDS:
        best = {name: min(_trace_and_lower(emit, steps) for _ in range(args.repeats))
                for name, emit in emitters.items()}
        ratio = best["palladium"] / best["jax"]
        print(f"{steps:>6} {best['palladium'] * 1e3:>13.1f} {best['jax'] * 1e3:>9.1f} "
              f"{ratio:>6.2f}")


if __name__ == "__main__":
    main()
