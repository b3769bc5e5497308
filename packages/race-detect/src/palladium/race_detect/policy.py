"""What happens when a race is found: the ``on_race`` policies."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Literal, TypeAlias

from palladium.race_detect.errors import ConfigError, DataRaceError, RaceWarning
from palladium.race_detect.report import RaceReport

OnRace: TypeAlias = Literal["raise", "warn", "collect"] | Callable[[RaceReport], None]
Deliver = Callable[[Sequence[RaceReport]], None]


def _raise(reports: Sequence[RaceReport]) -> None:
    if reports:
        raise DataRaceError(reports[0])


def _outside_level() -> int:
    """The ``stacklevel`` (from ``_warn``) of the first frame outside this package: the
    code that called the detector, however many of its own frames lie between (a
    ``MemoDetector`` replaying into a ``RaceDetector`` adds some)."""
    frame: FrameType | None = sys._getframe(1)  # ``_warn``'s, level 1
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith(__package__):
        frame, level = frame.f_back, level + 1
    return level


def _warn(reports: Sequence[RaceReport]) -> None:
    level = _outside_level()
    for report in reports:
        warnings.warn(str(report), RaceWarning, stacklevel=level)


def _collect(reports: Sequence[RaceReport]) -> None:
    del reports  # kept in RaceDetector.reports, nothing else to do


POLICIES: dict[str, Deliver] = {"raise": _raise, "warn": _warn, "collect": _collect}


def deliver_function(on_race: OnRace) -> Deliver:
    """The function that delivers a batch of reports under ``on_race``."""
    if callable(on_race):
        callback = on_race

        def _call(reports: Sequence[RaceReport]) -> None:
            for report in reports:
                callback(report)

        return _call
    try:
        return POLICIES[on_race]
    except (KeyError, TypeError):
        raise ConfigError(
            f"on_race={on_race!r}: expected one of {sorted(POLICIES)} or a callable "
            "taking a RaceReport"
        ) from None
