"""The race detector's view of one simulated launch (a ``Simulation`` collaborator): the
detector, the launch's own actor, and one actor per core, made on first use."""

from __future__ import annotations

from collections.abc import Iterable

from palladium.race_detect import Actor, OnRace, RaceDetector
from palladium.shared_memory.errors import core_name

__all__ = ["CoreActors"]

CoreId = tuple[int, int]


class CoreActors:
    """A ``RaceDetector`` with the launch's actor (``root``) and each core's."""

    __slots__ = ("actors", "detector", "root")

    def __init__(self, on_race: OnRace) -> None:
        self.detector = RaceDetector(on_race=on_race)
        # The launch itself: forks every core, joins them all at the end of a run.
        self.root: Actor = self.detector.new_actor("kernel launch")
        self.actors: dict[CoreId, Actor] = {}

    def actor(self, core: CoreId) -> Actor:
        """``core``'s actor (forked from the launch's on first use)."""
        actor = self.actors.get(core)
        if actor is None:
            actor = self.actors[core] = self.detector.new_actor(core_name(core), parent=self.root)
        return actor

    def barrier(self, cores: Iterable[CoreId], *, with_root: bool = False) -> None:
        """The actors of ``cores`` (and the launch's, ``with_root``) join each other."""
        actors = [self.actor(c) for c in cores]
        self.detector.barrier([self.root, *actors] if with_root else actors)
