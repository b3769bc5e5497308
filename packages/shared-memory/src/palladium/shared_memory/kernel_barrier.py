"""The kernel-wide barrier of one simulated launch (a ``Simulation`` collaborator): the
cores of the run (who takes part), which arrived, where, and the generation the blocked
ones wait to change."""

from __future__ import annotations

from palladium.shared_memory.wait_point import WaitPoint

__all__ = ["KernelBarrier"]

CoreId = tuple[int, int]


class KernelBarrier:
    """Cores arrive; once all the run's cores are there, ``release`` lets them go."""

    __slots__ = ("arrived", "generation", "participants", "point", "sites")

    def __init__(self) -> None:
        self.generation = 0  # +1 at every release: what a blocked core waits to change
        self.point = WaitPoint()  # the cores blocked at the barrier wait here
        self.arrived: list[CoreId] = []  # the cores at the barrier now
        self.sites: dict[CoreId, object] = {}  # where each core last arrived
        self.participants: list[CoreId] = []  # the cores of the run now (sorted)

    def arrive(self, core: CoreId, site: object) -> int:
        """``core`` is at the barrier (at ``site``); the generation it waits to end."""
        self.arrived.append(core)
        self.sites[core] = site
        return self.generation

    def released_since(self, generation: int) -> bool:
        """Whether the barrier of ``generation`` was released."""
        return self.generation != generation

    def release(self) -> None:
        """Every core arrived: start the next generation, wake the waiting cores."""
        self.arrived = []
        self.generation += 1
        self.point.changed()

    def begin(self, cores: list[CoreId]) -> None:
        """A run of ``cores`` (sorted) starts: they take part, nobody is there yet."""
        self.participants = cores
        self.arrived = []

    def end(self) -> None:
        """The run ended: nobody takes part."""
        self.participants = []
