"""palladium's steady time at two commits, in one run: is a change free?

For refactors that must not slow anything down (issue 22: "benchmarks before/after in
one run"). The base commit is checked out into a temporary git worktree; every kernel of
``kernel_cases.py`` then runs under palladium in a fresh subprocess per commit and round,
with ``PYTHONPATH`` pointing at that commit's four ``src`` folders (so the installed
palladium is never used), alternating base and head so that load drifts hit both alike.
Each subprocess reports the median of its steady calls; the table gives the median over
rounds and the ratio head / base (< 1: head is faster).

    python benchmarks/compare_commits.py --base e099a50                # every kernel
    python benchmarks/compare_commits.py --base e099a50 -k paged -k gmm --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PACKAGES = ("race-detect", "shared-memory", "interpret", "pipeline")


def worker(name: str, races: bool, calls: int) -> dict:
    sys.path.insert(0, HERE)
    import jax
    import kernel_cases

    import palladium.interpret as pi

    case = next(c for c in kernel_cases.all_cases() if c.name == name)
    fn, args = case.make()
    f = jax.jit(fn)
    times = []
    with pi.force_tpu_interpret_mode(pi.InterpretParams(detect_races=races)):
        jax.block_until_ready(f(*args))
        for _ in range(calls):
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args))
            times.append(time.perf_counter() - t0)
    return {"steady_ms": 1e3 * statistics.median(times), "src": pi.__file__}


def _run(src_root: str, name: str, races: bool, calls: int) -> float:
    path = os.pathsep.join(os.path.join(src_root, "packages", p, "src") for p in PACKAGES)
    env = dict(os.environ, PYTHONPATH=path, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, __file__, "--worker", name, str(int(races)),
                          str(calls)], capture_output=True, text=True, env=env, timeout=900,
                         check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    if not result["src"].startswith(src_root):
        raise RuntimeError(f"ran {result['src']}, not the code of {src_root}")
    return float(result["steady_ms"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--head", default=None, help="a commit (default: the work tree)")
    parser.add_argument("-k", action="append", default=[], help="kernels whose name has this")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5, help="steady calls per subprocess")
    parser.add_argument("--races", action="store_true", help="races on")
    opts = parser.parse_args(argv)
    sys.path.insert(0, HERE)
    import kernel_cases

    names = [c.name for c in kernel_cases.all_cases()
             if not opts.k or any(k in c.name for k in opts.k)]
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for label, commit in (("base", opts.base), ("head", opts.head)):
            if commit is None:
                trees[label] = ROOT
                continue
            tree = os.path.join(tmp, label)
            subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", tree,
                            commit], check=True)
            trees[label] = tree
        try:
            print(f"| kernel | base {opts.base} ms | head {opts.head or 'work tree'} ms | "
                  "head / base |")
            print("|---|---|---|---|")
            ratios = []
            for name in names:
                got: dict[str, list[float]] = {"base": [], "head": []}
                for _ in range(opts.rounds):
                    for label in ("base", "head"):
                        got[label].append(_run(trees[label], name, opts.races, opts.calls))
                base, head = (statistics.median(got[x]) for x in ("base", "head"))
                ratios.append(head / base)
                print(f"| {name} | {base:.1f} | {head:.1f} | {head / base:.2f}x |", flush=True)
            geo = statistics.geometric_mean(ratios)
            print(f"\nGeometric mean head / base: {geo:.3f}x")
        finally:
            for tree in trees.values():
                if tree != ROOT:
                    subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree],
                                   check=False)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(worker(sys.argv[2], bool(int(sys.argv[3])), int(sys.argv[4]))))
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
