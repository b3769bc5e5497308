"""``palladium-cache``: see or clear palladium.interpret's disk cache.

    palladium-cache info     where it is, its entries by kind, their size and the limit
    palladium-cache clear    delete every entry (what palladium cached is rebuilt on use)
    palladium-cache path     the folder alone

The folder is ``$PALLADIUM_CACHE_DIR``, else the user's cache folder (``platformdirs``);
the limit ``$PALLADIUM_CACHE_SIZE`` (see ``palladium.interpret.state.disk_cache``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from palladium.interpret.errors import ConfigError
from palladium.interpret.state.disk_cache import cache_clear, cache_info, cache_root

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="palladium-cache", description="See or clear palladium.interpret's disk cache.")
    parser.add_argument("command", choices=("info", "clear", "path"), nargs="?",
                        default="info")
    args = parser.parse_args(argv)
    try:
        if args.command == "path":
            print(cache_root())
        elif args.command == "clear":
            removed = cache_clear()
            print(f"removed {removed} files from {cache_root()}")
        else:
            print(cache_info())
    except ConfigError as e:  # (a size it cannot read)
        print(f"palladium-cache: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
