"""What palladium's TPU fidelity checks cost, and what they find, on interpret_vs_jax's
kernels.

For each kernel: the first call (trace + lower + compile + run, after
``jax.clear_caches()``) with ``InterpretParams(check_lowering=True)`` and ``False``, the
time the lowering check itself took inside that first call (its share of the call), and
the kernel's VMEM/SMEM use per core against the simulated chip's limit (v5e, the
default). The machine may be shared: each first call is measured ``--repeats`` times and
shown as min..max.

    python benchmarks/fidelity_checks.py [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import time

import jax
from _timed import timed_calls
from interpret_vs_jax import _flash_case, _matmul_case  # noqa: E402  (same kernels)

import palladium.interpret as pi
from palladium.interpret.fidelity import checks
from palladium.interpret.observe.observers import add_launch_observer, remove_launch_observer


def _first_call(fn, args, check: bool) -> tuple[float, float]:
    jax.clear_caches()
    with timed_calls(checks, "check_lowering") as timer, pi.force_tpu_interpret_mode(
            pi.InterpretParams(check_lowering=check)):
        t0 = time.perf_counter()
        jax.jit(fn)(*args).block_until_ready()
        total = time.perf_counter() - t0
    return total, timer.seconds


def _memory(fn, args) -> list:
    """The memory use of each kernel ``fn`` launches (``LaunchInfo.memory``)."""
    seen: dict[str, object] = {}

    def factory(info):
        seen.setdefault(info.kernel_name, info.memory)

    add_launch_observer(factory)
    try:
        with pi.force_tpu_interpret_mode(pi.InterpretParams()):
            jax.jit(fn)(*args).block_until_ready()
    finally:
        remove_launch_observer(factory)
    return list(seen.items())


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _span(values: list[float], fmt: str = "{:.3f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else (
        f"{fmt.format(lo)}..{fmt.format(hi)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args()
    cases = ([_matmul_case(256, 128), _flash_case(256, 128)] if opts.quick
             else [_matmul_case(1024, 128), _flash_case(2048, 128)])
    print(f"jax {jax.__version__}, {os.cpu_count()} cores; first calls in seconds, "
          f"min..max of {opts.repeats}")
    print()
    print("| kernel | first call, check off | first call, check on | lowering check | "
          "share of first call |")
    print("|---|---|---|---|---|")
    for case in cases:
        fn, args = case.make()
        _first_call(fn, args, True)  # warm up jax's own one-off costs
        off, on, check, share = [], [], [], []
        for _ in range(opts.repeats):
            off.append(_first_call(fn, args, False)[0])
            total, spent = _first_call(fn, args, True)
            on.append(total)
            check.append(spent)
            share.append(100 * spent / total)
        print(f"| {case.name} | {_span(off)} | {_span(on)} | {_span(check)} | "
              f"{_span(share, '{:.0f}')}% |", flush=True)
    print()
    print("| kernel | pallas_call | chip | VMEM per core | VMEM limit | share | SMEM per core |"
          " intermediates peak |")
    print("|---|---|---|---|---|---|---|---|")
    for case in cases:
        fn, args = case.make()
        for name, use in _memory(fn, args):
            print(f"| {case.name} | {name} | {use.chip} | {_mib(use.vmem.peak_bytes)} | "
                  f"{_mib(use.vmem.limit_bytes)} | "
                  f"{100 * use.vmem.peak_bytes / use.vmem.limit_bytes:.1f}% | "
                  f"{use.smem.peak_bytes} B | {_mib(use.intermediates_peak_bytes)} |",
                  flush=True)


if __name__ == "__main__":
    main()
