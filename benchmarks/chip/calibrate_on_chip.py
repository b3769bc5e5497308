"""Times every kernel of ``calibration_kernels.py`` on a TPU: device time from the trace.

Run on a TPU VM (PYTHONPATH with packages/*/src)::

    python benchmarks/chip/calibrate_on_chip.py --out calibration.v5e.json [--only micro]

Every kernel is compiled and warmed up first, then run ``--iters`` times inside one
``jax.profiler.trace`` per batch; its time is the median duration of its program's
events on the ``XLA Modules`` thread of ``/device:TPU:0`` (what
``palladium.interpret.measure`` reads), and ``kernel_seconds`` the median summed
duration of the Mosaic kernels (the ``XLA Ops`` events inside the program whose name
says it is a custom call / Mosaic kernel) without the wrapper's own XLA ops. The JSON is
rewritten after each batch, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_kernels as ck  # noqa: E402


def _events(log_dir: Path) -> list[dict]:
    paths = sorted(log_dir.rglob("perfetto_trace.json.gz"))
    with gzip.open(paths[-1], "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def _device_events(events: list[dict]) -> tuple[list[dict], list[dict]]:
    procs = {e["pid"]: e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e.get("args", {}).get("name", "") for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    tpu = {pid for pid, name in procs.items() if "/device:TPU:0" in name}
    modules, ops = [], []
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in tpu:
            continue
        thread = threads.get((e["pid"], e.get("tid")), "")
        if thread == "XLA Modules":
            modules.append(e)
        elif thread == "XLA Ops":
            ops.append(e)
    return modules, ops


def _is_kernel(op: dict) -> bool:
    text = (op.get("name", "") + " " + json.dumps(op.get("args", {}))).lower()
    return "custom-call" in text or "custom_call" in text or "mosaic" in text


def measure_batch(batch: list[tuple[str, object, tuple]], iters: int) -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _tag, jitted, args in batch:
                for _ in range(iters):
                    jax.block_until_ready(jitted(*args))
        events = _events(Path(tmp))
        modules, ops = _device_events(events)
    out: dict[str, dict] = {"_debug": {
        "modules": sorted({m.get("name", "") for m in modules})[:60],
        "processes": sorted({e.get("args", {}).get("name", "") for e in events
                             if e.get("name") == "process_name"})[:40],
        "threads": sorted({e.get("args", {}).get("name", "") for e in events
                           if e.get("name") == "thread_name"})[:60],
        "n_events": len(events)}}
    # The calls ran one kernel after the other, ``iters`` each. Kernels whose programs
    # are the same (jax's paged attention at two lengths: only values differ) share one
    # executable and its module name, so the runs are split by their order when every
    # call is there; else matched by name.
    ours = sorted((m for m in modules if m.get("name", "").startswith("jit_calib_")),
                  key=lambda e: e["ts"])
    in_order = len(ours) == iters * len(batch)
    for k, (tag, _, _) in enumerate(batch):
        mine = (ours[k * iters:(k + 1) * iters] if in_order else
                sorted((m for m in modules if m.get("name", "").startswith(f"jit_{tag}(")),
                       key=lambda e: e["ts"]))
        durs = [m["dur"] * 1e-6 for m in mine]
        kernel, last_ops = [], []
        for m in mine:
            inside = [o for o in ops if m["ts"] <= o["ts"] <= m["ts"] + m["dur"]]
            kernel.append(sum(o["dur"] for o in inside if _is_kernel(o)) * 1e-6)
            last_ops = [(o.get("name", ""), o["dur"] * 1e-6, _is_kernel(o)) for o in inside]
        out[tag] = {
            "seconds": statistics.median(durs) if durs else None,
            "samples": durs,
            "kernel_seconds": statistics.median(kernel) if kernel else None,
            "ops_of_last_call": last_ops[:40],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="a group prefix: micro, heldout, sweep")
    ap.add_argument("--names", nargs="*", default=None)
    ap.add_argument("--prefix", nargs="*", default=None, help="kernels whose names start so")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--batch", type=int, default=24)
    a = ap.parse_args()
    names = a.names or ck.names(a.only)
    if a.prefix:
        names = [n for n in names if n.startswith(tuple(a.prefix))]
    import importlib.metadata as md
    result = {
        "chip": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "libtpu": next((md.version(p) for p in ("libtpu", "libtpu-nightly")
                        if _installed(md, p)), "?"),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "script": "benchmarks/chip/calibrate_on_chip.py",
        "iters": a.iters,
        "kernels": {},
    }
    t_start = time.time()
    for lo in range(0, len(names), a.batch):
        batch = []
        for i, name in enumerate(names[lo:lo + a.batch]):
            entry = ck.ENTRIES[name]
            tag = f"calib_{lo + i}"
            try:
                fn, args = entry.make()

                def call(*xs, fn=fn):
                    return fn(*xs)
                call.__name__ = call.__qualname__ = tag
                jitted = jax.jit(call)
                t0 = time.time()
                jax.block_until_ready(jitted(*args))
                compile_s = time.time() - t0
                jax.block_until_ready(jitted(*args))
                batch.append((tag, jitted, args))
                result["kernels"][name] = {"group": entry.group, "meta": _plain(entry.meta),
                                           "tag": tag, "first_call_wall_s": compile_s}
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                result["kernels"][name] = {"group": entry.group, "meta": _plain(entry.meta),
                                           "error": f"{type(e).__name__}: {e}"[:2000],
                                           "trace": traceback.format_exc()[-3000:]}
        if batch:
            try:
                times = measure_batch(batch, a.iters)
            except Exception as e:  # noqa: BLE001
                times = {t: {"error": f"measure: {type(e).__name__}: {e}"[:500]}
                         for t, _, _ in batch}
            result.setdefault("debug", []).append(times.pop("_debug", None))
            for name in names[lo:lo + a.batch]:
                rec = result["kernels"][name]
                if "tag" in rec:
                    rec.update(times.get(rec["tag"], {}))
        del batch
        jax.clear_caches()
        result["elapsed_s"] = time.time() - t_start
        Path(a.out).write_text(json.dumps(result, indent=1))
        print(f"{min(lo + a.batch, len(names))}/{len(names)} done, {time.time() - t_start:.0f} s",
              flush=True)


def _installed(md, name: str) -> bool:
    try:
        md.version(name)
        return True
    except md.PackageNotFoundError:
        return False


def _plain(meta: dict) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in meta.items()}


if __name__ == "__main__":
    main()
