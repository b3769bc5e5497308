"""palladium.race_detect: a happens-before data-race detector for simulated accelerators.

Actors (simulated cores, DMAs in flight) carry vector clocks; synchronisation (fork,
join, release/acquire, barriers) orders them; reads and writes of buffer regions are
checked FastTrack-style against per-element shadow state. See ``API.md``.
"""

from palladium.race_detect._version import __version__
from palladium.race_detect.actor import Actor
from palladium.race_detect.call_log import RaceMemo
from palladium.race_detect.clock import Clock, VectorClock
from palladium.race_detect.detector import RaceDetector
from palladium.race_detect.errors import (
    ActorError,
    ConfigError,
    DataRaceError,
    PalladiumError,
    RaceDetectorError,
    RaceWarning,
    RegionError,
    SimulationError,
    UnknownBufferError,
)
from palladium.race_detect.memo import MemoDetector
from palladium.race_detect.policy import OnRace
from palladium.race_detect.prepared import PreparedAccess, prepare
from palladium.race_detect.remote import ClockExchange
from palladium.race_detect.report import Access, RaceReport

__all__ = [
    "Access",
    "Actor",
    "ActorError",
    "Clock",
    "ClockExchange",
    "ConfigError",
    "DataRaceError",
    "MemoDetector",
    "OnRace",
    "PalladiumError",
    "PreparedAccess",
    "RaceDetector",
    "RaceDetectorError",
    "RaceMemo",
    "RaceReport",
    "RaceWarning",
    "RegionError",
    "SimulationError",
    "UnknownBufferError",
    "VectorClock",
    "__version__",
    "prepare",
]
