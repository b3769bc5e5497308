"""Device time of jitted calls on a TPU, from the jax profiler's trace (not wall clock).

``device_time(fn, *args)`` runs ``fn`` (a ``jax.jit`` function) a few times to warm up,
then ``iters`` times inside ``jax.profiler.trace(..., create_perfetto_trace=True)``, and
reads the trace's events on the TPU: the ``XLA Modules`` thread of the ``/device:TPU:0``
process, one event per executed module, named after the jitted function. Returns the
median duration in seconds. Used by ``pipeline_on_tpu.py`` (and the chip's
calibration); needs a TPU as jax's default backend.
"""

from __future__ import annotations

import gzip
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import jax


def _trace_events(log_dir: Path) -> list[dict[str, Any]]:
    [path] = sorted(log_dir.rglob("perfetto_trace.json.gz"))[-1:] or [None]
    if path is None:
        found = [str(p.relative_to(log_dir)) for p in log_dir.rglob("*")]
        raise RuntimeError(f"no perfetto_trace.json.gz in the profile: {found}")
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def module_durations(events: list[dict[str, Any]], name: str) -> list[float]:
    """Durations (seconds) of the TPU's ``XLA Modules`` events whose name contains
    ``name``, in trace order."""
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    tpu = {pid for pid, pname in processes.items() if "/device:TPU:0" in pname}
    found = [e for e in events if e.get("ph") == "X" and e.get("pid") in tpu
             and threads.get((e["pid"], e.get("tid"))) == "XLA Modules"
             and name in e.get("name", "")]
    return [float(e["dur"]) * 1e-6 for e in sorted(found, key=lambda e: e["ts"])]


def device_time(fn: Any, *args: Any, iters: int = 20, warmup: int = 3) -> float:
    """Median device time (seconds) of ``fn(*args)`` on the TPU."""
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "__wrapped__", None),
                                                    "__name__", "")
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _ in range(iters):
                jax.block_until_ready(fn(*args))
        durations = module_durations(_trace_events(Path(tmp)), name)
    if len(durations) < iters:
        raise RuntimeError(f"{len(durations)} device events named {name!r} for {iters} calls")
    return statistics.median(durations[-iters:])
