"""palladium.shared_memory."""

from palladium.shared_memory._version import __version__

__all__ = ["__version__"]
