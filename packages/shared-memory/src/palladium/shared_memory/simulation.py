"""The simulated TPU slice of one kernel launch: buffers, semaphores, DMAs, cores.

>>> import numpy as np
>>> from palladium.shared_memory import MemorySpace, SemaphoreKind
>>> sim = Simulation(num_devices=1, cores_per_device=1)
>>> x = sim.allocate(MemorySpace.HBM, 0, 0, name="x", value=np.arange(4.0, dtype=np.float32))
>>> v = sim.allocate(MemorySpace.VMEM, 0, 0, name="v", shape=(4,), dtype=np.float32)
>>> sem = int(sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="sem"))
>>> def body():
...     sim.dma_start(x, None, v, None, core=(0, 0), dst_sem=sem)
...     sim.dma_wait(sem, 16, core=(0, 0))
>>> sim.run({(0, 0): body})
>>> sim.value(v)
array([0., 1., 2., 3.], dtype=float32)
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable, Iterable
from typing import Any

from palladium.race_detect import OnRace, RaceDetector
from palladium.shared_memory.buffers import (
    OUT_OF_BOUNDS_HINT,
    Buffer,
)
from palladium.shared_memory.collector import frozen_heap
from palladium.shared_memory.core_actors import CoreActors
from palladium.shared_memory.dma import DmaState as DmaStep
from palladium.shared_memory.dma_queue import DmaQueue
from palladium.shared_memory.errors import (
    ConfigError,
    at_site,
)
from palladium.shared_memory.kernel_barrier import KernelBarrier
from palladium.shared_memory.observer import Observer, ObserverSet
from palladium.shared_memory.options import (
    Bounds,
    DmaExecutionMode,
    DmaOrder,
    OutOfBounds,
    SimulationOptions,
    Uninitialized,
    UninitializedReads,
)
from palladium.shared_memory.partition import Partition, Rounds
from palladium.shared_memory.scheduler import Scheduler
from palladium.shared_memory.semaphore_table import SemaphoreTable
from palladium.shared_memory.sim_buffers import BufferOps
from palladium.shared_memory.sim_semaphores import SemaphoreOps
from palladium.shared_memory.sim_state import CoreId
from palladium.shared_memory.snapshot import (
    BufferState,
    CoreState,
    DmaState,
    SemaphoreState,
    Snapshot,
    keep_within,
)
from palladium.shared_memory.tpu_facts import (
    GENERATION_DEFAULT,
    TILING_DEFAULT,
)

__all__ = ["CoreId", "Simulation"]

_UNINITIALIZED_HINT = (
    "Write it first (a store, a DMA into it), or pass uninitialized_reads='off'."
)


class Simulation(BufferOps, SemaphoreOps):
    """One kernel launch on a simulated TPU slice of ``num_devices`` x ``cores_per_device``.

    See the package's API.md for the contract; every method's docstring says what it
    does. All state is per instance: drop the object after the launch. The state lives
    in collaborators this object owns: ``semaphores`` (a ``SemaphoreTable``),
    ``dma_queue`` (a ``DmaQueue``), ``kernel_barrier`` (a ``KernelBarrier``) and
    ``races`` (the race detector's ``CoreActors``, None unless ``detect_races``). The
    public operations are written in parts by job (``sim_buffers``, ``sim_semaphores``,
    ``sim_dmas``, over ``sim_state``); this class creates the state and runs the cores.
    """

    def __init__(
        self,
        num_devices: int = 1,
        cores_per_device: int = 1,
        *,
        options: SimulationOptions | None = None,
        seed: int = 0,
        detect_races: bool = False,
        on_race: OnRace = "raise",
        dma_execution_mode: DmaExecutionMode = "on_wait",
        dma_order: DmaOrder = "issue",
        out_of_bounds: OutOfBounds = "raise",
        uninitialized: Uninitialized = "nan",
        bounds: Bounds = "logical",
        tiling: tuple[int, int] = TILING_DEFAULT,
        tpu_generation: int = GENERATION_DEFAULT,
        out_of_bounds_hint: str = OUT_OF_BOUNDS_HINT,
        observers: Iterable[Observer] = (),
        watchdog: float | None = None,
        watchdog_hint: str = "",
        scheduler_oracle: bool = False,
        snapshot_bytes: int | None = None,
        uninitialized_reads: UninitializedReads = "off",
        uninitialized_hint: str = _UNINITIALIZED_HINT,
        partition: Partition | None = None,
    ):
        # ``options`` (a SimulationOptions, as the interpreter passes) or the same
        # choices one keyword each.
        if options is None:
            options = SimulationOptions(
                seed=seed, detect_races=detect_races, on_race=on_race,
                dma_execution_mode=dma_execution_mode, dma_order=dma_order,
                out_of_bounds=out_of_bounds, uninitialized=uninitialized, bounds=bounds,
                tiling=tiling, tpu_generation=tpu_generation, watchdog=watchdog,
                uninitialized_reads=uninitialized_reads,
            )
        if num_devices < 1 or cores_per_device < 1:
            raise ConfigError("a simulation needs at least one device and one core per device")
        self.num_devices = num_devices
        self.cores_per_device = cores_per_device
        self.options = options
        self.seed = options.seed
        self.dma_execution_mode = options.dma_execution_mode
        self.dma_order = options.dma_order
        self.out_of_bounds = options.out_of_bounds
        self.uninitialized = options.uninitialized
        self.bounds = options.bounds
        self.tiling = options.tiling
        self.tpu_generation = options.tpu_generation
        self.out_of_bounds_hint = out_of_bounds_hint
        # Reads of never-written memory (see sim_buffers): tracked per element only when on.
        self.uninitialized_reads = options.uninitialized_reads
        self.uninitialized_hint = uninitialized_hint
        self.uninitialized_reports = []
        self._track_written = options.uninitialized_reads != "off"
        self._phantom_floats = not options.keep_float_data
        self._uninitialized_seen = set()
        self._oob_raise = options.out_of_bounds == "raise"
        self._rng = random.Random(options.seed)
        self._local = threading.local()
        self._trace: list[CoreId] = []
        # None while no observer is registered: every hook site is one ``is not None``.
        self._obs: ObserverSet | None = ObserverSet(observers) or None
        self.watchdog = options.watchdog
        self._watchdog_hint = watchdog_hint
        self._scheduler_oracle = scheduler_oracle
        # A failed run's exception carries ``snapshot`` with contents up to this many
        # bytes (None: no snapshot); ``grid_point_of(core)`` is a client's say of where
        # each core is in its grid (the interpreter's), shown in snapshots and progress.
        self.snapshot_bytes = snapshot_bytes
        self.grid_point_of: Callable[[CoreId], Any] | None = None
        # Some devices of a slice simulated by several processes (see ``partition``).
        self._rounds = None if partition is None else Rounds(self, partition, self._release_barrier)
        self._sched = self._scheduler()
        self._buffers: dict[int, Buffer] = {}
        self._next_key = itertools.count()
        self._cores = [(d, c) for d in range(num_devices) for c in range(cores_per_device)]
        self._run_cores: list[CoreId] = []
        # The collaborators: each owns one part of the launch's state (see sim_state).
        self.semaphores = SemaphoreTable(self._cores, num_devices, cores_per_device)
        self.kernel_barrier = KernelBarrier()
        self.races = CoreActors(options.on_race) if options.detect_races else None
        self._det = None if self.races is None else self.races.detector
        self.dma_queue = DmaQueue(
            eager=options.dma_execution_mode == "eager", order=options.dma_order, rng=self._rng,
            det=self._det, root=None if self.races is None else self.races.root)

    # -- introspection -------------------------------------------------------------------

    @property
    def race_detector(self) -> RaceDetector | None:
        """The race detector (None unless ``detect_races``); ``.reports`` lists races."""
        return self._det

    @property
    def schedule(self) -> list[CoreId]:
        """The cores handed the baton, in order, over every run so far."""
        return list(self._trace)

    @property
    def observers(self) -> ObserverSet | None:
        """The registered observers (None when there are none): a client driving the
        simulation reports its own events (grid steps, block copies, compute) here."""
        return self._obs

    def add_observer(self, observer: Observer) -> None:
        """Register ``observer`` (see ``palladium.shared_memory.observer``)."""
        obs = self._obs if self._obs is not None else ObserverSet()
        obs.add(observer)
        self._obs = obs
        self._sched.observers = obs

    def remove_observer(self, observer: Observer) -> None:
        """Unregister ``observer``."""
        if self._obs is not None:
            self._obs.remove(observer)
            if not self._obs:
                self._obs = None
                self._sched.observers = None

    def _scheduler(self) -> Scheduler:
        sched = Scheduler(self._rng, self._local, self._trace, self._obs,
                          watchdog=self.watchdog, watchdog_hint=self._watchdog_hint,
                          oracle=self._scheduler_oracle)
        if self.snapshot_bytes is not None:
            sched.on_error = self._snapshot_on_error
        if self._rounds is not None:
            sched.on_stall = self._rounds.stall
        return sched

    @property
    def rounds(self) -> Rounds | None:
        """A partitioned run's rounds (how many, messages sent); None otherwise."""
        return self._rounds

    # -- the state, to look at (a failure's snapshot, progress reports) --------------------

    def _snapshot_on_error(self, error: BaseException, task: Any) -> None:
        """The run's first error: keep the state as it is now on the exception (as
        ``error.snapshot``), before the other cores unwind."""
        if getattr(error, "snapshot", None) is None:
            error.snapshot = self.snapshot(  # type: ignore[attr-defined]
                self.snapshot_bytes or 0, failed=task, title=f"simulated state at the failure ({type(error).__name__}):")

    def core_states(self, failed: Any = None) -> list[CoreState]:
        """Each core's state now (``failed``: the scheduler task that raised)."""
        states = self._sched.core_states(failed) if self._sched.tasks else [
            (c, "not running", "") for c in self._cores]
        where = self.grid_point_of
        return [CoreState(c, state, text, None if where is None else where(c))
                for c, state, text in states]

    def dmas_in_flight(self) -> list[DmaState]:
        """The DMAs started and not yet complete, in issue order."""
        return [DmaState(d.name, d.core, "started" if d.state is DmaStep.STARTED else "read",
                         d.nbytes, "" if d.site is None else str(d.site))
                for d in self.dma_queue.in_flight()]

    def snapshot(self, max_bytes: int = 8 << 20, *, failed: Any = None, title: str = "") -> Snapshot:
        """The simulated state now: cores, DMAs in flight, semaphores, and every buffer
        with a copy of its contents while they fit in ``max_bytes`` together."""
        buffers = list(self._buffers.values())
        kept = keep_within(((b.ref.key, b.data) for b in buffers), max_bytes)
        return Snapshot(
            cores=tuple(self.core_states(failed)),
            buffers=tuple(BufferState(b.ref.name, b.ref.space.value, b.ref.device, b.ref.core,
                                      tuple(b.logical), str(b.data.dtype), kept.get(b.ref.key))
                          for b in buffers),
            semaphores=tuple(SemaphoreState(s.label, s.kind.value, s.core[0], s.core[1],
                                            int(s.count)) for s in self.semaphores),
            dmas=tuple(self.dmas_in_flight()),
            title=title,
        )

    # -- running ---------------------------------------------------------------------------

    def yield_point(self, site: object = None) -> None:
        """A scheduling point (``pl.delay``): pending DMAs may progress and the scheduler
        may switch cores."""
        self.dma_queue.let_one_land(self._sched.check)
        self._sched.yield_point(self._task(), site)

    def tick(self, site: object = None) -> None:
        """A point a looping body passes on each iteration (a ``while`` loop): raises
        ``WatchdogError`` once the run outlived ``watchdog`` seconds, naming every
        core's state and where it is (``site``: this core's)."""
        self._sched.tick(self._task(), site)

    def barrier(self, core: CoreId, *, site: object = None) -> None:
        """Wait until every core of the run (all devices) reached the barrier."""
        task = self._task()
        self._sched.check()
        participants = self._run_cores or [core]
        if self._obs is not None:
            self._obs.barrier_begin(core)
        barrier = self.kernel_barrier
        generation = barrier.arrive(core, site)
        if len(barrier.arrived) >= len(participants) and self._rounds is None:
            self._release_barrier()
            if self._obs is not None:
                self._obs.barrier_end(core)
            self._sched.yield_point(task)
            return
        self._sched.block(
            task,
            lambda: barrier.released_since(generation),
            lambda: (
                f"waits at the barrier ({len(barrier.arrived)} of {len(participants)} "
                f"cores arrived){at_site(barrier.sites.get(core))}"
            ),
            barrier.point,
        )
        if self._obs is not None:
            self._obs.barrier_end(core)

    def _release_barrier(self) -> None:
        """Every core of the run is at the barrier (of every process, partitioned)."""
        self.kernel_barrier.release()
        if self.races is not None:
            self.races.barrier(self._run_cores)

    def run(self, bodies: dict[CoreId, Callable[[], None]], *, check_leaks: bool = True) -> None:
        """Run each body as one simulated core, one at a time, until all finish.

        Re-raises the first exception of any body (the others are unwound); raises
        ``DeadlockError`` when every body is blocked; observers hear ``run_failed``. Then pending DMAs execute and, with
        ``check_leaks``, semaphore counts are checked.
        """
        cores = [self._check_core(c, "body for") for c in bodies]
        bodies = dict(zip(cores, bodies.values()))
        self._run_cores = sorted(cores)
        self.kernel_barrier.reset()
        if self.races is not None:
            self.races.barrier(self._run_cores, with_root=True)
        self._sched = self._scheduler()
        if self._obs is not None:
            self._obs.run_begin(tuple(self._run_cores))
        try:
            try:
                with frozen_heap():  # collections walk only what the run allocates
                    self._sched.run(bodies)
                    if self._rounds is not None:
                        self._rounds.drain()
            finally:
                self._run_cores = []
                # A cancelled scheduler would cancel every later call: start afresh.
                self._sched = self._scheduler()
            self.dma_queue.flush(self.semaphores)
            if self.races is not None:
                self.races.barrier(cores, with_root=True)
            if check_leaks:
                self.check_semaphores()
        except BaseException as e:
            if self._rounds is not None:
                self._rounds.fail(e)
            if self._obs is not None:
                self._obs.run_failed(tuple(sorted(cores)), e)
            raise
        if self._obs is not None:
            self._obs.run_end(tuple(sorted(cores)))
