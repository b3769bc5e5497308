"""Semaphores: a count per (core, id), signalled (locally or remotely) and waited on.

Semaphore ids are allocated per core in program order, so the same program gets the
same ids on every core; a remote signal to id ``s`` on another core means "the semaphore
that core allocated as ``s``". Id 0 is every core's barrier semaphore.
"""

from __future__ import annotations

import enum
import math
from typing import Any

from palladium.shared_memory.wait_point import WaitPoint

__all__ = ["BARRIER_SEMAPHORE_ID", "Semaphore", "SemaphoreKind"]

BARRIER_SEMAPHORE_ID = 0


class SemaphoreKind(enum.Enum):
    """REGULAR semaphores count signals, DMA semaphores count bytes, BARRIER is per device."""

    REGULAR = "regular"
    DMA = "DMA"
    BARRIER = "barrier"


class Semaphore(WaitPoint):
    """The count of one semaphore on one core, and what a wait on it will observe.

    ``clocks``: race-detector clocks released by signals not yet observed by a wait
    (only the owning core waits on a semaphore, so a wait observes them all and they are
    dropped). ``pending``: DMAs in flight that will signal this semaphore (and maybe some
    that already did, pruned lazily); ``live``: how many of them still will, kept by the
    DMAs as they progress, so a blocked wait's readiness test is O(1), not a scan.
    As a ``WaitPoint`` it tells the scheduler when ``count`` or ``live`` changes while a
    wait is blocked on it (``signal``, ``take``, ``add_live``: never assign them).
    ``clocks`` and ``pending`` are the empty tuple until something is added
    (``signal``, ``add_pending``): a launch may allocate tens of thousands of semaphores
    that live as long as it, and every list is one more object for the collector.
    """

    __slots__ = ("clocks", "core", "count", "id", "index", "info", "kind", "live", "name",
                 "pending", "signalled")

    def __init__(self, core: Any, sem_id: int, kind: SemaphoreKind, name: str, index: tuple[int, ...]) -> None:
        super().__init__()
        self.core = core
        self.id = sem_id
        self.kind = kind
        self.name = name
        self.index = index
        self.count = 0
        self.clocks: list | tuple = ()
        self.pending: list | tuple = ()
        self.live = 0
        self.signalled = False  # ever, by anyone (a DMA landing included)
        self.info: Any = None  # the observers' view of it, made once (``semaphore_info``)

    @property
    def label(self) -> str:
        """``'sems[1]'``: the semaphore as the user named it (with its index)."""
        if not self.index:
            return f"'{self.name}'"
        return f"'{self.name}[{', '.join(map(str, self.index))}]'"

    @property
    def unit(self) -> str:
        """``" bytes"`` for DMA semaphores, else empty."""
        return " bytes" if self.kind is SemaphoreKind.DMA else ""

    def signal(self, inc: int, clock: Any) -> None:
        """Add ``inc``; ``clock`` (or None) is the signaller's released clock."""
        self.count += inc
        self.signalled = True
        if clock is not None:
            if self.clocks:
                self.clocks.append(clock)  # type: ignore[union-attr]
            else:
                self.clocks = [clock]
        if self.waiting:
            self.changed()

    @property
    def never_reached(self) -> bool:
        """Whether nothing ever signalled this semaphore and no DMA was ever started
        on it (``pending`` stays the empty tuple until one is)."""
        return not self.signalled and type(self.pending) is tuple

    def take(self, value: int) -> list | tuple:
        """Subtract ``value``; return the clocks a wait observes (and forget them)."""
        self.count -= value
        clocks = self.clocks
        if clocks:
            self.clocks = ()
        if self.waiting:
            self.changed()
        return clocks

    def add_pending(self, dma: Any) -> None:
        """``dma`` will signal this semaphore (``live`` is counted apart: ``add_live``)."""
        if self.pending:
            self.pending.append(dma)  # type: ignore[union-attr]
        else:
            self.pending = [dma]

    def add_live(self, delta: int) -> None:
        """A DMA that will still signal this semaphore was queued (+1) or did (-1)."""
        self.live += delta
        if self.waiting:
            self.changed()


def indices_of(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Row-major indices of an array of ``shape`` (``[()]`` for a scalar)."""
    out: list[tuple[int, ...]] = [()]
    for n in shape:
        out = [i + (k,) for i in out for k in range(n)]
    return out if math.prod(shape) else []
