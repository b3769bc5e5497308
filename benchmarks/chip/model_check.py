"""palladium's predictions against the chip's device times, kernel by kernel.

Predicts every kernel of ``calibration_kernels.py`` with ``palladium.interpret.predict``
(``chip="v5e"``) on this CPU and compares it with the chip's time in
``benchmarks/results_tpu/calibration.v5e.json``::

    python benchmarks/chip/model_check.py [--only heldout] [--json out.json]
    python benchmarks/chip/model_check.py --only heldout4 --before-chip out.json

``--before-chip`` predicts the kernels the chip has not run yet and writes the
predictions (with the commit and the time), to be committed before they are measured.

Reported: per kernel the prediction, the chip's time and the error (predicted / chip
- 1) and predict's CPU seconds; per group the share within 10% and the geometric-mean
error; per sweep Kendall's tau of the predicted against the measured order and how far
the predicted best configuration's measured time is from the measured best.

Run it with libtpu installed (``pip install 'palladium-interpret[compiler]'``): ``predict``
then takes each program's operands where XLA places them (``Prediction.placement``,
recorded per kernel), as on the chip; without it every operand is taken to be in HBM.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_kernels as ck  # noqa: E402

import palladium.interpret as pi  # noqa: E402
from palladium.interpret.tune.sweep_result import kendall_tau  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--measured", default=str(ROOT / "benchmarks/results_tpu/calibration.v5e.json"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--before-chip", default=None,
                    help="write the predictions of the kernels not measured yet here")
    a = ap.parse_args()
    measured = json.loads(Path(a.measured).read_text())["kernels"]
    # every later round's file, in order (a kernel measured again: its latest time)
    later = sorted(Path(a.measured).parent.glob(Path(a.measured).name.replace(
        "calibration.", "calibration[0-9]*.")), key=lambda p: int(p.name.split(".")[0][11:]))
    for path in later:
        measured.update(json.loads(path.read_text())["kernels"])
    if a.before_chip:
        _before_chip(a.only, measured, Path(a.before_chip))
        return
    rows = {}
    for name in ck.names(a.only):
        m = measured.get(name, {})
        if not m.get("seconds"):
            continue
        p, cpu = _predict(name)
        chip_s = m.get("kernel_seconds") or m["seconds"]
        rows[name] = {"group": ck.ENTRIES[name].group, "predicted": p.predicted_seconds,
                      "chip": chip_s, "error": p.predicted_seconds / chip_s - 1,
                      "bound": p.bound, "cpu_s": cpu, "placement": p.placement}
        r = rows[name]
        print(f"{name:48s} pred {r['predicted'] * 1e6:10.2f} chip {chip_s * 1e6:10.2f} "
              f"{r['error']:+7.1%} {p.bound:18s} {cpu:5.1f}s", flush=True)
    groups: dict[str, list[float]] = {}
    for r in rows.values():
        groups.setdefault(r["group"].split(":")[0], []).append(r["error"])
    for g, errs in groups.items():
        within = sum(abs(e) <= 0.10 for e in errs)
        gm = math.exp(sum(abs(math.log1p(e)) for e in errs) / len(errs)) - 1
        print(f"{g:10s} {within}/{len(errs)} within 10%, geometric-mean error {gm:.1%}, "
              f"worst {min(errs):+.1%} / {max(errs):+.1%}")
    sweeps: dict[str, list[dict]] = {}
    for r in rows.values():
        if r["group"].startswith("sweep:"):
            sweeps.setdefault(r["group"], []).append(r)
    for g, rs in sweeps.items():
        tau = kendall_tau([r["predicted"] for r in rs], [r["chip"] for r in rs])
        best = min(rs, key=lambda r: r["predicted"])
        gap = best["chip"] / min(r["chip"] for r in rs) - 1
        print(f"{g:24s} tau {tau:+.2f}, predicted best is {gap:.1%} from the measured best")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


def _predict(name: str) -> tuple[pi.Prediction, float]:
    """``name``'s prediction on the v5e and the CPU seconds it took."""
    fn, args = ck.ENTRIES[name].make()
    t0 = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = pi.predict(fn, *args, chip="v5e", compile_check="off")
    return p, time.process_time() - t0


def _before_chip(only: str, measured: dict, out: Path) -> None:
    import datetime
    import subprocess

    kernels = {}
    for name in ck.names(only):
        if measured.get(name, {}).get("seconds"):
            continue
        p, cpu = _predict(name)
        kernels[name] = {"predicted": p.predicted_seconds, "bound": p.bound, "cpu_s": cpu,
                         "placement": p.placement}
        print(f"{name:48s} pred {p.predicted_seconds * 1e6:10.2f} {p.bound}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    out.write_text(json.dumps({
        "predicted_at": datetime.datetime.now(datetime.UTC).isoformat(
            timespec="seconds"), "commit": commit, "chip": "v5e", "kernels": kernels},
        indent=1) + "\n")


if __name__ == "__main__":
    main()
