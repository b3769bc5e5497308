"""The semaphores of a simulated launch: allocation, signal, wait, read, leak checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from palladium.shared_memory.errors import SemaphoreLeakError, at_site, core_name
from palladium.shared_memory.observer import semaphore_info
from palladium.shared_memory.semaphores import (
    BARRIER_SEMAPHORE_ID,
    Semaphore,
    SemaphoreKind,
    indices_of,
)
from palladium.shared_memory.sim_dmas import DmaOps
from palladium.shared_memory.sim_state import CoreId


class SemaphoreOps(DmaOps):
    """``Simulation``'s semaphore operations; a wait makes pending DMAs progress."""

    def allocate_semaphores(
        self, device: int, core: int, *, kind: SemaphoreKind, name: str, shape: Any = ()
    ) -> np.ndarray:
        """Allocate an array of semaphores on one core; returns their ids (int64)."""
        where = self._check_core((device, core))
        shape = tuple(int(d) for d in shape)
        first = self._next_sem[where]
        table = self._sems[where]
        ids = np.arange(first, first + int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
        for sem_id, index in zip(ids.tolist(), indices_of(shape)):
            sem = table.get(sem_id)
            if sem is None:
                table[sem_id] = Semaphore(where, sem_id, SemaphoreKind(kind), name, index)
            else:  # signalled remotely before this core allocated it: keep its count
                sem.kind, sem.name, sem.index = SemaphoreKind(kind), name, index
        self._next_sem[where] = first + ids.size
        return ids.reshape(shape)

    def barrier_semaphore(self, device: int) -> int:
        """The id of the device-wide barrier semaphore (the same on every core)."""
        return BARRIER_SEMAPHORE_ID

    def semaphore_signal(self, sem_id: Any, inc: Any, *, core: CoreId, target: CoreId | None = None, site: object = None) -> None:
        """Add ``inc`` to ``sem_id`` on ``target`` (default: the signalling core)."""
        task = self._task()
        self._sched.check()
        sem = self._sem(core if target is None else (int(target[0]), int(target[1])), sem_id)
        clock = self._det.release(self._actor(core)) if self._det is not None else None
        if self._rounds is not None and not self._rounds.is_local(sem.core[0]):
            self._rounds.send_signal(sem.core, sem.id, int(inc), clock)  # another process's
        else:
            sem.signal(int(inc), clock)
        if self._obs is not None:
            self._obs.semaphore_signal(core, semaphore_info(sem), int(inc))
        self._sched.yield_point(task)

    def semaphore_wait(self, sem_id: Any, value: Any, *, core: CoreId, site: object = None) -> None:
        """Block until the count of ``sem_id`` on ``core`` reaches ``value``; subtract it."""
        task = self._task()
        self._sched.yield_point(task)
        sem = self._sem(core, sem_id)
        value = int(value)
        if self._obs is not None:
            self._obs.semaphore_wait_begin(core, semaphore_info(sem), value)
        while True:
            if sem.count < value and sem.pending:
                self._progress(sem, value)
            if sem.count >= value:
                break
            self._sched.block(
                task,
                lambda: sem.count >= value or sem.live > 0,
                lambda: self._describe_wait(sem, value, site),
                sem,
            )
        clocks = sem.take(value)
        if self._det is not None:
            actor = self._actor(core)
            for clock in clocks:
                self._det.acquire(actor, clock)
        if self._obs is not None:
            self._obs.semaphore_wait_end(core, semaphore_info(sem), value)

    def _describe_wait(self, sem: Semaphore, value: int, site: object) -> str:
        kind = "" if sem.kind is SemaphoreKind.REGULAR else f"{sem.kind.value} "
        return (
            f"waits on {kind}semaphore {sem.label} (id {sem.id}) for {value}{sem.unit}, "
            f"count {sem.count}{sem.unit}{at_site(site)}"
        )

    def semaphore_read(self, sem_id: Any, *, core: CoreId, site: object = None) -> int:
        """The current count of ``sem_id`` on ``core`` (a scheduling point: pending DMAs
        may progress, another core may run)."""
        self._let_dmas_progress()
        self._sched.yield_point(self._task(), site)
        return self._sem(core, sem_id).count

    def check_semaphores(self, device: int | None = None) -> None:
        """Raise ``SemaphoreLeakError`` naming every semaphore with a non-zero count.

        Pending DMAs execute first (a DMA nobody waited for leaks its bytes).
        """
        self._flush_dmas()
        cores = [c for c in self._cores if device is None or c[0] == device]
        if self._rounds is not None:  # the other processes check their own
            cores = [c for c in cores if self._rounds.is_local(c[0])]
        leaks = [s for c in cores for s in self._sems[c].values() if s.count != 0]
        if leaks:
            raise SemaphoreLeakError(self._leak_message(leaks, "at kernel exit"))

    def free_semaphores(self, ids: Any, *, device: int, core: int, site: object = None) -> None:
        """End of a ``run_scoped``: leak-check and forget the semaphores ``ids``."""
        where = self._check_core((device, core))
        sems = [self._sem(where, i) for i in np.asarray(ids).reshape(-1).tolist()]
        for sem in sems:
            for dma in [d for d in sem.pending if d.signals(sem)]:
                dma.execute_for(sem, self._det)
        leaks = [s for s in sems if s.count != 0]
        for sem in sems:
            self._sems[where].pop(sem.id, None)
        if leaks:
            raise SemaphoreLeakError(self._leak_message(leaks, f"at the end of their scope{at_site(site)}"))

    @staticmethod
    def _leak_message(leaks: Sequence[Semaphore], when: str) -> str:
        lines = [f"semaphores with a non-zero count {when}:"]
        for s in leaks:
            lines.append(
                f"  {s.kind.value} semaphore {s.label} (id {s.id}) on {core_name(s.core)}: "
                f"count {s.count}{s.unit}"
            )
        return "\n".join(lines)

    def dma_wait(self, sem_id: Any, nbytes: Any, *, core: CoreId, site: object = None) -> None:
        """Wait until ``nbytes`` bytes arrived on ``sem_id`` and subtract them."""
        self.semaphore_wait(sem_id, nbytes, core=core, site=site)
