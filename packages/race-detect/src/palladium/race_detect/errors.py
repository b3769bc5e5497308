"""Exception and warning types of the race detector."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from palladium.race_detect.report import RaceReport


class RaceDetectorError(Exception):
    """Base class of the race detector's errors about its own use (not races)."""


class RegionError(RaceDetectorError, IndexError):
    """A region or mask does not fit the buffer it indexes."""


class UnknownBufferError(RaceDetectorError, KeyError):
    """An access names a buffer key that was never registered (or was freed)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ActorError(RaceDetectorError, RuntimeError):
    """An actor was used after it finished."""


class DataRaceError(Exception):
    """Two unordered accesses to the same element, at least one a write.

    ``.report`` is the ``RaceReport``; ``str()`` is the report's text.
    """

    def __init__(self, report: RaceReport) -> None:
        super().__init__(str(report))
        self.report = report


class RaceWarning(UserWarning):
    """The warning issued for each race under ``on_race="warn"``."""
