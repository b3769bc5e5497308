"""Exception and warning types of the race detector, and the root of palladium's errors.

Every exception palladium's simulator packages raise (race_detect, shared_memory,
interpret) derives from :class:`PalladiumError`, defined here because this is the
package every other one builds on. A fault found in a simulated run is a
:class:`SimulationError` (a race included); a call palladium does not accept (an option
value, a shape, a region) is a :class:`ConfigError`, which is also a ``ValueError``.
(``palladium.pipeline`` installs alone on a TPU VM and imports no other palladium
package: its root is its own ``PipelineError``.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from palladium.race_detect.report import RaceReport


class PalladiumError(Exception):
    """Base class of every exception palladium raises (pipeline: see the module docs)."""


class ConfigError(PalladiumError, ValueError):
    """palladium was called with a value it does not accept (an option, a shape, ...)."""


class SimulationError(PalladiumError):
    """Base class of every fault found in a simulated run: the simulator's, the race
    detector's races and the interpreter's own."""


class RaceDetectorError(PalladiumError):
    """Base class of the race detector's errors about its own use (not races)."""


class RegionError(RaceDetectorError, IndexError):
    """A region or mask does not fit the buffer it indexes."""


class UnknownBufferError(RaceDetectorError, KeyError):
    """An access names a buffer key that was never registered (or was freed)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ActorError(RaceDetectorError, RuntimeError):
    """An actor was used after it finished."""


class DataRaceError(SimulationError):
    """Two unordered accesses to the same element, at least one a write.

    ``.report`` is the ``RaceReport``; ``str()`` is the report's text.
    """

    def __init__(self, report: RaceReport) -> None:
        super().__init__(str(report))
        self.report = report


class RaceWarning(UserWarning):
    """The warning issued for each race under ``on_race="warn"``."""
