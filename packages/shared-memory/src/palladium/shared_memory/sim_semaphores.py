"""The semaphore operations of a simulated launch (a ``Simulation`` collaborator):
allocation, signal, wait, read, leak checks, over the launch's ``SemaphoreTable``
(``semaphore_table``); a wait makes the DMAs it needs progress (``DmaQueue``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from palladium.shared_memory.dma_queue import DmaQueue
from palladium.shared_memory.errors import SemaphoreLeakError, at_site
from palladium.shared_memory.observer import semaphore_info
from palladium.shared_memory.semaphore_table import SemaphoreTable, leak_message
from palladium.shared_memory.semaphores import (
    BARRIER_SEMAPHORE_ID,
    Semaphore,
    SemaphoreKind,
)
from palladium.shared_memory.sim_state import CoreId, LaunchLinks


class SemaphoreService:
    """Allocate, signal, wait for, read and leak-check the semaphores of ``table``; a
    wait makes the pending DMAs of ``queue`` progress. ``links``: the race detector, a
    partitioned run's rounds, the current scheduler and observers (``LaunchLinks``)."""

    __slots__ = ("actor", "det", "links", "local", "queue", "rounds", "table")

    def __init__(self, table: SemaphoreTable, queue: DmaQueue, links: LaunchLinks) -> None:
        self.table = table
        self.queue = queue
        self.links = links
        self.det, self.actor, self.rounds = links.det, links.actor, links.rounds
        self.local = links.local

    def allocate_semaphores(
        self, device: int, core: int, *, kind: SemaphoreKind, name: str, shape: Any = ()
    ) -> np.ndarray:
        """Allocate an array of semaphores on one core; returns their ids (int64)."""
        where = self.table.check_core((device, core))
        return self.table.allocate(where, kind, name, tuple(int(d) for d in shape))

    def barrier_semaphore(self, device: int) -> int:
        """The id of the device-wide barrier semaphore (the same on every core)."""
        return BARRIER_SEMAPHORE_ID

    def semaphore_signal(self, sem_id: Any, inc: Any, *, core: CoreId, target: CoreId | None = None, site: object = None) -> None:
        """Add ``inc`` to ``sem_id`` on ``target`` (default: the signalling core)."""
        task = getattr(self.local, "task", None)
        self.links.sched.check()
        sem = self.table.get(core if target is None else (int(target[0]), int(target[1])), sem_id)
        clock = self.det.release(self.actor(core)) if self.det is not None else None
        if self.rounds is not None and not self.rounds.is_local(sem.core[0]):
            self.rounds.send_signal(sem.core, sem.id, int(inc), clock)  # another process's
        else:
            sem.signal(int(inc), clock)
        if self.links.obs is not None:
            self.links.obs.semaphore_signal(core, semaphore_info(sem), int(inc))
        self.links.sched.yield_point(task)

    def semaphore_wait(self, sem_id: Any, value: Any, *, core: CoreId, site: object = None) -> None:
        """Block until the count of ``sem_id`` on ``core`` reaches ``value``; subtract it."""
        task = getattr(self.local, "task", None)
        self.links.sched.yield_point(task)
        sem = self.table.get(core, sem_id)
        value = int(value)
        if self.links.obs is not None:
            self.links.obs.semaphore_wait_begin(core, semaphore_info(sem), value)
        while True:
            if sem.count < value and sem.pending:
                self.queue.progress(sem, value)
            if sem.count >= value:
                break
            self.links.sched.block(
                task,
                lambda: sem.count >= value or sem.live > 0,
                lambda: self._describe_wait(sem, value, site),
                sem,
            )
        clocks = sem.take(value)
        if self.det is not None:
            actor = self.actor(core)  # made on first use: in the same order as ever
            if clocks:
                self.det.acquire_all(actor, clocks)
        if self.links.obs is not None:
            self.links.obs.semaphore_wait_end(core, semaphore_info(sem), value)

    def _describe_wait(self, sem: Semaphore, value: int, site: object) -> str:
        kind = "" if sem.kind is SemaphoreKind.REGULAR else f"{sem.kind.value} "
        text = (f"waits on {kind}semaphore {sem.label} (id {sem.id}) for {value}{sem.unit}, "
                f"count {sem.count}{sem.unit}{at_site(site)}")
        if sem.never_reached:  # the likely bug: a wait without its start or its signal
            if sem.kind is SemaphoreKind.DMA:
                text += (f"; no DMA was ever started on {sem.label} and nothing signalled "
                         f"it: start the copy (.start()) before its .wait()")
            else:
                text += (f"; nothing ever signalled {sem.label} (no semaphore_signal, "
                         f"remote signal or DMA reached it)")
        return text

    def semaphore_read(self, sem_id: Any, *, core: CoreId, site: object = None) -> int:
        """The current count of ``sem_id`` on ``core`` (a scheduling point: pending DMAs
        may progress, another core may run)."""
        self.queue.let_one_land(self.links.sched.check)
        self.links.sched.yield_point(getattr(self.local, "task", None), site)
        return self.table.get(core, sem_id).count

    def check_semaphores(self, device: int | None = None) -> None:
        """Raise ``SemaphoreLeakError`` naming every semaphore with a non-zero count.

        Pending DMAs execute first (a DMA nobody waited for leaks its bytes).
        """
        self.queue.flush(self.table)
        cores = [c for c in self.table.by_core if device is None or c[0] == device]
        if self.rounds is not None:  # the other processes check their own
            cores = [c for c in cores if self.rounds.is_local(c[0])]
        leaks = [s for s in self.table.of_cores(cores) if s.count != 0]
        if leaks:
            raise SemaphoreLeakError(leak_message(leaks, "at kernel exit"))

    def free_semaphores(self, ids: Any, *, device: int, core: int, site: object = None) -> None:
        """End of a ``run_scoped``: leak-check and forget the semaphores ``ids``."""
        where = self.table.check_core((device, core))
        sems = [self.table.get(where, i) for i in np.asarray(ids).reshape(-1).tolist()]
        for sem in sems:
            for dma in [d for d in sem.pending if d.signals(sem)]:
                dma.execute_for(sem, self.det)
        leaks = [s for s in sems if s.count != 0]
        self.table.forget(where, sems)
        if leaks:
            raise SemaphoreLeakError(leak_message(leaks, f"at the end of their scope{at_site(site)}"))

    def dma_wait(self, sem_id: Any, nbytes: Any, *, core: CoreId, site: object = None) -> None:
        """Wait until ``nbytes`` bytes arrived on ``sem_id`` and subtract them."""
        self.semaphore_wait(sem_id, nbytes, core=core, site=site)
