"""How often palladium's approximation agrees with the TPU compiler on "does this kernel
compile and fit on chip X".

Every kernel of ``compiler_corpus.py`` (a few hundred small ones at the boundaries the
compiler decides per generation) is run on each chip twice: with
``InterpretParams(chip=..., compile_check="compiler")`` (libtpu's verdict) and with
``compile_check="approximate"`` (jax's Mosaic lowering, palladium's rules and the
VMEM/SMEM count). A ``TpuLoweringError``, ``TpuResourceError`` or ``TpuCompilerError``
is "reject", a clean run "accept", a ``TpuLoweringWarning`` "could not decide". Any
other failure of the run is the interpreter's, not the checker's: the pair counts as an
accept and is listed.

Per chip: pairs, agreement, false accepts (the compiler rejects, the approximation runs
the kernel) by cause, and every false reject (the approximation rejects what the
compiler accepts: a bug). Needs libtpu (``pip install 'palladium-interpret[compiler]'``);
the compiler's verdicts are cached on disk (``$PALLADIUM_CACHE_DIR``), so a second run
mostly times the approximation.

    python benchmarks/compiler_agreement.py [--quick] [--chips v5e,v6e] [-k dot]
        [--save verdicts.json] [--show-false-accepts]
    python benchmarks/compiler_agreement.py --report verdicts.json   # tables again
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
from compiler_corpus import Case, corpus, held_out_cases  # noqa: E402

from palladium.interpret import (  # noqa: E402
    ConfigError,
    InterpretParams,
    TpuCompilerError,
    TpuLoweringError,
    TpuLoweringWarning,
    TpuResourceError,
)
from palladium.interpret.fidelity import tpu_compiler  # noqa: E402

CHIPS = ("v5e", "v6e", "v5p", "v4", "v7x")
REJECTIONS = (TpuLoweringError, TpuResourceError, TpuCompilerError)

#: A disagreement's cause, by the case's family.
CAUSES = {
    "dtype": "vector dtype", "reshape": "reshape", "transpose": "transpose",
    "slice": "slicing/layout", "mxu": "MXU dtypes", "block": "block shape",
    "vmem": "VMEM", "smem": "SMEM", "scalar": "scalar dtype in SMEM",
    "bool": "bool scratch", "grid": "grid semantics",
}


def verdict(case: Case, chip: str, check: str) -> tuple[str, str]:
    """("accept" | "reject" | "undecided" | "run failed", the message's gist)."""
    params = InterpretParams(chip=chip, compile_check=check)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TpuLoweringWarning)
        try:
            call, args = case.make(params)
            jax.block_until_ready(call(*args))
        except REJECTIONS as exc:
            return "reject", _gist(str(exc))
        except ConfigError as exc:
            return "run failed", f"{type(exc).__name__}: {_gist(str(exc))}"
        except Exception as exc:  # noqa: BLE001  (the interpreter's failure, listed)
            return "run failed", f"{type(exc).__name__}: {_gist(str(exc))}"
    for w in caught:
        if issubclass(w.category, TpuLoweringWarning):
            return "undecided", _gist(str(w.message))
    return "accept", ""


def _gist(message: str) -> str:
    """The checker's own words: the line after "says:", else the first line."""
    lines = message.splitlines()
    for i, line in enumerate(lines):
        if line.endswith("says:") and i + 1 < len(lines):
            return lines[i + 1][:200]
    return lines[0][:200] if lines else ""


def _select(cases: list[Case], quick: bool, patterns: list[str]) -> list[Case]:
    if patterns:
        cases = [c for c in cases if any(p in c.name for p in patterns)]
    if quick:
        cases = cases[::6]
    return cases


def _cases(opts: argparse.Namespace) -> list[Case]:
    return held_out_cases() if opts.held_out else corpus()


def _pairs(opts: argparse.Namespace) -> list[tuple[Case, str]]:
    chips = [c for c in opts.chips.split(",") if c]
    return [(case, chip) for case in _select(_cases(opts), opts.quick, opts.k)
            for chip in chips]


def _worker(opts: argparse.Namespace) -> int:
    """Print each pair's verdicts from pair ``opts.start`` on, one JSON line per verdict
    (the approximation's first: libtpu may abort the process while compiling)."""
    for n, (case, chip) in enumerate(_pairs(opts)):
        if n < opts.start:
            continue
        for check in ("approximate", "compiler"):
            found, says = verdict(case, chip, check)
            print(json.dumps({"pair": n, "check": check, "verdict": found, "says": says}),
                  flush=True)
        if n % 200 == 199:
            jax.clear_caches()
    return 0


