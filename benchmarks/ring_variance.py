"""Why one process's steady calls of the 256-device ring all-gather take 3 to 8 s of CPU:
the work of each call, and the speed of the machine measured inside the call.

    XLA_FLAGS=--xla_force_host_platform_device_count=257 JAX_PLATFORMS=cpu \\
        python benchmarks/ring_variance.py --devices 256 --calls 8

Per steady call (races off, default ``InterpretParams``), one line:

- ``cpu``: the process's CPU time (user/system), as the lead's script measures it;
- ``run``: the CPU time of the thread that runs ``Scheduler.run`` (the simulated cores),
  with its involuntary context switches and minor faults (``RUSAGE_THREAD``);
- the work: greenlet switches (``Scheduler._handoff``), the bytes of C stack greenlet
  copies back per switch (``greenlet._stack_saved`` of the core switched to), garbage
  collections and their time;
- ``phases``: the run's CPU in ten slices of equal switch counts (min-max): a slow call
  whose every slice is slow is slow throughout, not an event;
- probes run inside the call every ``--probe-every`` switches, in the same thread: a
  fixed pure-Python loop (``py``: core speed) and a fixed walk over 40k Python objects
  spread over ~50 MB (``walk``: the cache and memory path the simulated cores need).
  ``run/walk`` constant while ``run`` varies: the machine varies, not the process.
  The probes' time is taken out of ``cpu`` and ``run``.

``--rows``: the rows of each device's block (8: the benchmark's 4 KiB; 1: 512 B), to see
whether the DMAs' data matters. Scheduler methods are wrapped in this process only.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


class Probes:
    """Fixed work to time inside a call: a pure-Python loop and a walk over objects."""

    def __init__(self) -> None:
        self.objects: list[list[int]] = []
        self.spread: list[bytes] = []  # allocated in between: keeps the objects apart
        for i in range(40_000):
            self.objects.append([i])
            self.spread.append(bytes(1200))
        random.Random(0).shuffle(self.objects)
        self.py: list[float] = []
        self.walk: list[float] = []

    def run(self) -> float:
        t = time.thread_time()
        d: dict[int, int] = {}
        for i in range(40_000):
            d[i & 255] = i
        t1 = time.thread_time()
        s = 0
        for o in self.objects:
            s += o[0]
        t2 = time.thread_time()
        self.py.append(t1 - t)
        self.walk.append(t2 - t1)
        return t2 - t


class Watch:
    """Wraps ``Scheduler.run`` and ``Scheduler._handoff`` to count one call's work."""

    def __init__(self, scheduler_cls: type, probes: Probes | None, every: int) -> None:
        self.probes, self.every = probes, every
        self.reset()
        run, handoff = scheduler_cls.run, scheduler_cls._handoff
        watch = self

        def wrapped_run(sched: object, bodies: dict) -> None:
            watch.mark()
            run(sched, bodies)
            watch.mark()

        def wrapped_handoff(sched: object, task: object, nxt: object) -> None:
            watch.switches += 1
            watch.restored += nxt.glet._stack_saved  # type: ignore[attr-defined]
            if watch.switches % watch.slice == 0:
                watch.mark()
            if watch.probes is not None and watch.switches % watch.every == 0:
                watch.probe_cpu += watch.probes.run()
            handoff(sched, task, nxt)

        scheduler_cls.run = wrapped_run  # type: ignore[method-assign]
        scheduler_cls._handoff = wrapped_handoff  # type: ignore[method-assign]
        gc.callbacks.append(self._gc)

    def reset(self, slice_: int = 1 << 62) -> None:
        self.switches = self.restored = 0
        self.slice = slice_
        self.marks: list[tuple[float, int, int, float]] = []
        self.probe_cpu = 0.0
        self.gcs: list[float] = []
        if self.probes is not None:
            self.probes.py.clear()
            self.probes.walk.clear()

    def mark(self) -> None:
        r = resource.getrusage(resource.RUSAGE_THREAD)
        self.marks.append((r.ru_utime + r.ru_stime, r.ru_nivcsw, r.ru_minflt, self.probe_cpu))

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.gcs.append(time.thread_time())
        elif self.gcs:
            self.gcs[-1] = time.thread_time() - self.gcs[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=256)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--probe-every", type=int, default=10_000)
    ap.add_argument("--no-probes", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(HERE, os.pardir, "examples"))
    import collectives
    import numpy as np

    import palladium.interpret as pi
    from palladium.shared_memory.scheduler import Scheduler

    rows = args.rows
    collectives.inputs = lambda name, n: collectives.iota((n * rows, 128)) % 251
    from _harness import collective

    probes = None if args.no_probes else Probes()
    watch = Watch(Scheduler, probes, args.probe_every)
    f, x, expected = collective("all_gather", args.devices, pi.InterpretParams(),
                                pi.force_tpu_interpret_mode)
    t = time.perf_counter()
    first = f(x)
    first.block_until_ready()
    print(f"first call {time.perf_counter() - t:.1f} s wall, correct "
          f"{np.array_equal(np.asarray(first), expected)}", flush=True)
    del first
    watch.reset()
    f(x).block_until_ready()  # counts one call's switches, to cut the run in ten slices
    per_call = watch.switches
    for _ in range(args.calls):
        watch.reset(max(per_call // 10 + 1, 1))  # ten slices (the tenth a little short)
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        c0 = time.process_time()
        f(x).block_until_ready()
        cpu = time.process_time() - c0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        m = watch.marks
        run = m[-1][0] - m[0][0] - (m[-1][3] - m[0][3])
        phases = [b[0] - a[0] - (b[3] - a[3]) for a, b in zip(m, m[1:])]
        pc = watch.probe_cpu
        line = (f"cpu {cpu - pc:.2f} (user {r1.ru_utime - r0.ru_utime - pc:.2f} sys "
                f"{r1.ru_stime - r0.ru_stime:.2f}, {r1.ru_minflt - r0.ru_minflt} faults) "
                f"run {run:.2f} ({m[-1][1] - m[0][1]} preempted, {m[-1][2] - m[0][2]} faults) "
                f"switches {watch.switches} stack {watch.restored / max(watch.switches, 1):.0f} "
                f"B/switch gc {len(watch.gcs)} {sum(watch.gcs):.2f} s phases "
                f"{min(phases):.2f}-{max(phases):.2f}")
        if probes is not None and probes.py:
            py, walk = statistics.median(probes.py) * 1e3, statistics.median(probes.walk) * 1e3
            line += f" py {py:.2f} ms walk {walk:.2f} ms run/py {run / py:.2f} run/walk {run / walk:.3f}"
        print(f"{line} load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
