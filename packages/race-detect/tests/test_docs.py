"""The runnable examples in docstrings and in the README work."""

import doctest
import re
from pathlib import Path

import palladium.race_detect.clock
import palladium.race_detect.detector
import palladium.race_detect.memo


def test_docstring_examples():
    for module in (palladium.race_detect.clock, palladium.race_detect.detector,
                   palladium.race_detect.memo):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_readme_example():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", readme, re.S)
    namespace: dict = {}
    exec(code, namespace)
    assert namespace["det"].reports == []
