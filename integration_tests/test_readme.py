"""Every ```python block of README.md runs, in order, in one namespace per section (a
``##`` or ``###`` heading starts one)."""

import importlib.util
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _sections():
    text = README.read_text()
    sections = re.split(r"^#{2,3} ", text, flags=re.M)[1:]
    for section in sections:
        title = section.splitlines()[0].strip()
        blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
        if blocks:
            yield pytest.param(blocks, id=title)


# A block whose first line says so runs where the TPU compiler (libtpu) is installed: in
# the `compiler` nox session (the default `tests` session has no libtpu).
NEEDS_COMPILER = "# needs the TPU compiler"
HAVE_COMPILER = importlib.util.find_spec("libtpu") is not None


@pytest.mark.parametrize("blocks", list(_sections()))
def test_readme_section_runs(blocks):
    namespace: dict = {}
    for block in blocks:
        if block.startswith(NEEDS_COMPILER) and not HAVE_COMPILER:
            continue
        exec(compile(block, str(README), "exec"), namespace)


def test_readme_has_examples_for_every_package():
    text = README.read_text()
    for module in ["interpret", "pipeline", "shared_memory", "race_detect"]:
        assert f"palladium.{module}" in text
