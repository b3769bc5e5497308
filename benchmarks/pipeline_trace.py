"""Trace + lower time of palladium.pipeline.emit_pipeline vs jax's, by grid size.

Each kernel is a double-buffered elementwise pipeline over a (steps*8, 128) f32 array,
exported for TPU v5e (``jax.export``, platforms=["tpu"], under an abstract mesh whose
abstract device is a TPU): this traces the kernel and lowers it to Mosaic. A fresh
kernel closure per measurement defeats jax's tracing caches.

    python benchmarks/pipeline_trace.py [--repeats N]

Target: ratio (palladium / jax) <= 1 and flat in the number of steps (the grid loop is
a scan, not unrolled). Robustness on a shared machine: the two implementations are
interleaved (alternating which goes first) so that load drifts hit both alike, the
garbage collector is paused while timing, and each cell is the minimum of N runs
(the run least disturbed by other processes); the median is printed too.
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
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


def _measure(emitters: dict, steps: int, repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in emitters}
    names = list(emitters)
    for r in range(repeats):
        for name in names if r % 2 == 0 else reversed(names):
            gc.collect()
            gc.disable()
            try:
                times[name].append(_trace_and_lower(emitters[name], steps))
            finally:
                gc.enable()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--primitive", action="store_true",
                        help="also time palladium's use_primitive=True path")
    args = parser.parse_args()
    emitters = {"palladium": pp.emit_pipeline, "jax": pltpu.emit_pipeline}
    if args.primitive:
        emitters["primitive"] = functools.partial(pp.emit_pipeline, use_primitive=True)
    for emit in emitters.values():  # warm up jax's own caches (lowering rules, MLIR)
        for _ in range(3):
            _trace_and_lower(emit, 8)
    header = "".join(f" {name + ' min':>15} {'median':>7}" for name in emitters)
    print(f"{'steps':>6}{header} {'ratio(min)':>10}")
    for steps in GRIDS:
        times = _measure(emitters, steps, args.repeats)
        cells = "".join(f" {min(t) * 1e3:>15.1f} {statistics.median(t) * 1e3:>7.1f}"
                        for t in times.values())
        ratio = min(times["palladium"]) / min(times["jax"])
        print(f"{steps:>6}{cells} {ratio:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
