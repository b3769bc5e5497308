"""``measure``: a kernel's time on a real TPU, from the jax profiler's trace.

Where a TPU is jax's default backend, :func:`measure` runs a function (a ``jax.jit``
function, or any callable: it is jitted under a name of its own) a few times to warm up,
then ``iters`` times inside ``jax.profiler.trace(..., create_perfetto_trace=True)``, and
reads the device's own events: the ``XLA Modules`` thread of the ``/device:TPU:0``
process, one event per executed program, named after the jitted function. Wall clock
would add dispatch and host time the chip never spends. The median is the answer;
every sample is kept. ``sweep(..., measure=True)`` puts it beside the prediction, and
the chip's calibration (benchmarks/) uses the same harness.

Measured on a TPU v5e (2026-12-05, jax 0.10.2): the median of 20 calls repeats to
within 0.1% between runs for kernels of 20 us to 0.5 ms (benchmarks/README.md, "The
pipeline on a TPU v5e").
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from palladium.interpret.errors import ConfigError

__all__ = ["Measurement", "measure", "module_durations"]

#: Why :func:`measure` cannot run here.
NO_TPU = ("measure() times a kernel on a TPU, and jax's default backend here is {backend!r}; "
          "on a machine without a TPU use predict() or sweep() for a predicted time")

_NAMES = itertools.count()


@dataclasses.dataclass(frozen=True)
class Measurement:
    """A kernel's device time on a TPU: ``seconds`` is the median of ``samples``."""

    seconds: float
    samples: tuple[float, ...]
    device_kind: str

    def __str__(self) -> str:
        spread = (max(self.samples) - min(self.samples)) / self.seconds if self.seconds else 0
        return (f"{self.seconds * 1e6:.1f} us on {self.device_kind} (median of "
                f"{len(self.samples)}, spread {spread:.1%})")


def module_durations(events: list[dict[str, Any]], name: str) -> list[float]:
    """Durations (seconds), in trace order, of the events of the ``XLA Modules`` thread
    of the ``/device:TPU:0`` process that ran the jitted function named ``name`` (Chrome
    trace-event records, as jax's Perfetto trace holds them). jax names that program
    ``jit_<name>(<fingerprint>)`` with ``name``'s trailing underscores dropped (seen on a
    v5e, jax 0.10.2: ``calib_0_`` ran as ``jit_calib_0(2126091101726819190)``)."""
    program = f"jit_{name.rstrip('_')}"
    processes = {e["pid"]: e.get("args", {}).get("name", "") for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e.get("args", {}).get("name", "") for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    tpu = {pid for pid, pname in processes.items() if "/device:TPU:0" in pname}
    found = [e for e in events if e.get("ph") == "X" and e.get("pid") in tpu
             and threads.get((e["pid"], e.get("tid"))) == "XLA Modules"
             and (e.get("name", "") == program
                  or e.get("name", "").startswith(program + "("))]
    return [float(e["dur"]) * 1e-6 for e in sorted(found, key=lambda e: e["ts"])]


def _trace_events(log_dir: Path) -> list[dict[str, Any]]:
    paths = sorted(log_dir.rglob("perfetto_trace.json.gz"))
    if not paths:
        found = sorted(str(p.relative_to(log_dir)) for p in log_dir.rglob("*"))
        raise RuntimeError(f"the profiler wrote no perfetto_trace.json.gz: {found}")
    with gzip.open(paths[-1], "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def measure(fn: Callable[..., Any], *args: Any, iters: int = 20,
            warmup: int = 3) -> Measurement:
    """Time ``fn(*args)`` on the TPU: device time from the jax profiler's trace.

    ``fn`` runs ``warmup`` times (compiles), then ``iters`` times traced. Raises
    :class:`~palladium.interpret.ConfigError` where jax's default backend is not a TPU.
    """
    backend = jax.default_backend()
    if backend != "tpu":
        raise ConfigError(NO_TPU.format(backend=backend))
    if iters < 1:
        raise ConfigError(f"measure(iters={iters}): at least one timed call is needed")

    def call(*a: Any) -> Any:
        return fn(*a)

    # A name no other program of the trace has: the events are found by it.
    call.__name__ = call.__qualname__ = f"palladium_measure_{next(_NAMES)}"
    jitted = jax.jit(call)
    for _ in range(warmup):
        jax.block_until_ready(jitted(*args))
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _ in range(iters):
                jax.block_until_ready(jitted(*args))
        durations = module_durations(_trace_events(Path(tmp)), call.__name__)
    if len(durations) < iters:
        raise RuntimeError(f"the trace has {len(durations)} device events of "
                           f"{call.__name__!r} for {iters} calls")
    samples = tuple(durations[-iters:])
    return Measurement(statistics.median(samples), samples, jax.devices()[0].device_kind)
