"""palladium.interpret vs both of jax's interpreters on jax's shipped TPU kernels and on
small-op kernels (benchmarks/kernel_cases.py), all in one process.

Interpreters: jax's plain HLO interpreter (``interpret=True``: no DMA, semaphore or
core is simulated), jax's TPU interpret mode (``pltpu.InterpretParams()``) and palladium
(``palladium.interpret.InterpretParams``), races off and on. For each kernel every
interpreter's first call (trace + compile + run, after ``jax.clear_caches()``) is timed
and its answer checked against numpy; then the steady state is measured in interleaved
rounds (one call of every interpreter per round, so load drifts hit all alike) and the
median taken: each call follows another interpreter's, whose run evicted the caches.
"Warm" is a kernel called in a loop: rounds of ``WARM_CALLS`` back-to-back calls of one
interpreter (HLO and palladium, alternated), the median of the rounds' mean call.
"First again" is the first call repeated ``FIRST_ROUNDS`` times, HLO and palladium
alternated, each after ``jax.clear_caches()`` and a new ``jax.jit`` (a new trace,
lowering, compile and launch 1; the process's one-time imports and palladium's disk
cache already warm), the median: one first call is a single sample.
"First 3 calls" is the first call and the next two together: a kernel's third launch
waits for its whole launch's compile (or its load from palladium's disk cache, so a
second run of this script is warm). Reported ratios are other / palladium (higher is
better for palladium),
except "vs HLO", which is palladium / HLO (the issue's "within 2x" goal: lower is better).

    python benchmarks/interpret_kernels.py                  # every kernel (~3-4 min)
    python benchmarks/interpret_kernels.py --quick          # small sizes (~1 min)
    python benchmarks/interpret_kernels.py -k paged -k gmm  # kernels whose name matches
    python benchmarks/interpret_kernels.py --jax-races      # also jax's race detector (slow)
    python benchmarks/interpret_kernels.py --profile paged  # cProfile palladium's steady call
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time

import jax
import numpy as np
from jax._src import config as jax_config
from jax.experimental.pallas import tpu as pltpu

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_cases  # noqa: E402

import palladium.interpret as pi  # noqa: E402


def _forced(value):
    @contextlib.contextmanager
    def ctx():
        option = jax_config.pallas_tpu_interpret_mode_context_manager
        prev = option.swap_local(value)
        try:
            yield
        finally:
            option.set_local(prev)

    return ctx


def modes(jax_races: bool) -> dict:
    out = {
        "hlo": _forced(True),
        "jax": _forced(pltpu.InterpretParams()),
        "palladium": _forced(pi.InterpretParams()),
        "palladium races": _forced(pi.InterpretParams(detect_races=True)),
    }
    if jax_races:
        out["jax races"] = _forced(pltpu.InterpretParams(detect_races=True))
    return out


def _check(name, case, out, expected):
    err = float(np.max(np.abs(np.asarray(out, np.float64) - expected)))
    scale = max(1.0, float(np.max(np.abs(expected))))
    if not err <= case.tolerance * scale:
        raise AssertionError(f"{name} gave a wrong answer on {case.name}: max error {err}")


def measure(case, mode_ctx: dict, rounds: int, slow_rounds: int) -> dict:
    """{mode: (first, steady)} for one case; jax's TPU interpreter gets fewer rounds."""
    fn, args = case.make()
    expected = np.asarray(case.reference(*args), np.float64)
    jitted, first, results, three = {}, {}, {}, {}
    for name, ctx in mode_ctx.items():
        jax.clear_caches()
        jitted[name] = jax.jit(fn)
        with ctx():
            t0 = time.perf_counter()
            out = jax.block_until_ready(jitted[name](*args))
            first[name] = time.perf_counter() - t0
            if name in _WARM_MODES:  # the first three calls (before another's clear_caches)
                for _ in range(2):
                    jax.block_until_ready(jitted[name](*args))
                three[name] = time.perf_counter() - t0
        _check(name, case, out, expected)
        results[name] = np.asarray(out)
    for name in mode_ctx:
        if name.startswith("palladium") and not np.array_equal(results[name],
                                                               results["palladium"]):
            raise AssertionError(f"{name} differs from palladium on {case.name}")
    # Two more calls of every interpreter before the rounds: a kernel's second launch
    # compiles its hot segments, or its whole launch, in the background, and its third
    # waits for them (steady means after that).
    for name, ctx in mode_ctx.items():
        if not name.startswith("jax"):
            with ctx():
                for _ in range(2):
                    jax.block_until_ready(jitted[name](*args))
    steady: dict[str, list[float]] = {name: [] for name in mode_ctx}
    last: dict[str, list[np.ndarray]] = {name: [] for name in mode_ctx}
    for r in range(rounds):
        for name, ctx in mode_ctx.items():
            if name.startswith("jax") and r >= slow_rounds:
                continue
            with ctx():
                t0 = time.perf_counter()
                out = jax.block_until_ready(jitted[name](*args))
                steady[name].append(time.perf_counter() - t0)
            _check(name, case, out, expected)
            last[name] = [*last[name][-1:], np.asarray(out)]
    # From a kernel's third launch on, hot segments run XLA's code (its bits may differ
    # from the first calls' in the last place): the last calls agree with each other,
    # races on or off.
    for name in mode_ctx:
        if name.startswith("palladium") and len(last[name]) == 2 and not all(
                np.array_equal(o, last["palladium"][-1]) for o in last[name]):
            raise AssertionError(f"{name}: the last steady calls' bits differ on {case.name}")
    # Warm: back-to-back calls, as a loop over one kernel makes them.
    warm: dict[str, list[float]] = {name: [] for name in _WARM_MODES}
    for _ in range(rounds):
        for name in _WARM_MODES:
            with mode_ctx[name]():
                t0 = time.perf_counter()
                for _ in range(WARM_CALLS):
                    out = jax.block_until_ready(jitted[name](*args))
                warm[name].append((time.perf_counter() - t0) / WARM_CALLS)
            _check(name, case, out, expected)
    # First calls again, alternated: each after jax.clear_caches() and a new jax.jit (a
    # fresh trace, lowering, XLA compile and palladium kernel: launch 1 again, its disk
    # cache warm); the median of FIRST_ROUNDS, robust to the machine's slow stretches
    # that a single first call meets or misses.
    again: dict[str, list[float]] = {name: [] for name in _WARM_MODES}
    for _ in range(FIRST_ROUNDS):
        for name in _WARM_MODES:
            jax.clear_caches()
            f = jax.jit(fn)
            with mode_ctx[name]():
                t0 = time.perf_counter()
                out = jax.block_until_ready(f(*args))
                again[name].append(time.perf_counter() - t0)
            _check(name, case, out, expected)
    res = {name: (first[name], statistics.median(steady[name])) for name in mode_ctx}
    res.update({f"{name} again": (statistics.median(again[name]), 0.0) for name in _WARM_MODES})
    res.update({f"{name} warm": (0.0, statistics.median(warm[name])) for name in _WARM_MODES})
    res.update({f"{name} three": (three[name], 0.0) for name in _WARM_MODES})
    return res


