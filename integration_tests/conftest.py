"""Integration tests may use the runnable examples: examples/ is not a package, so its
folder is put on sys.path here (``import collectives`` is examples/collectives.py)."""

import sys
from pathlib import Path

EXAMPLES = str(Path(__file__).resolve().parent.parent / "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)
