"""palladium.race_detect."""

from palladium.race_detect._version import __version__

__all__ = ["__version__"]
