"""Where palladium.interpret keeps what it caches across processes."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """``$PALLADIUM_CACHE_DIR``, else ``$XDG_CACHE_HOME/palladium``, else
    ``~/.cache/palladium``: each cache keeps a folder of its own below it."""
    root = os.environ.get("PALLADIUM_CACHE_DIR")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "palladium"
