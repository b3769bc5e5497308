"""DMAs: a read phase (snapshot the source, signal the send semaphore) and a write phase
(store into the destination, signal the receive semaphore), each its own race-detector
actor forked from the issuing core.
"""

from __future__ import annotations

import enum

import numpy as np

from palladium.shared_memory.buffers import Buffer
from palladium.shared_memory.regions import AccessPlan
from palladium.shared_memory.semaphores import Semaphore

__all__ = ["Dma", "DmaState"]


class DmaState(enum.Enum):
    """Progress of a DMA: started, source read, destination written."""

    STARTED = 0
    READ = 1
    DONE = 2


class Dma:
    """One DMA in flight (owned by a ``Simulation``)."""

    __slots__ = (
        "actor", "core", "data", "dst", "dst_plan", "dst_sem", "id", "name", "nbytes",
        "site", "src", "src_plan", "src_sem", "state",
    )

    def __init__(
        self, dma_id: int, name: str, core, src: Buffer, src_plan: AccessPlan, dst: Buffer,
        dst_plan: AccessPlan, src_sem: Semaphore | None, dst_sem: Semaphore, actor, site,
    ):
        self.id = dma_id
        self.name = name
        self.core = core
        self.src = src
        self.src_plan = src_plan
        self.dst = dst
        self.dst_plan = dst_plan
        self.src_sem = src_sem
        self.dst_sem = dst_sem
        self.actor = actor
        self.site = site
        self.state = DmaState.STARTED
        self.data: np.ndarray | None = None
        self.nbytes = int(np.prod(src_plan.shape, dtype=np.int64)) * src.data.dtype.itemsize

    def signals(self, sem: Semaphore) -> bool:
        """Whether this DMA will still signal ``sem``."""
        if sem is self.dst_sem and self.state is not DmaState.DONE:
            return True
        return sem is self.src_sem and self.state is DmaState.STARTED

    def execute_for(self, sem: Semaphore, det) -> None:
        """Run as far as needed to signal ``sem`` (read only for the send semaphore)."""
        if sem is self.dst_sem:
            self.execute(det)
        else:
            self.execute_read(det)

    def execute_read(self, det) -> None:
        """Read the source and signal the send semaphore with the bytes read."""
        if self.state is not DmaState.STARTED:
            return
        self.data = self.src.read(self.src_plan, False, "DMA read", self.core, self.site)
        clock = None
        if det is not None:
            if self.src_plan.index is not None:
                det.read(self.actor, self.src.ref.key, self.src_plan.index, site=self.site)
            clock = det.release(self.actor)
        self.state = DmaState.READ
        if self.src_sem is not None:
            self.src_sem.signal(self.nbytes, clock)

    def execute(self, det) -> None:
        """Run both phases; signal the receive semaphore with the bytes written."""
        if self.state is DmaState.DONE:
            return
        self.execute_read(det)
        self.dst.write(self.dst_plan, self.data, None, "DMA write", self.core, self.site)
        clock = None
        if det is not None:
            if self.dst_plan.index is not None:
                det.write(self.actor, self.dst.ref.key, self.dst_plan.index, site=self.site)
            clock = det.release(self.actor)
            det.finish(self.actor)
        self.data = None
        self.state = DmaState.DONE
        self.dst_sem.signal(self.nbytes, clock)
