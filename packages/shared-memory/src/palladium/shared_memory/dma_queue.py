"""The DMAs in flight of one simulated launch, and when they progress (a ``Simulation``
collaborator).

In ``on_wait`` mode a started DMA waits here, in issue order, until a wait on one of its
semaphores needs it (``progress``), a polling point lets one land (``let_one_land``), or
the run ends (``flush``). ``eager`` DMAs never queue. ``dma_order="random"`` picks among
the pending ones with the simulation's seeded RNG.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from palladium.race_detect import Actor, RaceDetector
from palladium.shared_memory.dma import Dma, DmaState
from palladium.shared_memory.semaphore_table import SemaphoreTable
from palladium.shared_memory.semaphores import Semaphore

__all__ = ["DmaQueue"]

_PRUNE_AT = 256  # the shortest pending list ``DmaQueue.add`` prunes


class DmaQueue:
    """The pending DMAs of a launch (``on_wait`` mode), in issue order."""

    __slots__ = ("det", "eager", "ids", "order", "pending", "prune_at", "rng", "root")

    def __init__(self, *, eager: bool, order: str, rng: random.Random,
                 det: RaceDetector | None, root: Actor | None) -> None:
        self.pending: list[Dma] = []  # may still hold DMAs that completed (pruned lazily)
        self.prune_at = _PRUNE_AT  # ``add`` prunes ``pending`` when it is this long
        self.ids = itertools.count()  # the next DMA's number
        self.eager = eager  # DMAs execute when started, never queue
        self.order = order  # "issue" or "random" (see the module docstring)
        self.rng = rng
        self.det = det  # the race detector (None: off) each DMA tells what it does
        self.root = root  # the launch's race-detector actor: joins every flushed DMA

    def next_id(self) -> int:
        """A new DMA's number."""
        return next(self.ids)

    def add(self, dma: Dma) -> None:
        """``dma`` was started: execute it now (eager) or queue it until needed."""
        if self.eager:
            dma.execute(self.det)
            return
        pending = self.pending
        if len(pending) >= self.prune_at:
            # Completed DMAs leave the list now and then (it keeps its order), so that
            # they are freed soon after they complete, not all at the end of the run (a
            # ring at 256 devices: 65,280 DMAs, each surviving the run's collections).
            pending = self.pending = self.in_flight()
            self.prune_at = max(2 * len(pending), _PRUNE_AT)
        pending.append(dma)
        dma.queue()

    def in_flight(self) -> list[Dma]:
        """The DMAs started and not yet complete, in issue order."""
        return [d for d in self.pending if d.state is not DmaState.DONE]

    def progress(self, sem: Semaphore, value: int) -> None:
        """Execute pending DMAs that signal ``sem`` until its count reaches ``value``.

        With ``order="random"`` any other pending DMA (on any semaphore, core or device)
        may complete first, as on hardware: completion order is explored across
        semaphores, not only among the DMAs of the one waited for.
        """
        det = self.det
        while sem.count < value:
            candidates = [d for d in sem.pending if d.signals(sem)]
            sem.pending = candidates
            if not candidates:
                return
            if self.order != "random":
                first = candidates[0]
                first.execute_for(sem, det)
                if sem.count >= value:  # done: forget what no longer signals it (only
                    # the DMA that ran can have stopped: the others did not change)
                    sem.pending = (candidates if first.signals(sem) else
                                   candidates[1:]) or ()
                continue
            self.pending = self.in_flight()
            waited = {d.id for d in candidates}
            others = [d for d in self.pending if d.id not in waited]
            pick = self.rng.randrange(len(candidates) + len(others))
            if pick < len(candidates):
                candidates[pick].execute_for(sem, det)
            else:
                others[pick - len(candidates)].execute(det)

    def flush(self, semaphores: SemaphoreTable) -> None:
        """Execute every pending DMA (end of the run), in issue or random order."""
        pending = self.in_flight()
        self.pending = []
        if self.order == "random":
            self.rng.shuffle(pending)
        det, root = self.det, self.root
        for dma in pending:
            dma.execute(det)
            if det is not None and root is not None:
                det.join(root, dma.actor)
        semaphores.drop_pending()

    def let_one_land(self, check: Any) -> None:
        """On hardware a DMA in flight lands on its own, waited for or not, so a core
        polling its destination or a semaphore (with ``pl.delay``, ``semaphore_read``)
        must eventually see it. In ``on_wait`` mode, at each such point one pending DMA
        completes with probability 1/2 (seeded): the oldest, or with
        ``order="random"`` any one. ``check()`` raises if the run was cancelled."""
        if self.eager or not self.pending:
            return
        check()
        pending = self.pending = self.in_flight()
        if not pending or self.rng.random() < 0.5:
            return
        random_order = self.order == "random" and len(pending) > 1
        dma = pending[self.rng.randrange(len(pending))] if random_order else pending[0]
        dma.execute(self.det)
