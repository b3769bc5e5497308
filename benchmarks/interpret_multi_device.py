"""Multi-device collectives: palladium.interpret vs jax's own TPU interpret mode.

The four collectives of examples/collectives.py, written with remote DMAs (right permute,
ring all-gather, all-reduce with a barrier-semaphore handshake, reduce-scatter), and jax's shipped
``jax.experimental.pallas.ops.tpu.all_gather`` run under ``jit(shard_map)`` over a mesh of
N CPU devices. Every result is checked against numpy ("(WRONG)" marks a wrong one). Every measurement runs in its own subprocess whose process has N+1 host
devices (jax's interpreter hangs when the mesh uses every host device) and a timeout;
a run that does not finish is reported as "> T s (timeout)". Reported: the first call
(trace + compile + run) and the steady state (median of repeated calls), and the ratio
jax / palladium (higher is better for palladium); then palladium's steady time vs the
device count (2, 4, 8, 16).

    python benchmarks/interpret_multi_device.py [--quick] [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from _harness import cell, collective, in_subprocess

COLLECTIVES = ("right_permute", "all_gather", "all_reduce", "reduce_scatter", "jax_all_gather")


# --- the worker (jax is imported only here) -----------------------------------------------


def worker(impl: str, name: str, n: int, repeats: int) -> dict:
    import numpy as np
    from jax.experimental.pallas import tpu as pltpu

    import palladium.interpret as pi

    if impl == "jax":
        interpret, force = pltpu.InterpretParams(), pltpu.force_tpu_interpret_mode
    else:
        interpret, force = pi.InterpretParams(), pi.force_tpu_interpret_mode
    f, x, expected = collective(name, n, interpret, force)
    t0 = time.perf_counter()
    out = np.asarray(f(x))
    first = time.perf_counter() - t0
    correct = bool(np.array_equal(out, expected))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    return {"first": first, "steady": statistics.median(times), "correct": correct}


# --- the driver ---------------------------------------------------------------------------


def measure(impl: str, name: str, n: int, repeats: int, timeout: float) -> dict | None:
    """One measurement in a subprocess with n+1 host devices; None on timeout."""
    return in_subprocess(__file__, ["--worker", impl, name, str(n), str(repeats)], n, timeout)


_fmt = cell


def _ratio(jax_r: dict | None, pal_r: dict | None, key: str, timeout: float) -> str:
    if pal_r is None or "error" in pal_r:
        return "-"
    if jax_r is None:
        return f"> {timeout / pal_r[key]:.0f}x"
    if "error" in jax_r:
        return "-"
    return f"{jax_r[key] / pal_r[key]:.1f}x"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--worker", nargs=4, metavar=("IMPL", "NAME", "N", "REPEATS"))
    args = parser.parse_args(argv)
    if args.worker:
        impl, name, n, repeats = args.worker
        print(json.dumps(worker(impl, name, int(n), int(repeats))))
        return 0
    repeats = 3 if args.quick else 10
    compare_ns = (2, 4) if args.quick else (2, 4, 8)
    scale_ns = (2, 4, 8) if args.quick else (2, 4, 8, 16)
    print("### palladium vs jax's TPU interpret mode (mesh of N devices, N+1 host devices)")
    print()
    print("| collective | N | jax first | palladium first | ratio | jax steady | "
          "palladium steady | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    pal_results: dict[tuple[str, int], dict | None] = {}
    for name in COLLECTIVES:
        for n in compare_ns:
            pal = measure("palladium", name, n, repeats, args.timeout)
            pal_results[(name, n)] = pal
            jx = measure("jax", name, n, max(1, repeats // 3), args.timeout)
            t = args.timeout
            print(f"| {name} | {n} | {_fmt(jx, 'first', t)} | {_fmt(pal, 'first', t)} | "
                  f"{_ratio(jx, pal, 'first', t)} | {_fmt(jx, 'steady', t)} | "
                  f"{_fmt(pal, 'steady', t)} | {_ratio(jx, pal, 'steady', t)} |", flush=True)
    print()
    print("### palladium steady-state time vs device count")
    print()
    print("| collective | " + " | ".join(f"N={n}" for n in scale_ns) + " |")
    print("|---|" + "---|" * len(scale_ns))
    for name in COLLECTIVES:
        cells = []
        for n in scale_ns:
            r = pal_results.get((name, n)) or measure("palladium", name, n, repeats, args.timeout)
            cells.append(_fmt(r, "steady", args.timeout))
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
