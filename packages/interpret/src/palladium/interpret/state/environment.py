"""What a cached result is a function of besides its own key: the one environment digest.

Every cache that outlives a process (``disk_cache``: compiled executables, the TPU
compiler's verdicts, the clean Mosaic lowerings) keys its entries by what it caches
*and* by :func:`environment_digest`: the installed versions of jax, jaxlib, libtpu and
palladium's packages, a digest of palladium's installed source (a checkout whose code
changed keeps its version number), and the flags that change what XLA and libtpu do
(``XLA_FLAGS``, ``LIBTPU_INIT_ARGS``). An executable also holds the host's instructions:
:func:`host_digest` adds the machine and its CPU's features for those.

>>> environment_digest() == environment_digest(), len(environment_digest())
(True, 64)
>>> host_digest() != environment_digest()
True
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
from pathlib import Path

__all__ = ["DISTRIBUTIONS", "FLAG_VARIABLES", "environment_digest", "host_digest", "version"]

#: The distributions whose versions every cached result depends on.
DISTRIBUTIONS = ("jax", "jaxlib", "libtpu", "palladium-interpret", "palladium-shared-memory",
                 "palladium-race-detect")
#: The environment variables that change what jax's compilers make.
FLAG_VARIABLES = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")


@functools.cache
def version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _source_digest() -> str:
    """A digest of palladium's installed source (interpret, shared_memory, race_detect)."""
    import palladium.race_detect
    import palladium.shared_memory

    folders = [Path(__file__).resolve().parents[1]]  # palladium/interpret
    for package in (palladium.shared_memory, palladium.race_detect):
        folders += [Path(f) for f in package.__path__]
    h = hashlib.sha256()
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            h.update(str(path.relative_to(folder)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def environment_digest() -> str:
    """A hex digest of the software a cached result depends on (see the module docs).
    The flags are read on every call (a process may change them); the rest once."""
    import jax

    parts = [f"{d}={version(d)}" for d in DISTRIBUTIONS]
    parts += [f"jax.__version__={jax.__version__}", f"source={_source_digest()}"]
    parts += [f"{v}={os.environ.get(v, '')}" for v in FLAG_VARIABLES]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@functools.cache
def _host() -> str:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu += "".join(line for line in f if line.startswith(("flags", "Features")))[:4096]
    except OSError:
        pass
    return f"{platform.machine()}\n{cpu}"


def host_digest() -> str:
    """:func:`environment_digest` and the host's machine and CPU features (for cached
    executables, which hold the host's instructions)."""
    return hashlib.sha256(f"{environment_digest()}\n{_host()}".encode()).hexdigest()
