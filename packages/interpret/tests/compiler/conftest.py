"""The tests of this folder ask the TPU compiler itself (libtpu) and run only where it is
installed (``pip install 'palladium-interpret[compiler]'``, ``nox -s compiler``);
elsewhere they are not collected."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("libtpu") else ["test_*.py"]
