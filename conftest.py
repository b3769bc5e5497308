"""Root test configuration shared by every package's tests.

Multi-device tests need several host CPU devices; XLA reads the flag once, before jax
initialises its backends, so it is set here, before any test module imports jax.
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

# The suite never reads or writes the user's disk cache (``palladium-cache info``): a
# fresh folder for the run (each xdist worker its own), removed at exit, or the folder
# ``$PALLADIUM_TEST_CACHE_DIR`` names (kept between runs). Subprocesses inherit it.
if os.environ.get("_PALLADIUM_TEST_CACHE") != str(os.getpid()):
    import atexit
    import shutil
    import tempfile

    _kept = os.environ.get("PALLADIUM_TEST_CACHE_DIR")
    os.environ["PALLADIUM_CACHE_DIR"] = _kept or tempfile.mkdtemp(prefix="palladium-test-cache-")
    os.environ["_PALLADIUM_TEST_CACHE"] = str(os.getpid())
    if not _kept:
        atexit.register(shutil.rmtree, os.environ["PALLADIUM_CACHE_DIR"], ignore_errors=True)
