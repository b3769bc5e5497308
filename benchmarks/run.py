"""Run every palladium benchmark and print its table.

Each benchmark is a script in this folder that prints a Markdown table; `nox -s bench`
runs them all in one process tree, so palladium and jax's own implementations are
measured in the same run on the same machine, and prints each script's wall time.

    nox -s bench                                   # everything (see README.md for the time)
    nox -s bench -- --quick                        # every script at small sizes
    nox -s bench -- interpret_kernels.py           # only some scripts
    nox -s bench -- interpret_kernels.py -- -k paged --rounds 3   # arguments for them
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
# script -> its arguments for --quick
SCRIPTS = {
    "interpret_kernels.py": ["--quick", "--rounds", "3", "--jax-rounds", "1"],
    "first_call_parts.py": ["--one-process"],
    "device_scaling.py": ["--max", "16", "--big", "--races", "8", "--repeats", "3"],
    "interpret_vs_jax.py": ["--quick", "--no-profile"],
    "interpret_multi_device.py": ["--quick"],
    "race_detect_scaling.py": ["--max-accesses", "10000", "--baseline-max", "1000"],
    "race_replay.py": ["--devices", "8", "--repeats", "3", "--drop", "7"],
    "pipeline_trace.py": ["--repeats", "3"],
    "timeline_model.py": ["--quick"],
    "fidelity_checks.py": ["--quick", "--repeats", "2"],
    "deterministic_dot.py": ["--quick"],
    "compiler_agreement.py": ["--quick"],
    "tune_published.py": ["--quick"],
    "predict_speed.py": ["-k", "flash forward causal h8", "-k", "paged attention b8",
                         "-k", "(512, 1024, 1024)"],
    "pipeline_primitive.py": ["--repeats", "1", "--calls", "3"],
}


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    quick = "--quick" in argv
    chosen = [a for a in argv if a != "--quick"] or list(SCRIPTS)
    failed = []
    total = time.perf_counter()
    for name in chosen:
        path = HERE / name
        if not path.exists():
            print(f"## {name}: missing", flush=True)
            failed.append(name)
            continue
        args = (SCRIPTS.get(name, []) if quick else []) + extra
        print(f"## {name} {' '.join(args)}".rstrip(), flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(path), *args])
        print(f"\n({name}: {time.perf_counter() - t0:.0f} s wall)", flush=True)
        if rc:
            failed.append(name)
        print(flush=True)
    print(f"(all: {time.perf_counter() - total:.0f} s wall)")
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