def _run_workers(opts: argparse.Namespace, total: int) -> dict[int, dict[str, tuple]]:
    """Every pair's verdicts, from worker processes: when libtpu aborts one (it does,
    on some kernels: a failed CHECK in XLA's TPU backend), the compiler's verdict of that
    pair is "crashed" and a new worker goes on from the next pair."""
    found: dict[int, dict[str, tuple]] = collections.defaultdict(dict)
    start = 0
    argv = ["--chips", opts.chips, *(["--quick"] if opts.quick else []),
            *(["--held-out"] if opts.held_out else []),
            *[arg for k in opts.k for arg in ("-k", k)]]
    while start < total:
        proc = subprocess.Popen(
            [sys.executable, __file__, *argv, "--worker", "--start", str(start)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            got = json.loads(line)
            found[got["pair"]][got["check"]] = (got["verdict"], got["says"])
            if got["pair"] % 100 == 99 and got["check"] == "compiler":
                print(f"  {got['pair'] + 1}/{total} pairs", file=sys.stderr, flush=True)
        rc = proc.wait()
        done = [n for n, v in found.items() if len(v) == 2]
        start = max(done, default=-1) + 1
        if rc != 0 and start < total:
            found[start].setdefault("approximate", ("run failed", f"worker exited {rc}"))
            found[start]["compiler"] = ("crashed", f"libtpu aborted the process (exit {rc})")
            start += 1
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="every sixth kernel")
    parser.add_argument("--chips", default=",".join(CHIPS))
    parser.add_argument("-k", action="append", default=[], help="kernels whose name has this")
    parser.add_argument("--save", help="write every pair's verdicts to this JSON file")
    parser.add_argument("--show-false-accepts", action="store_true",
                        help="list every false accept with the compiler's words")
    parser.add_argument("--held-out", action="store_true",
                        help="the held-out kernels (written after the rules were learned) "
                        "instead of the corpus")
    parser.add_argument("--report", metavar="JSON", action="append", default=[],
                        help="print the tables of verdicts saved with --save (several files "
                        "merge, later ones replacing the pairs of earlier ones); no compiling")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.report:
        merged: dict[tuple[str, str], dict] = {}
        for path in opts.report:
            for row in json.loads(Path(path).read_text()):
                merged[(row["kernel"], row["chip"])] = row
        names = {c.name for c in _cases(opts)}
        rows = [r for r in merged.values() if r["kernel"] in names]
        chips = [c for c in opts.chips.split(",") if c]
        _report(rows, chips, opts.show_false_accepts)
        return 0
    if tpu_compiler.compiler_version() is None:
        # Not a failure of `nox -s bench` on a machine without the compiler.
        print(f"skipped: this benchmark asks the TPU compiler (libtpu): "
              f"{tpu_compiler.INSTALL_COMMAND}")
        return 0
    if opts.worker:
        return _worker(opts)
    pairs = _pairs(opts)
    chips = [c for c in opts.chips.split(",") if c]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    print(f"{len(pairs) // max(len(chips), 1)} kernels x {len(chips)} chips; "
          f"{tpu_compiler.checker_name()}; code of {commit or 'unknown'}", flush=True)
    start = time.perf_counter()
    found = _run_workers(opts, len(pairs))
    rows = []
    for n, (case, chip) in enumerate(pairs):
        compiler = found[n].get("compiler", ("crashed", "no verdict"))
        approx = found[n].get("approximate", ("run failed", "no verdict"))
        rows.append({"kernel": case.name, "family": case.family, "chip": chip,
                     "compiler": compiler[0], "compiler_says": compiler[1],
                     "approximation": approx[0], "approximation_says": approx[1]})
    _report(rows, chips, opts.show_false_accepts)
    print(f"\n({len(rows)} pairs in {time.perf_counter() - start:.0f} s)")
    if opts.save:
        Path(opts.save).write_text(json.dumps(rows, indent=1))
    return 0


def _accepts(v: str) -> bool:
    return v in ("accept", "run failed")


def _report(rows: list[dict], chips: list[str], show_false_accepts: bool) -> None:
    print()
    print("| chip | pairs | agree | false accepts (by cause) | false rejects | not compared |")
    print("|---|---|---|---|---|---|")
    false_rejects = []
    false_accepts = []
    for chip in chips:
        mine = [r for r in rows if r["chip"] == chip]
        decided = [r for r in mine if not {"undecided", "crashed"} & {
            r["compiler"], r["approximation"]}]
        agree = sum(_accepts(r["compiler"]) == _accepts(r["approximation"]) for r in decided)
        fa = [r for r in decided if not _accepts(r["compiler"]) and _accepts(r["approximation"])]
        fr = [r for r in decided if _accepts(r["compiler"]) and not _accepts(r["approximation"])]
        false_accepts += fa
        false_rejects += fr
        causes = collections.Counter(CAUSES[r["family"]] for r in fa)
        by_cause = ", ".join(f"{cause} {n}" for cause, n in causes.most_common()) or "-"
        pct = 100 * agree / len(decided) if decided else 100.0
        print(f"| {chip} | {len(mine)} | {agree}/{len(decided)} ({pct:.1f}%) | "
              f"{len(fa)}: {by_cause} | {len(fr)} | {len(mine) - len(decided)} |")
    print()
    print(f"False rejects ({len(false_rejects)}):" if false_rejects else "False rejects: none")
    for r in false_rejects:
        print(f"- {r['chip']} `{r['kernel']}`: {r['approximation_says']}")
    failed = [r for r in rows if "run failed" in (r["compiler"], r["approximation"])]
    if failed:
        print(f"\nAccepted, then the interpreter failed ({len(failed)} pairs):")
        for r in failed:
            says = r["compiler_says"] if r["compiler"] == "run failed" else r["approximation_says"]
            print(f"- {r['chip']} `{r['kernel']}`: {says}")
    undecided = [r for r in rows if {"undecided", "crashed"} & {
        r["compiler"], r["approximation"]}]
    if undecided:
        print(f"\nNot compared: could not decide, or libtpu crashed ({len(undecided)} pairs):")
        for r in undecided:
            print(f"- {r['chip']} `{r['kernel']}`: compiler {r['compiler']}, approximation "
                  f"{r['approximation']}")
    if show_false_accepts:
        print(f"\nFalse accepts ({len(false_accepts)}):")
        for r in false_accepts:
            print(f"- {r['chip']} `{r['kernel']}`: {r['compiler_says']}")


if __name__ == "__main__":
    sys.exit(main())
