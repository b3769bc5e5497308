"""What happens when a race is found: the ``on_race`` policies."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Literal, TypeAlias

from palladium.race_detect.errors import ConfigError, DataRaceError, RaceWarning
from palladium.race_detect.report import RaceReport

OnRace: TypeAlias = Literal["raise", "warn", "collect"] | Callable[[RaceReport], None]
Deliver = Callable[[Sequence[RaceReport]], None]


def _raise(reports: Sequence[RaceReport]) -> None:
    if reports:
        raise DataRaceError(reports[0])


def _warn(reports: Sequence[RaceReport]) -> None:
    for report in reports:
        warnings.warn(str(report), RaceWarning, stacklevel=4)


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
