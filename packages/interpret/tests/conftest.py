"""Test set-up of palladium-interpret's own tests (they also run from the sdist alone).

Multi-device tests need several host CPU devices; XLA reads the flag once, before jax
initialises its backends, so it is set here, before any test module imports jax. The
shared test helpers of this package (``_launch_harness``) are made importable.
"""

import os
import sys

_FLAG = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

sys.path.insert(0, os.path.dirname(__file__))
