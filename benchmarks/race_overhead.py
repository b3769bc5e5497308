"""Races off vs on, CPU seconds per steady call, and the race detector's calls timed in place.

    python benchmarks/race_overhead.py jax_all_gather 64 7          # off / on medians
    python benchmarks/race_overhead.py jax_all_gather 64 5 --inplace # + detector time per call
    python benchmarks/race_overhead.py jax_all_gather 64 5 --stub    # a DMA's calls do nothing
    python benchmarks/race_overhead.py jax_all_gather 64 5 --collect # on_race="collect"
    python benchmarks/race_overhead.py jax_all_gather 64 5 --first   # no memo: every call
                                                                      # detects (and records)

Each call's CPU time is ``time.process_time`` of this process (the machine is shared:
wall time is not a measure). ``--inplace`` wraps every public ``RaceDetector`` method with
a CPU timer (~1 us each, included) and prints, per steady race-on call, the detector's
total and its biggest methods. Run with ``XLA_FLAGS=--xla_force_host_platform_device_count=N+1``
(``device_scaling.py`` does it for its own workers).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
_TIMED = ("new_actor", "read_release", "write_release", "acquire_all", "read", "write",
          "release", "finish_release", "acquire", "join", "barrier", "finish",
          "register_buffer", "free_buffers")


def main(argv: list[str]) -> int:
    name, n, repeats = argv[0], int(argv[1]), int(argv[2])
    inplace = "--inplace" in argv
    stub = "--stub" in argv
    on_race = "collect" if "--collect" in argv else "raise"
    first = "--first" in argv
    sys.path.insert(0, HERE)
    import numpy as np
    from _harness import collective

    import palladium.interpret as pi
    from palladium.race_detect import detector as module

    spent: dict[str, float] = defaultdict(float)
    if inplace:
        clock = time.process_time

        def timer(original: Any, label: str) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                t0 = clock()
                try:
                    return original(*args, **kwargs)
                finally:
                    spent[label] += clock() - t0
            return call

        def timed(method: str) -> Any:
            return timer(getattr(module.RaceDetector, method), method)

        timed.__wrapped__ = timer  # type: ignore[attr-defined]

        for method in _TIMED:
            setattr(module.RaceDetector, method, timed(method))
        deferred = getattr(module, "DeferredDetector", None)
        if deferred is None:
            with contextlib.suppress(ImportError):
                from palladium.race_detect.deferred import DeferredDetector as deferred
        if deferred is not None:  # its recording calls, and its replay (``flush``)
            for method in (*_TIMED, "flush"):
                if method in vars(deferred):
                    original = vars(deferred)[method]
                    wrapped = timed.__wrapped__(original, "deferred " + method)  # type: ignore[attr-defined]
                    setattr(deferred, method, wrapped)
    if stub:  # the floor: a DMA's four detector calls do nothing (no detection)
        sentinel = module.RaceDetector.new_actor

        def new_actor(self: Any, name: str, parent: Any = None) -> Any:
            return parent if parent is not None else sentinel(self, name)

        module.RaceDetector.new_actor = new_actor  # type: ignore[method-assign]
        for method in ("read_release", "write_release", "acquire_all"):
            setattr(module.RaceDetector, method, lambda self, *a, **k: None)
    collecting = [0.0, 0.0]  # seconds in the collector during the current call

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collecting[1] = time.process_time()
        else:
            collecting[0] += time.process_time() - collecting[1]

    gc.callbacks.append(on_gc)
    if first:  # every launch is a kernel's first: nothing remembered, detected eagerly
        with contextlib.suppress(ImportError):
            from palladium.race_detect.memo import RaceMemo

            RaceMemo.get = lambda self, key: None  # type: ignore[method-assign]
    fs, x = {}, None
    for key, params in (("off", pi.InterpretParams()),
                        ("on", pi.InterpretParams(detect_races=True, on_race=on_race))):
        fs[key], x, expected = collective(name, n, params, pi.force_tpu_interpret_mode)
    firsts = {}
    correct = True
    for key, f in fs.items():  # the first call (traces, compiles, no memo yet)
        t0 = time.process_time()
        correct = correct and bool(np.array_equal(np.asarray(f(x)), expected))
        firsts[key] = round(time.process_time() - t0, 3)
    times: dict[str, list[float]] = {"off": [], "on": []}
    gcs: dict[str, list[float]] = {"off": [], "on": []}
    detector: list[float] = []
    items: list[dict[str, float]] = []
    for _ in range(repeats):
        for key, f in fs.items():
            spent.clear()
            collecting[0] = 0.0
            t0 = time.process_time()
            f(x).block_until_ready()
            times[key].append(time.process_time() - t0)
            gcs[key].append(collecting[0])
            if key == "on" and inplace:
                # (a deferred detector's flush contains the calls it replays: not twice)
                own = {k: v for k, v in spent.items() if not k.startswith("deferred ")}
                recorded = sum(v for k, v in spent.items()
                               if k.startswith("deferred ") and k != "deferred flush")
                detector.append(sum(own.values()) + recorded)
                items.append(dict(sorted(spent.items(), key=lambda kv: -kv[1])[:7]))
    out: dict[str, Any] = {
        "kernel": name, "n": n, "correct": correct, "on_race": on_race, "first": first,
        "first_off": firsts["off"], "first_on": firsts["on"],
        "off": statistics.median(times["off"]), "on": statistics.median(times["on"]),
        "off_all": [round(t, 3) for t in times["off"]],
        "on_all": [round(t, 3) for t in times["on"]]}
    out["ratio"] = out["on"] / out["off"]
    out["gc_off"] = round(statistics.median(gcs["off"]), 4)
    out["gc_on"] = round(statistics.median(gcs["on"]), 4)
    if inplace:
        out["detector_all"] = [round(t, 3) for t in detector]
        out["detector"] = statistics.median(detector)
        out["items_last"] = {k: round(v, 3) for k, v in items[-1].items()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
