"""The state one simulated launch keeps, and the lookups every part of it uses.

``Simulation`` (``simulation.py``) is assembled from parts by job, each a class over
this state: the buffers (``sim_buffers.py``), the DMA queue (``sim_dmas.py``) and the
semaphores (``sim_semaphores.py``); ``Simulation`` itself creates the state and runs the
cores. The attributes are declared here (and set in ``Simulation.__init__``) so that
every part is type-checked against the same state.
"""

from __future__ import annotations

import random
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from palladium.race_detect import Actor, RaceDetector
from palladium.shared_memory.buffers import Buffer, BufferRef
from palladium.shared_memory.dma import Dma
from palladium.shared_memory.errors import (
    SimulationError,
    UninitializedReadError,
    UninitializedReadWarning,
    core_name,
)
from palladium.shared_memory.observer import ObserverSet
from palladium.shared_memory.options import DmaOrder, SimulationOptions, Uninitialized
from palladium.shared_memory.partition import Rounds
from palladium.shared_memory.scheduler import Scheduler, Task
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
    dma_order: DmaOrder
    uninitialized: Uninitialized
    bounds: str
    tiling: tuple[int, int]
    tpu_generation: int
    out_of_bounds_hint: str
    _eager: bool
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
    _next_dma: Iterator[int]
    _dmas: list[Dma]
    _cores: list[CoreId]
    _sems: dict[CoreId, dict[int, Semaphore]]
    _next_sem: dict[CoreId, int]
    _rounds: Rounds | None
    _barrier_arrived: list[CoreId]
    _run_cores: list[CoreId]
    _det: RaceDetector | None
    _root: Actor | None
    _actors: dict[CoreId, Actor]
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
        actor = self._actors.get(core)
        if actor is None:
            assert self._det is not None
            actor = self._det.new_actor(core_name(core), parent=self._root)
            self._actors[core] = actor
        return actor

    def _check_core(self, core: Any, what: str = "core") -> CoreId:
        core = (int(core[0]), int(core[1]))
        if core not in self._sems:
            raise SimulationError(
                f"{what} {core_name(core)} does not exist: the simulation has "
                f"{self.num_devices} device(s) x {self.cores_per_device} core(s)"
            )
        return core

    def _buffer(self, buf: BufferRef) -> Buffer:
        b = self._buffers.get(buf.key)
        if b is None:
            raise SimulationError(f"buffer {buf.label} was used after it was freed")
        return b

    def _sem(self, core: CoreId, sem_id: Any) -> Semaphore:
        table = self._sems.get(core)
        if table is None:
            table = self._sems[self._check_core(core)]
        sem_id = int(sem_id)
        sem = table.get(sem_id)
        if sem is not None:
            return sem
        # Not (yet) allocated on this core: ids follow program order, so another core's
        # semaphore with this id is the same program variable.
        for other in self._sems.values():
            twin = other.get(sem_id)
            if twin is not None:
                sem = Semaphore(core, sem_id, twin.kind, twin.name, twin.index)
                table[sem_id] = sem
                return sem
        raise SimulationError(f"{core_name(core)}: semaphore id {sem_id} was never allocated")
