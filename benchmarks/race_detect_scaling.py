"""Race-detector cost per access, from 10^3 to 10^6 accesses: it must stay flat.

The program is what a pipelined kernel does on two cores: each core walks its half of
the (8, 128) blocks of a (512, 512) HBM input, double-buffered through VMEM scratch.
Per step a DMA copies the next block HBM -> VMEM (forked from the core, finished, then
waited for: a join), the core reads that VMEM slot and writes an output slot (after
waiting for the DMA that last drained it), and a DMA copies the output slot to HBM.
Six accesses of 1024 elements per step; the grid is walked again and again until the
access count is reached. DMA clock slots recycle, so the clock stays small.

The baseline is the brute-force oracle the tests compare against (it keeps every access
and rescans each element's history), run while it stays under ~60 s in total: its cost
per access grows with the run, the detector's does not.

    python benchmarks/race_detect_scaling.py [--max-accesses N] [--baseline-max N]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from palladium.race_detect import RaceDetector
from palladium.race_detect.oracle import BruteForceDetector

SHAPE = (512, 512)
BLOCK = (8, 128)


def pipelined_program(det: Any, accesses: int) -> int:
    """Run the two-core double-buffered copy until ``accesses`` accesses; returns the count."""
    det.register_buffer("x", SHAPE, "x (HBM)")
    det.register_buffer("o", SHAPE, "o (HBM)")
    blocks = [
        (slice(i, i + BLOCK[0]), slice(j, j + BLOCK[1]))
        for i in range(0, SHAPE[0], BLOCK[0])
        for j in range(0, SHAPE[1], BLOCK[1])
    ]
    cores = []
    for c in range(2):
        core = det.new_actor(f"core {c}")
        det.register_buffer(("vin", c), (2, *BLOCK), f"x VMEM (core {c})")
        det.register_buffer(("vout", c), (2, *BLOCK), f"o VMEM (core {c})")
        cores.append({"actor": core, "index": c, "step": 0, "drain": [None, None]})
    done = 0
    dmas = 0
    while done < accesses:
        for state in cores:
            core, c, step = state["actor"], state["index"], state["step"]
            block = blocks[(2 * step + c) % len(blocks)]
            slot = step % 2
            dmas += 1
            copy_in = det.new_actor(f"DMA #{dmas} x->vin", parent=core)
            det.read(copy_in, "x", block, site="copy in")
            det.write(copy_in, ("vin", c), (slot,), site="copy in")
            det.finish(copy_in)
            det.join(core, copy_in)  # wait on the input semaphore
            det.read(core, ("vin", c), (slot,), site="kernel.py:10")
            drain = state["drain"][slot]
            if drain is not None:
                det.join(core, drain)  # wait until the output slot was drained
            det.write(core, ("vout", c), (slot,), site="kernel.py:11")
            dmas += 1
            copy_out = det.new_actor(f"DMA #{dmas} vout->o", parent=core)
            det.read(copy_out, ("vout", c), (slot,), site="copy out")
            det.write(copy_out, "o", block, site="copy out")
            det.finish(copy_out)
            state["drain"][slot] = copy_out
            state["step"] = step + 1
            done += 6
    return done


def measure(make: Any, accesses: int) -> tuple[float, float, Any]:
    """(wall µs per access, CPU µs per access, the detector) of one run."""
    det = make()
    wall, cpu = time.perf_counter(), time.process_time()
    done = pipelined_program(det, accesses)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall / done * 1e6, cpu / done * 1e6, det


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-accesses", type=int, default=10**6)
    parser.add_argument("--baseline-max", type=int, default=10**4)
    args = parser.parse_args()
    sizes = [n for n in (10**3, 10**4, 10**5, 10**6) if n <= args.max_accesses]
    # CPU time is reported too: on a shared machine wall time also measures the neighbours.
    print(
        "| accesses | RaceDetector µs/access (wall / CPU) | clock slots | live records "
        "| brute-force rescan µs/access (wall / CPU) | ratio (CPU) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    baseline_total = 0.0
    for n in sizes:
        wall, cpu, det = measure(lambda: RaceDetector(on_race="raise"), n)
        assert not det.reports, det.reports[:1]
        records = det.live_records()
        row = f"| {n:,} | {wall:.1f} / {cpu:.1f} | {det.num_slots} | {records} |"
        if n <= args.baseline_max and baseline_total < 60:
            b_wall, b_cpu, oracle = measure(lambda: BruteForceDetector(on_race="collect"), n)
            assert not oracle.reports
            baseline_total += b_wall * n / 1e6
            row += f" {b_wall:.0f} / {b_cpu:.0f} | {b_cpu / cpu:.0f}x |"
        else:
            row += " (not run) | |"
        print(row, flush=True)


if __name__ == "__main__":
    main()
