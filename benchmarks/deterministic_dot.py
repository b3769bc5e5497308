"""Cost of ``InterpretParams(deterministic_dot=True)``: blocked matmul kernels (the
guide's kernel: f32 accumulator in VMEM, ``jnp.dot`` per grid step) with and without it.

Prints one Markdown row per case: palladium's steady CPU milliseconds per call (process
time, median of ``--repeats`` jitted calls after a warm-up), both ways, and the ratio.
Process time, not wall time: the machine is shared, and both columns are measured in the
same run one right after the other.

    python benchmarks/deterministic_dot.py [--quick] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams

CASES = [  # m, n, k, block m, block n, block k, dtype
    (512, 512, 512, 128, 128, 128, jnp.float32),
    (512, 512, 512, 128, 128, 128, jnp.bfloat16),
    (256, 256, 2048, 128, 128, 512, jnp.float32),
    (1024, 1024, 1024, 256, 256, 256, jnp.bfloat16),
]


def matmul_ms(m, n, k, bm, bn, bk, dtype, deterministic, repeats):
    def matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    call = pl.pallas_call(
        matmul_kernel, out_shape=jax.ShapeDtypeStruct((m, n), dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=InterpretParams(deterministic_dot=deterministic))
    f = jax.jit(call)
    x, y = jnp.ones((m, k), dtype), jnp.ones((k, n), dtype)
    jax.block_until_ready(f(x, y))
    times = []
    for _ in range(repeats):
        start = time.process_time()
        jax.block_until_ready(f(x, y))
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the first two cases only")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print("| kernel | BLAS dot (ms) | deterministic_dot=True (ms) | cost |")
    print("|---|---|---|---|")
    for case in CASES[:2] if args.quick else CASES:
        off = matmul_ms(*case, deterministic=False, repeats=args.repeats)
        on = matmul_ms(*case, deterministic=True, repeats=args.repeats)
        m, n, k, bm, bn, bk, dtype = case
        print(f"| matmul {m}x{n}x{k} {jnp.dtype(dtype).name}, blocks {bm}x{bn}x{bk} | "
              f"{off:.1f} | {on:.1f} | {on / off:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
