"""palladium.pipeline."""

from palladium.pipeline._version import __version__

__all__ = ["__version__"]
