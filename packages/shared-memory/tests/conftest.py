"""Test set-up of palladium-shared-memory's own tests (they also run from the sdist alone):
the shared test helpers of this package (``_scheduler_scenarios``, ``_race_scenarios``)
are made importable."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
