"""The README's example runs (it is what a PyPI reader copies first)."""

import re
from pathlib import Path


def test_readme_example():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", readme, re.S)
    namespace: dict = {}
    exec(code, namespace)
    assert namespace["sim"].value(namespace["x"]).tolist() == [0, 0, 0, 0, 4, 5, 6, 7]
