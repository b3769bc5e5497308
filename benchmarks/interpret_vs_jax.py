"""palladium.interpret vs jax's own TPU interpret mode, on the same kernels, in one process.

For each kernel: the first call (trace + compile + run, after `jax.clear_caches()`) and the
steady state (median of repeated calls), with race detection off and on, for both
interpreters. Ratios are jax / palladium (higher is better for palladium). Then profiles
of palladium's first and steady calls show where its time goes.

The interpreter runs inside a host callback, on a thread XLA owns (and simulated cores
beyond the first on threads of their own), so a profiler enabled on the main thread
sees none of it. The profile wraps the interpreter's entry point (every launch goes
through it) with a profiler of its own, enables one in every thread started meanwhile
(``threading.setprofile``), and merges them with the main thread's (tracing, lowering,
compiling).

    python benchmarks/interpret_vs_jax.py [--quick] [--no-profile] [--profile-only]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import statistics
import sys
import threading
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
from palladium.interpret.hook import jax_hook


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


def _print_tables(cases: list[Case], repeats: dict[str, int]) -> None:
    print(f"jax {jax.__version__}, {len(jax.devices())} CPU device(s), {os.cpu_count()} cores;"
          f" times in seconds (steady: median of {repeats['jax']} jax / "
          f"{repeats['palladium']} palladium calls); ratio = jax / palladium")
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
                first, steady, out = _time_calls(mode(), fn, args, repeats[name])
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--profile-only", action="store_true", help="skip the timing tables")
    parser.add_argument("--top", type=int, default=20, help="profile rows to print")
    parser.add_argument("--repeats", type=int, default=3,
                        help="steady-state calls of jax's interpreter (each takes seconds)")
    parser.add_argument("--palladium-repeats", type=int, default=7,
                        help="steady-state calls of palladium (more: its calls are short, "
                             "so a busy machine's noise needs more samples)")
    opts = parser.parse_args()
    if opts.quick:
        cases = [_matmul_case(256, 128), _flash_case(256, 128)]
    else:
        cases = [_matmul_case(1024, 128), _flash_case(2048, 128)]

    if not opts.profile_only:
        _print_tables(cases, {"jax": opts.repeats, "palladium": opts.palladium_repeats})
    if not opts.no_profile:
        _print_profiles(cases, opts.top)


class _Profiles:
    """cProfile of the main thread, of each launch's host callback and of the threads
    started while profiling (simulated cores)."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def _new(self) -> cProfile.Profile:
        prof = cProfile.Profile()
        with self._lock:
            self.profiles.append(prof)
        return prof

    def _thread_hook(self, frame, event, arg):  # first event of a new thread
        sys.setprofile(None)
        self._new().enable()

    @contextlib.contextmanager
    def capture(self):
        entry = getattr(jax_hook, "_execute", None)
        if entry is None:
            raise RuntimeError("palladium.interpret.hook.jax_hook._execute (the interpreter's "
                               "entry point) is gone: update the benchmark's profiler")

        def profiled(*args, **kwargs):
            prof = self._new()
            prof.enable()
            try:
                return entry(*args, **kwargs)
            finally:
                prof.disable()

        main = self._new()
        jax_hook._execute = profiled
        threading.setprofile(self._thread_hook)
        main.enable()
        try:
            yield
        finally:
            main.disable()
            threading.setprofile(None)
            jax_hook._execute = entry

    def report(self, top: int) -> str:
        buf = io.StringIO()
        stats = pstats.Stats(*self.profiles, stream=buf)
        for func in [f for f in stats.stats if "_lsprof.Profiler" in f[2]]:
            del stats.stats[func]  # the profilers' own enable calls (time spent waiting)
        stats.sort_stats("tottime").print_stats(top)
        text = buf.getvalue().strip()
        return text.replace(str(_site_packages()), "<site-packages>")


def _site_packages() -> str:
    return jax.__file__.rsplit("/jax/", 1)[0]


def _print_profiles(cases: list[Case], top: int) -> None:
    for case in cases:
        fn, args = case.make()
        for races in (False, True):
            jax.clear_caches()
            jitted = jax.jit(fn)
            first, steady = _Profiles(), _Profiles()
            with pi.force_tpu_interpret_mode(pi.InterpretParams(detect_races=races)):
                with first.capture():
                    jitted(*args).block_until_ready()
                with steady.capture():
                    jitted(*args).block_until_ready()
            for what, prof in (("first call (trace + lower + compile + run)", first),
                               ("steady-state call", steady)):
                print()
                print(f"Profile of palladium's {what}, {case.name}, races "
                      f"{'on' if races else 'off'} (top {top} by own time):")
                print("```")
                print(prof.report(top))
                print("```", flush=True)


if __name__ == "__main__":
    main()
