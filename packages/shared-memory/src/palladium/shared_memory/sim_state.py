"""The state one simulated launch keeps, and the lookups every part of it uses.

The state lives in collaborator objects the ``Simulation`` owns, each with its own
declared attributes and methods: the semaphore table (``semaphore_table.SemaphoreTable``),
the DMA queue (``dma_queue.DmaQueue``), the kernel-wide barrier
(``kernel_barrier.KernelBarrier``) and the race detector's actors
(``core_actors.CoreActors``). ``Simulation``'s public operations are written by job
(``sim_buffers.py``, ``sim_dmas.py``, ``sim_semaphores.py``) over the attributes
declared here (set in ``Simulation.__init__``); ``Simulation`` itself runs the cores.
"""

from __future__ import annotations

import random
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from palladium.race_detect import Actor, RaceDetector
from palladium.shared_memory.buffers import Buffer, BufferRef
from palladium.shared_memory.core_actors import CoreActors
from palladium.shared_memory.dma_queue import DmaQueue
from palladium.shared_memory.errors import (
    SimulationError,
    UninitializedReadError,
    UninitializedReadWarning,
)
from palladium.shared_memory.kernel_barrier import KernelBarrier
from palladium.shared_memory.observer import ObserverSet
from palladium.shared_memory.options import SimulationOptions, Uninitialized
from palladium.shared_memory.partition import Rounds
from palladium.shared_memory.scheduler import Scheduler, Task
from palladium.shared_memory.semaphore_table import SemaphoreTable
from palladium.shared_memory.semaphores import Semaphore

__all__ = ["CoreId", "SimulationState", "site_line"]

CoreId = tuple[int, int]

# Reports an ``uninitialized_reads`` launch keeps (``uninitialized_reports``), at most.
_REPORTS_KEPT = 1000


def site_line(site: object) -> str:
    """The source line of ``site`` if it has one (``site.source_line``), else its text:
    what one warning per line is keyed by."""
    line = getattr(site, "source_line", None)
    return str(line) if line else str(site)


class SimulationState:
    """The per-launch state of a ``Simulation`` (see the module docstring)."""

    num_devices: int
    cores_per_device: int
    options: SimulationOptions
    seed: int
    uninitialized: Uninitialized
    bounds: str
    tiling: tuple[int, int]
    tpu_generation: int
    out_of_bounds_hint: str
    _oob_raise: bool
    _rng: random.Random
    _local: threading.local
    _trace: list[CoreId]
    _obs: ObserverSet | None
    watchdog: float | None
    _watchdog_hint: str
    _sched: Scheduler
    _buffers: dict[int, Buffer]
    _next_key: Iterator[int]
    _cores: list[CoreId]
    semaphores: SemaphoreTable
    dma_queue: DmaQueue
    kernel_barrier: KernelBarrier
    races: CoreActors | None  # None unless ``detect_races``
    _det: RaceDetector | None  # races.detector (None unless ``detect_races``)
    _rounds: Rounds | None
    _run_cores: list[CoreId]
    uninitialized_reads: str
    uninitialized_hint: str
    uninitialized_reports: list[str]
    _track_written: bool
    _phantom_floats: bool  # SimulationOptions.keep_float_data is False
    _uninitialized_seen: set[object]

    def _report_uninitialized(self, text: str, key: object, *, hint: bool = True) -> None:
        """Deliver one uninitialised-memory report per ``uninitialized_reads``: raise
        ``UninitializedReadError``, or warn once per ``key`` (buffer and source line).
        Every report is kept in ``uninitialized_reports`` (the first 1000)."""
        if hint and self.uninitialized_hint:
            text = f"{text} {self.uninitialized_hint}"
        if len(self.uninitialized_reports) < _REPORTS_KEPT:
            self.uninitialized_reports.append(text)
        if self.uninitialized_reads == "raise":
            raise UninitializedReadError(text)
        if key not in self._uninitialized_seen:
            self._uninitialized_seen.add(key)
            warnings.warn(UninitializedReadWarning(text), stacklevel=3)

    def current_core(self) -> CoreId | None:
        """The core whose body runs on this thread (None outside ``run``)."""
        task = getattr(self._local, "task", None)
        return task.core if task is not None else None

    def _task(self) -> Task | None:
        return getattr(self._local, "task", None)

    def _actor(self, core: CoreId) -> Actor:
        assert self.races is not None
        return self.races.actor(core)

    def _check_core(self, core: Any, what: str = "core") -> CoreId:
        return self.semaphores.check_core(core, what)

    def _buffer(self, buf: BufferRef) -> Buffer:
        b = self._buffers.get(buf.key)
        if b is None:
            raise SimulationError(f"buffer {buf.label} was used after it was freed")
        return b

    def _sem(self, core: CoreId, sem_id: Any) -> Semaphore:
        return self.semaphores.get(core, sem_id)

    # Names ``partition.Rounds`` (and a test) use: views of the collaborators' state.
    @property
    def _sems(self) -> dict[CoreId, dict[int, Semaphore]]:
        return self.semaphores.by_core

    @property
    def _barrier_arrived(self) -> list[CoreId]:
        return self.kernel_barrier.arrived
