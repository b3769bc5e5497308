"""Make the shared test harness of this package importable from its tests."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
