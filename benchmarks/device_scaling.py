"""palladium's steady time and time per DMA vs the number of simulated devices.

Ring collectives of ``examples/collectives.py`` (``right_permute``: one remote DMA per
device; ``all_gather``: a ring of n-1 steps, n^2 DMAs in all) and jax's shipped
``jax.experimental.pallas.ops.tpu.all_gather`` (a bidirectional ring reusing one receive
semaphore per direction) under ``jit(shard_map)`` on N = 2 .. 64 simulated devices, then
right-permute and both all-gathers at 128 and 256 devices (do they complete, and in what
time), and the race detector's overhead on the three at 8..64 devices (races off and on
in one process, calls interleaved, medians). Each point runs in its own subprocess with N+1 host devices and a timeout (see
``interpret_multi_device.py``); the DMAs of one launch are counted by a launch observer
during the first call, so "per DMA" is steady time / DMAs. Flat "per DMA" means the
simulator's cost per DMA does not grow with the device count.

    python benchmarks/device_scaling.py                 # 2..64, then 128 and 256 (~6-10 min)
    python benchmarks/device_scaling.py --max 16        # 2..16 only (~1 min)
    python benchmarks/device_scaling.py --big 128       # also 128, not 256
    python benchmarks/device_scaling.py --max 0 --big --races 8 16 32 64   # race overhead only
    python benchmarks/device_scaling.py --max 0 --big --races --processes 1 2   # 1 vs 2 processes
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from _harness import cell, collective, in_subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = ("right_permute", "all_gather", "jax_all_gather")


def worker(name: str, n: int, repeats: int) -> dict:
    sys.path.insert(0, HERE)
    import interpret_multi_device

    from palladium.interpret.observe import observers
    from palladium.shared_memory import Observer

    class CountDmas(Observer):
        def __init__(self) -> None:
            self.dmas = 0

        def dma_start(self, dma) -> None:
            self.dmas += 1

    counted: list[CountDmas] = []

    def factory(info):  # the first launch only: steady calls run without an observer
        if counted:
            return None
        counted.append(CountDmas())
        return counted[0]

    observers.add_launch_observer(factory)
    result = interpret_multi_device.worker("palladium", name, n, repeats)
    result["dmas"] = counted[0].dmas if counted else 0
    return result


def races_worker(name: str, n: int, repeats: int) -> dict:
    """Steady time races off and on: both compiled first, then ``repeats`` interleaved
    rounds (one call of each per round), medians."""
    import numpy as np

    import palladium.interpret as pi

    fs, x = {}, None
    for key, params in (("off", pi.InterpretParams()),
                        ("on", pi.InterpretParams(detect_races=True))):
        fs[key], x, expected = collective(name, n, params, pi.force_tpu_interpret_mode)
    correct = all(bool(np.array_equal(np.asarray(f(x)), expected)) for f in fs.values())
    times: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(repeats):
        for key, f in fs.items():
            t0 = time.perf_counter()
            f(x).block_until_ready()
            times[key].append(time.perf_counter() - t0)
    return {"off": statistics.median(times["off"]), "on": statistics.median(times["on"]),
            "correct": correct}


def measure(name: str, n: int, repeats: int, timeout: float, races: bool = False) -> dict | None:
    flag = "--races-worker" if races else "--worker"
    return in_subprocess(__file__, [flag, name, str(n), str(repeats)], n, timeout)


def _cell(r: dict | None, timeout: float, per_dma: bool = True) -> str:
    s = cell(r, "steady", timeout)
    if per_dma and r is not None and "error" not in r and r["dmas"]:
        s += f" ({r['steady'] / r['dmas'] * 1e6:.0f} µs/DMA)"
    return s


def processes_table(ns: list[int], counts: list[int], timeout: float) -> None:
    """Steady time of the ring and jax's all-gather on one process vs a slice split over
    several (``examples/multi_process.py``: P processes of one ``jax.distributed`` run on
    this machine), and each transport's cost per round and per message."""
    sys.path.insert(0, os.path.join(HERE, os.pardir, "examples"))
    import multi_process

    print()
    print("### one process vs a slice split over processes (steady = 2nd call, wall and CPU "
          "seconds of the slowest process; rounds = lock-step exchanges of one launch, "
          "exchanges = seconds in them incl. waiting for the other; check_memory=False)")
    print()
    print("| kernel | N | " + " | ".join(f"P={p}" for p in counts) + " | speed-up |")
    print("|---|---|" + "---|" * len(counts) + "---|")
    for n in ns:
        for name in ("all_gather", "jax_all_gather"):
            steady: list[tuple[float, float] | None] = []
            cells = []
            for p in counts:
                try:
                    reports = multi_process.launch(
                        p, n, [name], repeats=1, timeout=timeout, check_memory=False)
                except Exception as e:  # noqa: BLE001 - a table cell, not a crash
                    cells.append(f"error: {str(e)[:80]}")
                    steady.append(None)
                    continue
                rows = [r["kernels"][name] for r in reports]
                t = max(r["steady"] for r in rows)
                c = max(r["steady_cpu"] for r in rows)
                steady.append((t, c))
                flag = "" if all(r["right"] for r in rows) else " (WRONG)"
                extra = (f", {rows[0]['rounds']} rounds, exchanges "
                         f"{max(r['exchange_seconds'] for r in rows):.2f} s" if p > 1 else "")
                cells.append(f"{t:.2f} s (CPU {c:.2f} s){flag}{extra}")
            first, last = steady[0], steady[-1]
            ratio = (f"{first[0] / last[0]:.2f}x (CPU {first[1] / last[1]:.2f}x)"
                     if first and last else "")
            print(f"| {name} | {n} | " + " | ".join(cells) + f" | {ratio} |", flush=True)
    reports = multi_process.launch(2, 2, ["exchange"], timeout=timeout)
    cost = reports[0]["exchange"]
    print()
    for kind, what in (("socket", "direct connections"), ("kv", "key-value store")):
        one, many = cost[f"{kind}1"], cost[f"{kind}256"]
        print(f"transport over the {what}, 2 processes: {one * 1e3:.3f} ms per round with "
              f"one 4 KiB message per process, {many * 1e3:.3f} ms with 256 "
              f"({(many - one) / 255 * 1e6:.1f} µs per extra message)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", nargs=3, metavar=("NAME", "N", "REPEATS"))
    parser.add_argument("--races-worker", nargs=3, metavar=("NAME", "N", "REPEATS"))
    parser.add_argument("--races", type=int, nargs="*", default=[8, 16, 32, 64],
                        help="device counts for the race-overhead table (none: skip it)")
    parser.add_argument("--max", type=int, default=64, help="largest N of the steady table")
    parser.add_argument("--big", type=int, nargs="*", default=[128, 256],
                        help="device counts for the completion table (none: skip it)")
    parser.add_argument("--processes", type=int, nargs="*", default=[],
                        help="process counts to compare (e.g. 1 2; none: skip the table)")
    parser.add_argument("--process-devices", type=int, nargs="*", default=[64, 256],
                        help="device counts of the processes table")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.worker:
        name, n, repeats = args.worker
        print(json.dumps(worker(name, int(n), int(repeats))))
        return 0
    if args.races_worker:
        name, n, repeats = args.races_worker
        print(json.dumps(races_worker(name, int(n), int(repeats))))
        return 0
    ns = [n for n in (2, 4, 8, 16, 32, 64) if n <= args.max]
    if ns:
        print("### palladium steady time vs device count (median of "
              f"{args.repeats} calls; µs per DMA = steady / DMAs of one call)")
        print()
        print("| kernel | " + " | ".join(f"N={n}" for n in ns) + " |")
        print("|---|" + "---|" * len(ns))
        for name in KERNELS:
            cells = [_cell(measure(name, n, args.repeats, args.timeout), args.timeout) for n in ns]
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    if args.big:
        print()
        print("### completion at large device counts (first call = trace + compile + run; "
              "steady: one more call)")
        print()
        print("| kernel | N | DMAs | first call | steady | per DMA |")
        print("|---|---|---|---|---|---|")
        for name in KERNELS:
            for n in args.big:
                r = measure(name, n, 1, args.timeout)
                if r is None or "error" in r:
                    print(f"| {name} | {n} | | {_cell(r, args.timeout)} | | |", flush=True)
                    continue
                flag = "" if r["correct"] else " (WRONG)"
                per = f"{r['steady'] / r['dmas'] * 1e6:.0f} µs" if r["dmas"] else ""
                print(f"| {name} | {n} | {r['dmas']} | {r['first']:.2f} s{flag} | "
                      f"{r['steady']:.2f} s | {per} |", flush=True)
    if args.processes:
        processes_table(args.process_devices, args.processes, args.timeout)
    if args.races:
        print()
        print(f"### race-detection overhead (steady ms, races off / on, and on / off; medians of {args.repeats} "
              "interleaved rounds in one process)")
        print()
        print("| kernel | " + " | ".join(f"N={n}" for n in args.races) + " |")
        print("|---|" + "---|" * len(args.races))
        for name in KERNELS:
            cells = []
            for n in args.races:
                r = measure(name, n, args.repeats, args.timeout, races=True)
                if r is None or "error" in r:
                    cells.append(_cell(r, args.timeout))
                    continue
                flag = "" if r["correct"] else " (WRONG)"
                cells.append(f"{r['off'] * 1e3:.0f} / {r['on'] * 1e3:.0f} ms: "
                             f"{r['on'] / r['off']:.2f}x{flag}")
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