#: Back-to-back calls per warm round, and the interpreters measured so.
WARM_CALLS = 10
#: Alternated first calls after the first (see ``measure``).
FIRST_ROUNDS = 5
_WARM_MODES = ("hlo", "palladium")


def _ms(t: float) -> str:
    return f"{t * 1e3:.1f}"


def print_table(cases, mode_ctx, rounds, slow_rounds) -> None:
    print(f"jax {jax.__version__}, {os.cpu_count()} cores; times in ms; first = trace + "
          f"compile + run; steady = median of {rounds} interleaved rounds "
          f"({slow_rounds} for jax's TPU interpreter)")
    print()
    jr = "jax races" in mode_ctx
    head = ("| kernel | HLO first | jax TPU first | palladium first | first vs HLO | "
            "first vs jax TPU | HLO steady | jax TPU steady | palladium steady | "
            "steady: palladium / HLO | jax TPU / palladium | palladium races on | "
            "race overhead | warm: HLO / palladium (ms) | warm: palladium / HLO | "
            "first 3 calls: HLO / palladium (ms) | first 3 calls vs HLO | "
            f"first again, median of {FIRST_ROUNDS}: HLO / palladium (ms) | first again vs HLO |")
    if jr:
        head += " jax TPU races on |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    steady_vs_hlo, races_over, warm_vs_hlo = [], [], []
    for case in cases:
        res = measure(case, mode_ctx, rounds, slow_rounds)
        (hf, hs), (jf, js), (pf, ps) = res["hlo"], res["jax"], res["palladium"]
        rs = res["palladium races"][1]
        hw, pw = res["hlo warm"][1], res["palladium warm"][1]
        h3, p3 = res["hlo three"][0], res["palladium three"][0]
        ha, pa = res["hlo again"][0], res["palladium again"][0]
        steady_vs_hlo.append(ps / hs)
        warm_vs_hlo.append(pw / hw)
        races_over.append(rs / ps)
        row = (f"| {case.name} | {_ms(hf)} | {_ms(jf)} | {_ms(pf)} | {hf / pf:.1f}x faster | "
               f"{jf / pf:.1f}x faster | {_ms(hs)} | {_ms(js)} | {_ms(ps)} | {ps / hs:.2f}x | "
               f"{js / ps:.1f}x | {_ms(rs)} | {rs / ps:.2f}x | {hw * 1e3:.2f} / {pw * 1e3:.2f} | "
               f"{pw / hw:.2f}x | {_ms(h3)} / {_ms(p3)} | {h3 / p3:.1f}x faster | "
               f"{_ms(ha)} / {_ms(pa)} | {ha / pa:.1f}x faster |")
        if jr:
            row += f" {_ms(res['jax races'][1])} |"
        print(row, flush=True)
    if cases:
        print()
        geo = math.exp(statistics.mean(math.log(r) for r in steady_vs_hlo))
        warm_geo = math.exp(statistics.mean(math.log(r) for r in warm_vs_hlo))
        print(f"Geometric mean of palladium / HLO steady: {geo:.2f}x (warm: {warm_geo:.2f}x); "
              f"race overhead: max {max(races_over):.2f}x.")


