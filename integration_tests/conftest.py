"""Integration tests may use the runnable examples: examples/ is not a package, so its
folder is put on sys.path here (``import collectives`` is examples/collectives.py); and
this folder too, for the harness one test file shares with another
(``test_multi_process_sockets`` runs ``test_multi_process``'s workers)."""

import sys
from pathlib import Path

EXAMPLES = str(Path(__file__).resolve().parent.parent / "examples")
HERE = str(Path(__file__).resolve().parent)
for folder in (EXAMPLES, HERE):
    if folder not in sys.path:
        sys.path.insert(0, folder)
