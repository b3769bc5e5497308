"""palladium's steady time and time per DMA vs the number of simulated devices.

Ring collectives of ``examples/collectives.py`` (``right_permute``: one remote DMA per
device; ``all_gather``: a ring of n-1 steps, n^2 DMAs in all) and jax's shipped
``jax.experimental.pallas.ops.tpu.all_gather`` (a bidirectional ring reusing one receive
semaphore per direction) under ``jit(shard_map)`` on N = 2 .. 64 simulated devices, then
right-permute and both all-gathers at 128 and 256 devices (do they complete, and in what
time). Each point runs in its own subprocess with N+1 host devices and a timeout (see
``interpret_multi_device.py``); the DMAs of one launch are counted by a launch observer
during the first call, so "per DMA" is steady time / DMAs. Flat "per DMA" means the
simulator's cost per DMA does not grow with the device count.

    python benchmarks/device_scaling.py                 # 2..64, then 128 and 256 (~6-10 min)
    python benchmarks/device_scaling.py --max 16        # 2..16 only (~1 min)
    python benchmarks/device_scaling.py --big 128       # also 128, not 256
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = ("right_permute", "all_gather", "jax_all_gather")


def worker(name: str, n: int, repeats: int) -> dict:
    sys.path.insert(0, HERE)
    import interpret_multi_device

    from palladium.interpret import observers
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


def measure(name: str, n: int, repeats: int, timeout: float) -> dict | None:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n + 1}"
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, str(n), str(repeats)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:120]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cell(r: dict | None, timeout: float, per_dma: bool = True) -> str:
    if r is None:
        return f"> {timeout:g} s (timeout)"
    if "error" in r:
        return f"error: {r['error']}"
    flag = "" if r["correct"] else " (WRONG)"
    s = f"{r['steady'] * 1e3:.1f} ms{flag}"
    if per_dma and r["dmas"]:
        s += f" ({r['steady'] / r['dmas'] * 1e6:.0f} µs/DMA)"
    return s


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", nargs=3, metavar=("NAME", "N", "REPEATS"))
    parser.add_argument("--max", type=int, default=64, help="largest N of the steady table")
    parser.add_argument("--big", type=int, nargs="*", default=[128, 256],
                        help="device counts for the completion table (none: skip it)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.worker:
        name, n, repeats = args.worker
        print(json.dumps(worker(name, int(n), int(repeats))))
        return 0
    ns = [n for n in (2, 4, 8, 16, 32, 64) if n <= args.max]
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
