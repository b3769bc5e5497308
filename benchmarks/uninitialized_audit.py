"""How many reports ``InterpretParams(uninitialized_reads=...)`` makes on kernels that
are correct: the benchmark kernels (benchmarks/kernel_cases.py: jax's shipped TPU
kernels and ours). Every report here is a false report (each kernel's answer is checked
against numpy). The default mode, ``"on_use"``, reports values derived from
uninitialised memory where they are used; ``--mode warn`` counts every read of
never-written memory (the old read-based check, which reports megablox gmm).

    python benchmarks/uninitialized_audit.py            # the quick sizes
    python benchmarks/uninitialized_audit.py --calls 4  # calls 1-4 (compiled from 3)
    python benchmarks/uninitialized_audit.py --full     # the benchmark sizes
    python benchmarks/uninitialized_audit.py --cost -k matmul   # first / steady, off vs on_use
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_cases  # noqa: E402
from interpret_kernels import _check, _forced  # noqa: E402

import palladium.interpret as pi  # noqa: E402


def audit(case, races: bool, mode: str = "on_use", calls: int = 1) -> list[str]:
    """The uninitialised-memory reports of ``calls`` runs of ``case`` (answer checked):
    ``mode="on_use"`` (the default) raises at the first report, ``"warn"`` (every read of
    never-written memory) warns of each."""
    fn, args = case.make()
    params = pi.InterpretParams(uninitialized_reads=mode, detect_races=races)
    jitted = jax.jit(fn)
    reports: list[str] = []
    with warnings.catch_warnings(record=True) as caught, _forced(params)():
        warnings.simplefilter("always")
        for _ in range(calls):
            try:
                with pi.errors_as_raised():
                    out = jax.block_until_ready(jitted(*args))
            except pi.UninitializedReadError as e:
                reports.append(str(e))
                continue
            _check("palladium", case, out, np.asarray(case.reference(*args), np.float64))
    return reports + [str(w.message) for w in caught
                      if issubclass(w.category, pi.UninitializedReadWarning)]


MODES = ("off", "on_use")


def cost(case, rounds: int, calls: int = 6) -> dict[str, tuple[float, float, float, float]]:
    """{mode: (first call, steady call, first call CPU, steady call CPU)} in seconds,
    medians, ``off`` (before issue 41's default) against ``on_use`` (the default since),
    alternated: per round and mode, ``jax.clear_caches()`` and a new ``jax.jit`` (a first
    call: trace, lowering checks, XLA's compile, one simulated launch), then ``calls``
    more calls, of which those from the 4th on are steady (launches 1-2 run simulated,
    the compiled paths start at 3). CPU time (the process's, every thread) moves less
    than wall time on a shared machine."""
    fn, args = case.make()
    times: dict[str, list[list[float]]] = {m: [[], [], [], []] for m in MODES}
    for _ in range(rounds):
        for mode in MODES:
            jax.clear_caches()
            f = jax.jit(fn)
            with _forced(pi.InterpretParams(uninitialized_reads=mode))():
                for c in range(calls + 1):
                    t0, c0 = time.perf_counter(), time.process_time()
                    jax.block_until_ready(f(*args))
                    dt, dc = time.perf_counter() - t0, time.process_time() - c0
                    if c == 0:
                        times[mode][0].append(dt)
                        times[mode][2].append(dc)
                    elif c >= 3:
                        times[mode][1].append(dt)
                        times[mode][3].append(dc)
    return {m: tuple(statistics.median(t) for t in times[m]) for m in MODES}  # type: ignore[misc]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--full", action="store_true", help="the benchmark sizes")
    parser.add_argument("-k", action="append", default=[])
    parser.add_argument("--cost", action="store_true",
                        help="time first and steady calls, off vs on_use, instead")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", default="on_use", choices=("on_use", "warn"),
                        help="on_use (the default: reported on use) or warn (every read)")
    parser.add_argument("--calls", type=int, default=1,
                        help="calls per case (4: the compiled paths from call 3 on)")
    opts = parser.parse_args(argv)
    cases = kernel_cases.all_cases(quick=not opts.full)
    if opts.k:
        cases = [c for c in cases if any(k in c.name for k in opts.k)]
    if opts.cost:
        print("| kernel | first off / on_use (ms) | first on_use / off (wall, CPU) | steady off / "
              "on_use (ms) | steady on_use / off (wall, CPU) |\n|---|---|---|---|---|")
        for case in cases:
            t = cost(case, opts.rounds)
            (f0, s0, cf0, cs0), (f1, s1, cf1, cs1) = t["off"], t["on_use"]
            print(f"| {case.name} | {f0 * 1e3:.0f} / {f1 * 1e3:.0f} | {f1 / f0:.2f}x, "
                  f"{cf1 / cf0:.2f}x | {s0 * 1e3:.1f} / {s1 * 1e3:.1f} | {s1 / s0:.2f}x, "
                  f"{cs1 / cs0:.2f}x |", flush=True)
        return 0
    total = 0
    for case in cases:
        for races in (False, True):
            reports = audit(case, races, opts.mode, opts.calls)
            total += len(reports)
            print(f"{case.name} (races {'on' if races else 'off'}): {len(reports)} report(s)",
                  flush=True)
            for r in reports:
                print(f"    {r}")
    print(f"false reports: {total}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
