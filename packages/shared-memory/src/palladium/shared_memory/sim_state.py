"""What the operation collaborators of one simulated launch share: core ids, where an
access happened, and the launch's reports of never-written memory.

The ``Simulation`` is a facade over collaborators that each own one part of the launch:
the buffers (``sim_buffers.BufferStore``), the semaphore operations
(``sim_semaphores.SemaphoreService``, over the ``semaphore_table.SemaphoreTable``), the
DMA starts (``sim_dmas.DmaIssuer``, into the ``dma_queue.DmaQueue``), the kernel-wide
barrier (``kernel_barrier.KernelBarrier``) and the race detector's actors
(``core_actors.CoreActors``). ``UninitializedReports`` is the one the buffers and the
DMAs both report to.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections.abc import Callable

from palladium.race_detect import Actor
from palladium.shared_memory.core_actors import CoreActors
from palladium.shared_memory.errors import UninitializedReadError, UninitializedReadWarning
from palladium.shared_memory.observer import ObserverSet
from palladium.shared_memory.partition import Rounds
from palladium.shared_memory.scheduler import Scheduler

__all__ = ["CoreId", "LaunchLinks", "UninitializedOrigin", "UninitializedReports", "no_actor",
           "site_line"]

CoreId = tuple[int, int]

# Reports an ``uninitialized_reads`` launch keeps (``uninitialized_reports``), at most.
_REPORTS_KEPT = 1000


def site_line(site: object) -> str:
    """The source line of ``site`` if it has one (``site.source_line``), else its text:
    what one warning per line is keyed by."""
    line = getattr(site, "source_line", None)
    return str(line) if line else str(site)


def no_actor(core: CoreId) -> Actor:
    """A collaborator's actor lookup without the race detector: never called (every
    caller checks for the detector first)."""
    raise AssertionError(f"no race detector: core {core} has no actor")


class LaunchLinks:
    """What every operation collaborator of a launch reaches: the race detector (``det``,
    None: off) and each core's actor, a partitioned run's ``rounds`` (None: one
    process), the thread-local whose ``task`` is the core running on this thread, and
    the current scheduler and observers (``sched``, ``obs``: the ``Simulation`` replaces
    them, here, for every collaborator at once)."""

    __slots__ = ("actor", "det", "local", "obs", "rounds", "sched")

    def __init__(self, races: CoreActors | None, rounds: Rounds | None,
                 local: threading.local, sched: Scheduler, obs: ObserverSet | None) -> None:
        self.det = None if races is None else races.detector
        self.actor: Callable[[CoreId], Actor] = no_actor if races is None else races.actor
        self.rounds = rounds
        self.local = local
        self.sched = sched
        self.obs = obs


@dataclasses.dataclass(frozen=True)
class UninitializedOrigin:
    """Where uninitialised data came from (``uninitialized_reads="on_use"``): ``what``
    was read (``"'s' (VMEM, device 0 core 0) region [0:8, 0:128]"``) at ``site`` (an
    access site: kernel, grid point, core, line), and why it holds no data: ``kind`` is
    ``"never written"``, ``"padding"`` (the rows a block copy brought in past the end
    of its source array: on a TPU, whatever VMEM held) or ``"stored"`` (a store at
    ``site`` wrote data derived from ``source``, the read it goes back to, into
    ``what``)."""

    what: str
    site: object
    kind: str = "never written"
    source: UninitializedOrigin | None = None


class UninitializedReports:
    """The launch's reports of never-written memory (``uninitialized_reads``)."""

    __slots__ = ("hint", "mode", "reports", "seen")

    def __init__(self, mode: str, hint: str) -> None:
        self.mode = mode  # "off", "on_use", "warn" or "raise"
        self.hint = hint  # appended to the simulation's own reports
        self.reports: list[str] = []  # every report (the first 1000)
        self.seen: set[object] = set()  # the keys warned of already

    def report(self, text: str, key: object, *, hint: bool = True) -> None:
        """Deliver one report per ``mode``: raise ``UninitializedReadError``, or warn once
        per ``key`` (buffer and source line). Every report is kept in ``reports``."""
        if hint and self.hint:
            text = f"{text} {self.hint}"
        if len(self.reports) < _REPORTS_KEPT:
            self.reports.append(text)
        if self.mode == "raise":
            raise UninitializedReadError(text)
        if key not in self.seen:
            self.seen.add(key)
            warnings.warn(UninitializedReadWarning(text), stacklevel=3)
