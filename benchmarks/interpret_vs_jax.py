"""palladium.interpret vs jax's own TPU interpret mode, on the same kernels, in one process.

For each kernel: the first call (trace + compile + run, after `jax.clear_caches()`) and the
steady state (median of repeated calls), with race detection off and on, for both
interpreters. Ratios are jax / palladium (higher is better for palladium). Then a profile
of palladium's steady state shows where its remaining time goes.

    python benchmarks/interpret_vs_jax.py [--quick] [--no-profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as fa
from jax.experimental.pallas.ops.tpu.matmul import matmul

import palladium.interpret as pi


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], tuple[Callable, tuple]]
    reference: Callable[..., np.ndarray]


def _matmul_case(n: int, block: int) -> Case:
    def make():
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32))
        y = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32))

        def f(x, y):
            return matmul(x, y, block_shape=(block, block), block_k=block)

        return f, (x, y)

    return Case(f"matmul {n}^3 (blocks {block})", make, lambda x, y: np.asarray(x) @ np.asarray(y))


def _flash_case(seq: int, block: int) -> Case:
    def make():
        rng = np.random.default_rng(0)
        q, k, v = (
            jnp.asarray(rng.standard_normal((1, 1, seq, 128), dtype=np.float32)) for _ in range(3)
        )
        sizes = fa.BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1)

        def f(q, k, v):
            return fa.flash_attention(q, k, v, block_sizes=sizes)

        return f, (q, k, v)

    def ref(q, k, v):
        q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
        s = q @ np.swapaxes(k, -1, -2)
        p = np.exp(s - s.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)) @ v

    return Case(f"flash attention seq {seq} (blocks {block})", make, ref)


def _time_calls(mode, fn, args, repeats: int) -> tuple[float, float, np.ndarray]:
    jax.clear_caches()
    jitted = jax.jit(fn)
    with mode:
        t0 = time.perf_counter()
        out = jitted(*args).block_until_ready()
        first = time.perf_counter() - t0
        steady = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jitted(*args).block_until_ready()
            steady.append(time.perf_counter() - t0)
    return first, statistics.median(steady), np.asarray(out)


def _modes(races: bool):
    return {
        "jax": lambda: pltpu.force_tpu_interpret_mode(pltpu.InterpretParams(detect_races=races)),
        "palladium": lambda: pi.force_tpu_interpret_mode(pi.InterpretParams(detect_races=races)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args()
    if opts.quick:
        cases = [_matmul_case(256, 128), _flash_case(256, 128)]
    else:
        cases = [_matmul_case(1024, 128), _flash_case(2048, 128)]

    print(f"jax {jax.__version__}, {len(jax.devices())} CPU device(s); times in seconds;"
          " ratio = jax / palladium")
    print()
    print("| kernel | races | jax first | palladium first | ratio | jax steady |"
          " palladium steady | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    steady_by = {}
    for case in cases:
        fn, args = case.make()
        expected = case.reference(*args)
        for races in (False, True):
            row = {}
            for name, mode in _modes(races).items():
                first, steady, out = _time_calls(mode(), fn, args, opts.repeats)
                err = float(np.max(np.abs(out - expected)))
                if err > 1e-2 * max(1.0, float(np.max(np.abs(expected)))):
                    raise AssertionError(f"{name} gave a wrong answer on {case.name}: {err}")
                row[name] = (first, steady)
            steady_by[(case.name, races)] = row["palladium"][1]
            jf, js = row["jax"]
            pf, ps = row["palladium"]
            print(f"| {case.name} | {'on' if races else 'off'} | {jf:.3f} | {pf:.3f} |"
                  f" {jf / pf:.1f}x | {js:.3f} | {ps:.3f} | {js / ps:.1f}x |", flush=True)
    print()
    print("| kernel | palladium race-detection overhead (steady, on / off) |")
    print("|---|---|")
    for case in cases:
        on, off = steady_by[(case.name, True)], steady_by[(case.name, False)]
        print(f"| {case.name} | {on / off:.2f}x |")

    if not opts.no_profile:
        case = cases[0]
        fn, args = case.make()
        jitted = jax.jit(fn)
        with pi.force_tpu_interpret_mode(pi.InterpretParams()):
            jitted(*args).block_until_ready()
            prof = cProfile.Profile()
            prof.enable()
            jitted(*args).block_until_ready()
            prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
        print()
        print(f"Profile of one steady-state palladium call, {case.name} (top 15 by own time):")
        print("```")
        print(buf.getvalue().strip())
        print("```")


if __name__ == "__main__":
    main()
