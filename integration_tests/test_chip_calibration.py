"""The performance model's measured table is what the committed chip measurements give.

``packages/interpret/src/palladium/interpret/perf/measured/v5e.json`` must be exactly what
``benchmarks/chip/fit_constants.py`` derives from ``benchmarks/results_tpu/
calibration*.v5e.json`` (the microbenchmarks timed on the chip): no constant tuned by
hand, none left behind by a new measurement.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "packages/interpret/src/palladium/interpret/perf/measured/v5e.json"


@pytest.mark.timeout(120)
def test_the_v5e_table_is_refitted_from_the_committed_measurements(tmp_path):
    out = tmp_path / "v5e.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/chip/fit_constants.py"),
                    "--chip", "v5e", "--out", str(out)], check=True, capture_output=True)
    assert json.loads(out.read_text()) == json.loads(TABLE.read_text())


def test_every_constant_names_microbenchmarks_that_were_measured():
    measured = {}
    for f in sorted((ROOT / "benchmarks/results_tpu").glob("calibration*.v5e.json")):
        measured.update(json.loads(f.read_text())["kernels"])
    table = json.loads(TABLE.read_text())
    for name, c in table["constants"].items():
        for source in c["from"]:
            prefix = source.split("*")[0].split("..")[0].split("{")[0]
            assert any(k.startswith(prefix.rsplit("/", 1)[0]) for k in measured), (name, source)
