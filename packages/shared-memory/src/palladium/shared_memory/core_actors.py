"""The race detector's view of one simulated launch (a ``Simulation`` collaborator): the
detector, the launch's own actor, and one actor per core, made on first use.

With a ``RaceMemo`` (the client keeps one per kernel) the detector is a
``MemoDetector``: a launch whose calls are those of the last race-free launch of the
kernel needs no detection (see ``palladium.race_detect.memo``). Its actors and clocks
are then int tokens, which only the detector itself reads. A run whose clocks cross
processes (``partition``) needs real clocks as they are made: the simulation then
passes no memo."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from palladium.race_detect import MemoDetector, OnRace, RaceDetector, RaceMemo
from palladium.shared_memory.errors import core_name

__all__ = ["CoreActors"]

CoreId = tuple[int, int]


class CoreActors:
    """A ``RaceDetector`` (or a ``MemoDetector`` over ``memo``'s log for ``key``) with
    the launch's actor (``root``) and each core's."""

    __slots__ = ("actors", "detector", "root")

    def __init__(self, on_race: OnRace, memo: RaceMemo | None = None,
                 key: Hashable = None) -> None:
        self.detector: Any = (RaceDetector(on_race=on_race) if memo is None
                              else MemoDetector(on_race, memo, key))
        # The launch itself: forks every core, joins them all at the end of a run.
        self.root: Any = self.detector.new_actor("kernel launch")
        self.actors: dict[CoreId, Any] = {}

    def actor(self, core: CoreId) -> Any:
        """``core``'s actor (forked from the launch's on first use)."""
        actor = self.actors.get(core)
        if actor is None:
            actor = self.actors[core] = self.detector.new_actor(core_name(core), parent=self.root)
        return actor

    def barrier(self, cores: Iterable[CoreId], *, with_root: bool = False) -> None:
        """The actors of ``cores`` (and the launch's, ``with_root``) join each other."""
        actors = [self.actor(c) for c in cores]
        self.detector.barrier([self.root, *actors] if with_root else actors)

    def remember(self) -> None:
        """A run ended without error: a ``MemoDetector`` keeps its log if it was race-free."""
        if self.detector.__class__ is MemoDetector:
            self.detector.remember()
