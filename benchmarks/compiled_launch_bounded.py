"""Steady calls of compiled launches: run inline on the launch's thread (as before issue
42, item 4) against ``bounded_call``'s default (a worker thread with owned operands for
launches whose last run was long, inline for short ones, their ``while`` loops on a
budget of iterations since 2026-12-06), in one process each.

    python benchmarks/compiled_launch_bounded.py inline
    python benchmarks/compiled_launch_bounded.py bounded

Prints the median and minimum of 30 steady calls (after 4 warm-up calls) of paged
attention and the RG-LRU scan (``kernel_cases``). Measured 2026-12-05 on the shared
2-core development machine, 2 processes per mode alternated: paged attention (while
loops: threaded) inline 1.61-2.12 ms, bounded 1.66-2.13 ms median; RG-LRU (inline after
its first compiled run) 0.84 / 0.82-0.89 ms: within the machine's noise (+-25%).
(Paged attention runs inline too since its loops have a budget: bounded_call's docstring.)
"""

import statistics
import sys
import time

import jax

sys.path.insert(0, "benchmarks")
import kernel_cases as kc  # noqa: E402

import palladium.interpret as pi  # noqa: E402
from palladium.interpret import InterpretParams  # noqa: E402
from palladium.interpret.compiled import bounded_call, compiled_launch  # noqa: E402


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "bounded"
    real = bounded_call.bounded_call

    def forced(fn, *, kernel_name, params, inline):
        return real(fn, kernel_name=kernel_name, params=params,
                    inline=(mode == "inline") or inline)

    compiled_launch.bounded_call = forced
    for case in [kc.paged_attention_case(), kc.rglru_scan_case()]:
        fn, args = case.make()
        with pi.force_tpu_interpret_mode(InterpretParams()):
            f = jax.jit(fn)
            for _ in range(4):
                jax.block_until_ready(f(*args))
            times = []
            for _ in range(30):
                t = time.perf_counter()
                jax.block_until_ready(f(*args))
                times.append(time.perf_counter() - t)
        print(f"{mode} {case.name}: median {1e3 * statistics.median(times):.3f} ms, "
              f"min {1e3 * min(times):.3f} ms")


if __name__ == "__main__":
    main()
