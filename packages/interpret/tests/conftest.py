"""Make the shared test helpers of this package (``_launch_harness``) importable."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
