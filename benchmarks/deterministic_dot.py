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
import functools
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from palladium.interpret import InterpretParams

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from timeline import matmul  # noqa: E402  (the guide's kernel, as examples/timeline.py has it)

CASES = [  # m, n, k, block m, block n, block k, dtype
    (512, 512, 512, 128, 128, 128, jnp.float32),
    (512, 512, 512, 128, 128, 128, jnp.bfloat16),
    (256, 256, 2048, 128, 128, 512, jnp.float32),
    (1024, 1024, 1024, 256, 256, 256, jnp.bfloat16),
]


def matmul_ms(m, n, k, bm, bn, bk, dtype, deterministic, repeats):
    f = jax.jit(functools.partial(
        matmul, bm=bm, bk=bk, bn=bn, buffers=2,
        interpret=InterpretParams(deterministic_dot=deterministic)))
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