def profile(case, races: bool, top: int, dump: str | None = None) -> None:
    import cProfile
    import pstats

    fn, args = case.make()
    jitted = jax.jit(fn)
    with _forced(pi.InterpretParams(detect_races=races))():
        jax.block_until_ready(jitted(*args))
        prof = cProfile.Profile()
        # The interpreter runs on a thread XLA owns: profile its entry point there.
        from palladium.interpret.hook import jax_hook
        entry = jax_hook._execute

        def profiled(*a, **k):
            prof.enable()
            try:
                return entry(*a, **k)
            finally:
                prof.disable()

        jax_hook._execute = profiled
        try:
            for _ in range(3):
                jax.block_until_ready(jitted(*args))
        finally:
            jax_hook._execute = entry
    print(f"\nProfile of 3 steady calls, {case.name}, races {'on' if races else 'off'}:")
    if dump:
        prof.dump_stats(dump)
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("-k", action="append", default=[],
                        help="run only kernels whose name contains this (repeatable)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved steady rounds")
    parser.add_argument("--jax-rounds", type=int, default=2,
                        help="steady rounds of jax's TPU interpreter (seconds per call)")
    parser.add_argument("--jax-races", action="store_true",
                        help="also time jax's TPU interpreter with races on")
    parser.add_argument("--profile", metavar="NAME", help="profile one kernel instead")
    parser.add_argument("--races", action="store_true", help="with --profile: races on")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--dump", metavar="FILE", help="with --profile: save the pstats")
    opts = parser.parse_args(argv)
    cases = kernel_cases.all_cases(opts.quick)
    if opts.k:
        cases = [c for c in cases if any(k in c.name for k in opts.k)]
    if opts.profile:
        for case in [c for c in cases if opts.profile in c.name]:
            profile(case, opts.races, opts.top, opts.dump)
        return 0
    print_table(cases, modes(opts.jax_races), opts.rounds, opts.jax_rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
