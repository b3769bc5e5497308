"""The README's example runs: under jax's interpreter on a CPU, compiled on a TPU."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    [block] = [b for b in blocks if "emit_pipeline" in b]
    return block


@pytest.mark.skipif(not README.exists(), reason="README.md is not beside the tests")
def test_readme_example_runs_on_this_host():
    exec(compile(_example(), str(README), "exec"), {})


@pytest.mark.tpu
@pytest.mark.skipif(not README.exists(), reason="README.md is not beside the tests")
def test_readme_example_runs_on_the_chip():
    namespace: dict = {}
    exec(compile(_example(), str(README), "exec"), namespace)
    assert namespace["x"].device.platform == "tpu"  # the example took its chip branch
