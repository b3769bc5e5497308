"""Run every palladium benchmark and print its table.

Each benchmark is a script in this folder that prints a Markdown table; `nox -s bench`
runs them all in one process tree, so palladium and jax's own implementations are
measured in the same run on the same machine. Pass script names to run only some:

    nox -s bench -- race_detect_scaling.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
SCRIPTS = [
    "race_detect_scaling.py",
    "interpret_vs_jax.py",
    "pipeline_trace.py",
    "interpret_multi_device.py",
]


def main(argv: list[str]) -> int:
    chosen = argv or SCRIPTS
    failed = []
    for name in chosen:
        path = HERE / name
        if not path.exists():
            print(f"## {name}: missing", flush=True)
            failed.append(name)
            continue
        print(f"## {name}", flush=True)
        rc = subprocess.call([sys.executable, str(path)])
        if rc:
            failed.append(name)
        print(flush=True)
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
