"""The semaphores of one simulated launch: per core, by id (a ``Simulation`` collaborator).

Ids are allocated per core in program order, so the same program gets the same ids on
every core (see ``semaphores``). The table knows which cores exist; it neither schedules
nor tells the race detector anything (``sim_semaphores`` does, over it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from palladium.shared_memory.errors import SimulationError, core_name
from palladium.shared_memory.semaphores import (
    BARRIER_SEMAPHORE_ID,
    Semaphore,
    SemaphoreKind,
    indices_of,
)

__all__ = ["SemaphoreTable", "leak_message"]

CoreId = tuple[int, int]


class SemaphoreTable:
    """Every core's semaphores, by id; each core starts with its barrier semaphore."""

    __slots__ = ("by_core", "next_id", "num_devices", "cores_per_device")

    def __init__(self, cores: Iterable[CoreId], num_devices: int, cores_per_device: int) -> None:
        self.num_devices = num_devices
        self.cores_per_device = cores_per_device
        # core -> {id: Semaphore}; a core not in it does not exist
        self.by_core: dict[CoreId, dict[int, Semaphore]] = {}
        self.next_id: dict[CoreId, int] = {}  # core -> the id its next allocation gets
        for core in cores:
            self.by_core[core] = {BARRIER_SEMAPHORE_ID: Semaphore(
                core, BARRIER_SEMAPHORE_ID, SemaphoreKind.BARRIER, "barrier_semaphore", ())}
            self.next_id[core] = BARRIER_SEMAPHORE_ID + 1

    def check_core(self, core: Any, what: str = "core") -> CoreId:
        """``core`` as a ``(device, core)`` pair of ints; raise if the slice lacks it."""
        core = (int(core[0]), int(core[1]))
        if core not in self.by_core:
            raise SimulationError(
                f"{what} {core_name(core)} does not exist: the simulation has "
                f"{self.num_devices} device(s) x {self.cores_per_device} core(s)"
            )
        return core

    def allocate(self, where: CoreId, kind: SemaphoreKind, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """Allocate an array of semaphores of ``shape`` on core ``where``; their ids."""
        first = self.next_id[where]
        table = self.by_core[where]
        ids = np.arange(first, first + int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
        kind = SemaphoreKind(kind)
        for sem_id, index in zip(ids.tolist(), indices_of(shape)):
            sem = table.get(sem_id)
            if sem is None:
                table[sem_id] = Semaphore(where, sem_id, kind, name, index)
            else:  # signalled remotely before this core allocated it: keep its count
                sem.kind, sem.name, sem.index, sem.info = kind, name, index, None
        self.next_id[where] = first + ids.size
        return ids.reshape(shape)

    def get(self, core: CoreId, sem_id: Any) -> Semaphore:
        """The semaphore ``sem_id`` of ``core``."""
        table = self.by_core.get(core)
        if table is None:
            table = self.by_core[self.check_core(core)]
        sem_id = int(sem_id)
        sem = table.get(sem_id)
        if sem is not None:
            return sem
        # Not (yet) allocated on this core: ids follow program order, so another core's
        # semaphore with this id is the same program variable.
        for other in self.by_core.values():
            twin = other.get(sem_id)
            if twin is not None:
                sem = Semaphore(core, sem_id, twin.kind, twin.name, twin.index)
                table[sem_id] = sem
                return sem
        raise SimulationError(f"{core_name(core)}: semaphore id {sem_id} was never allocated")

    def forget(self, where: CoreId, sems: Iterable[Semaphore]) -> None:
        """Drop ``sems`` from core ``where`` (the end of their ``run_scoped``)."""
        table = self.by_core[where]
        for sem in sems:
            table.pop(sem.id, None)

    def clear(self) -> None:
        """Forget every semaphore of every core (the cores stay): for a client done with
        a finished run, so that its semaphores are freed now by reference counting, not
        by the cyclic collector with the rest of the run (130k at 256 devices, whose
        collection took ~0.13 s more than freeing them)."""
        for table in self.by_core.values():
            table.clear()

    def of_cores(self, cores: Iterable[CoreId]) -> Iterator[Semaphore]:
        """Every semaphore of ``cores``."""
        for core in cores:
            yield from self.by_core[core].values()

    def __iter__(self) -> Iterator[Semaphore]:
        """Every semaphore of every core."""
        for table in self.by_core.values():
            yield from table.values()

    def drop_pending(self) -> None:
        """Forget every semaphore's pending DMAs (all have executed)."""
        for sem in self:
            if sem.pending:
                sem.pending = ()


def leak_message(leaks: Sequence[Semaphore], when: str) -> str:
    """What ``SemaphoreLeakError`` says about ``leaks`` (non-zero counts) ``when``."""
    lines = [f"semaphores with a non-zero count {when}:"]
    for s in leaks:
        lines.append(
            f"  {s.kind.value} semaphore {s.label} (id {s.id}) on {core_name(s.core)}: "
            f"count {s.count}{s.unit}"
        )
    return "\n".join(lines)
