"""Root test configuration shared by every package's tests.

Multi-device tests need several host CPU devices; XLA reads the flag once, before jax
initialises its backends, so it is set here, before any test module imports jax.
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
