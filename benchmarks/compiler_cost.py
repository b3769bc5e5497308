"""What the TPU compiler's verdict costs on a kernel's first call (needs libtpu:
``pip install 'palladium-interpret[compiler]'``; run with ``JAX_PLATFORMS=cpu``).

For jax's shipped matmul and flash attention (interpret_vs_jax's cases) and the kernels of
``kernel_cases.py``: the first call (trace + lower + compile + run, after
``jax.clear_caches()``) with ``compile_check="off"``, ``"approximate"`` and ``"compiler"``
four ways: compiled now by a compiler process started for it (as a process's first new
kernel), compiled now by the running compiler process (empty caches), found in this
process's memory, read from the disk cache (memory cleared, as a new process finds it). Each first call
is measured ``--repeats`` times; the table shows the median, and the compiler's own time
(``tpu_compiler.compile_verdict``) inside the call.

    JAX_PLATFORMS=cpu python benchmarks/compiler_cost.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import jax
from _timed import timed_calls
from interpret_vs_jax import _flash_case, _matmul_case  # noqa: E402  (same kernels)

import palladium.interpret as pi
from palladium.interpret.fidelity import tpu_compiler
from palladium.interpret.fidelity.compiler_process import COMPILER_PROCESS


def _first_call(fn, args, check: str, cache: str) -> tuple[float, float]:
    jax.clear_caches()
    if cache in ("compiled", "disk"):
        tpu_compiler.clear_memory_cache()
    if cache in ("compiled", "cold"):
        shutil.rmtree(tpu_compiler.VERDICTS.folder, ignore_errors=True)
        shutil.rmtree(tpu_compiler.ACCEPTED_CALLS.folder, ignore_errors=True)
        tpu_compiler.clear_memory_cache()
    if cache == "cold":
        COMPILER_PROCESS.close()  # the compiler's process starts again
    with timed_calls(tpu_compiler, "compile_verdict") as timer, pi.force_tpu_interpret_mode(
            pi.InterpretParams(compile_check=check)):
        t0 = time.perf_counter()
        jax.block_until_ready(jax.jit(fn)(*args))
        total = time.perf_counter() - t0
    return total, timer.seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args()
    if tpu_compiler.compiler_version() is None:
        print(f"libtpu is not installed ({tpu_compiler.INSTALL_COMMAND}): nothing to measure")
        return
    os.environ["PALLADIUM_CACHE_DIR"] = tempfile.mkdtemp(prefix="palladium-bench-")
    cases = [_matmul_case(512, 128), _flash_case(512, 128)]
    print(f"TPU compiler: {tpu_compiler.checker_name()}; first call, median of "
          f"{opts.repeats} (compiler's own share in brackets)\n")
    print("| kernel | off | approximate | compiler, its process started | compiler, "
          "compiled | compiler, in memory | compiler, from disk |")
    print("|---|---|---|---|---|---|---|")
    for case in cases:
        fn, args = case.make()
        _first_call(fn, args, "off", "")  # warm the imports and jax's own caches
        cells = []
        for check, cache in (("off", ""), ("approximate", ""), ("compiler", "cold"),
                             ("compiler", "compiled"),
                             ("compiler", "memory"), ("compiler", "disk")):
            runs = [_first_call(fn, args, check, cache) for _ in range(opts.repeats)]
            total = statistics.median(r[0] for r in runs)
            own = statistics.median(r[1] for r in runs)
            cells.append(f"{total:.2f} s" + (f" ({own:.2f} s)" if check == "compiler" else ""))
        print(f"| {case.name} | " + " | ".join(cells) + " |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
