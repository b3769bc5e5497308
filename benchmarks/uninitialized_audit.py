"""How many reports ``InterpretParams(uninitialized_reads=...)`` makes on kernels that
are correct: the benchmark kernels (benchmarks/kernel_cases.py: jax's shipped TPU
kernels and ours). Every report here is a false report (each kernel's answer is checked
against numpy). The default mode, ``"on_use"``, reports values derived from
uninitialised memory where they are used; ``--mode warn`` counts every read of
never-written memory (the old read-based check, which reports megablox gmm).

    python benchmarks/uninitialized_audit.py            # the quick sizes
    python benchmarks/uninitialized_audit.py --calls 4  # calls 1-4 (compiled from 3)
    python benchmarks/uninitialized_audit.py --full     # the benchmark sizes
    python benchmarks/uninitialized_audit.py --cost -k matmul   # time off vs on
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


def cost(case, rounds: int) -> tuple[float, float]:
    """Median steady seconds per call with the check off and on (interleaved rounds)."""
    fn, args = case.make()
    jitted = {mode: jax.jit(fn) for mode in ("off", "raise")}
    times: dict[str, list[float]] = {"off": [], "raise": []}
    for r in range(rounds + 1):
        for mode, f in jitted.items():
            with _forced(pi.InterpretParams(uninitialized_reads=mode))():
                t0 = time.perf_counter()
                jax.block_until_ready(f(*args))
                if r:  # round 0 compiles
                    times[mode].append(time.perf_counter() - t0)
    return statistics.median(times["off"]), statistics.median(times["raise"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--full", action="store_true", help="the benchmark sizes")
    parser.add_argument("-k", action="append", default=[])
    parser.add_argument("--cost", action="store_true", help="time off vs on instead")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mode", default="on_use", choices=("on_use", "warn"),
                        help="on_use (the default: reported on use) or warn (every read)")
    parser.add_argument("--calls", type=int, default=1,
                        help="calls per case (4: the compiled paths from call 3 on)")
    opts = parser.parse_args(argv)
    cases = kernel_cases.all_cases(quick=not opts.full)
    if opts.k:
        cases = [c for c in cases if any(k in c.name for k in opts.k)]
    if opts.cost:
        print("| kernel | off (ms) | on (ms) | on / off |\n|---|---|---|---|")
        for case in cases:
            off, on = cost(case, opts.rounds)
            print(f"| {case.name} | {off * 1e3:.1f} | {on * 1e3:.1f} | {on / off:.2f}x |",
                  flush=True)
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
