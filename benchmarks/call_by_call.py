"""Each call of a kernel against jax's HLO interpreter's same call (issue 43, item 4):
the first call, the second, and the steady ones (calls 3-8), on ``kernel_cases.py``.

A kernel is called ``CALLS`` times in a row under jax's HLO interpreter
(``interpret=True``) and then under palladium, each after ``jax.clear_caches()`` and a
new ``jax.jit`` (so each interpreter's first call traces, lowers, compiles and runs).
Every answer is checked against numpy. Reported: each interpreter's call 1, call 2 and
the median of calls 3-8, and palladium / HLO for each (lower is better for palladium;
the goals: first <= 1/3, second <= 1.0, steady <= 1.0), with the tier each palladium
call ran (c: compiled whole, s: simulated, with or without compiled segments) and the
load average; the sums of calls 1-2 and 1-3 against HLO's; and the whole launch's
compile (palladium's call 3 less its steady call) against the time the first- and
second-call goals leave for it, HLO's call 1 / 3 + HLO's call 2: a compile longer than
that cannot be finished by call 2 without call 1 or call 2 missing its goal.

palladium's disk cache is a fresh folder (``$PALLADIUM_CACHE_DIR``, cold: nothing
compiled before) unless ``--warm`` (a second run of the same kernels, as a test suite's
second run meets it).

The measured ratios, with the whole launch compiled from call 3 and from call 2
(``execution_plan.WHOLE_LAUNCH``), cold and warm: benchmarks/README.md (the issue-43 row)
and LOG.md ("Each call against HLO's same call"). For a before/after in one sitting, run
the base's source on ``PYTHONPATH`` (``git archive BASE packages``) with ``--warm`` and a
fresh ``$PALLADIUM_CACHE_DIR`` (cold), then again with the same folder (warm).

    python benchmarks/call_by_call.py              # every kernel (~2 min)
    python benchmarks/call_by_call.py --quick      # small sizes
    python benchmarks/call_by_call.py -k paged     # kernels whose name matches
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time

CALLS = 8


def _setup_cache(warm: bool) -> None:
    if not warm:
        os.environ["PALLADIUM_CACHE_DIR"] = tempfile.mkdtemp(prefix="palladium-calls-")


def _calls(fn, args, check, n: int, tiers: list[str] | None = None) -> list[float]:
    import jax

    from palladium.interpret.compiled.compiled_launch import STATS

    jax.clear_caches()
    f = jax.jit(fn)
    times = []
    for _ in range(n):
        before = STATS["compiled"]
        t0 = time.perf_counter()
        out = jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t0)
        if tiers is not None:  # (an observer would keep the launch simulated)
            tiers.append("c" if STATS["compiled"] > before else "s")
        check(out)
    return times


def measure(case, calls: int) -> dict:
    import numpy as np

    import palladium.interpret as pi

    fn, args = case.make()
    expected = np.asarray(case.reference(*args), np.float64)

    def check(out):
        err = float(np.max(np.abs(np.asarray(out, np.float64) - expected)))
        scale = max(1.0, float(np.max(np.abs(expected))))
        if not err <= case.tolerance * scale:
            raise AssertionError(f"wrong answer on {case.name}: max error {err}")

    with _hlo():
        hlo = _calls(fn, args, check, calls)
    tiers: list[str] = []
    with pi.force_tpu_interpret_mode(pi.InterpretParams()):
        pd = _calls(fn, args, check, calls, tiers)
    return {"hlo": hlo, "palladium": pd, "tiers": tiers}


def _hlo():
    import contextlib

    from jax._src import config as jax_config

    @contextlib.contextmanager
    def ctx():
        option = jax_config.pallas_tpu_interpret_mode_context_manager
        prev = option.swap_local(True)
        try:
            yield
        finally:
            option.set_local(prev)

    return ctx()


def _ms(t: float) -> str:
    return f"{t * 1e3:.1f}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("-k", action="append", default=[])
    parser.add_argument("--warm", action="store_true", help="keep palladium's disk cache")
    parser.add_argument("--calls", type=int, default=CALLS)
    opts = parser.parse_args(argv)
    _setup_cache(opts.warm)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jax
    import kernel_cases

    cases = kernel_cases.all_cases(opts.quick)
    if opts.k:
        cases = [c for c in cases if any(k in c.name for k in opts.k)]
    print(f"jax {jax.__version__}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at "
          f"start; times in ms; palladium disk cache {'warm' if opts.warm else 'cold'}; "
          f"steady = median of calls 3-{opts.calls}; ratios palladium / HLO")
    print()
    print("| kernel | HLO 1 / 2 / steady | palladium 1 / 2 / steady | first | second | "
          "steady | calls 1-2 | calls 1-3 | palladium's tiers | compile / budget |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {"first": [], "second": [], "steady": [], "two": [],
                                      "three": []}
    for case in cases:
        res = measure(case, opts.calls)
        h, p = res["hlo"], res["palladium"]
        hs, ps = statistics.median(h[2:]), statistics.median(p[2:])
        r = (p[0] / h[0], p[1] / h[1], ps / hs, sum(p[:2]) / sum(h[:2]),
             sum(p[:3]) / sum(h[:3]))
        # The whole launch's compile (call 3, less a compiled call) against what the
        # goals leave for it if call 2 is to run compiled: a third of HLO's call 1 plus
        # HLO's call 2 (no plan fits a compile into less than calls 1 and 2 together).
        compile_ms, budget = p[2] - ps, h[0] / 3 + h[1]
        for key, v in zip(ratios, r):
            ratios[key].append(v)
        tiers = "".join(res["tiers"])
        print(f"| {case.name} | {_ms(h[0])} / {_ms(h[1])} / {_ms(hs)} | {_ms(p[0])} / "
              f"{_ms(p[1])} / {_ms(ps)} | {r[0]:.2f}x | {r[1]:.2f}x | {r[2]:.2f}x | {r[3]:.2f}x | "
              f"{r[4]:.2f}x | {tiers} | {_ms(compile_ms)} / {_ms(budget)} |",
              flush=True)
    if cases:
        geo = {k: math.exp(statistics.mean(math.log(x) for x in v)) for k, v in ratios.items()}
        print()
        print(f"Geometric means: first {geo['first']:.2f}x, second {geo['second']:.2f}x, "
              f"steady {geo['steady']:.2f}x, calls 1-2 {geo['two']:.2f}x, calls 1-3 "
              f"{geo['three']:.2f}x; load {os.getloadavg()[0]:.1f} at the end.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
