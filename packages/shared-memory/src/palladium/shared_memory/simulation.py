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

import random
import threading
from collections.abc import Callable, Iterable
from typing import Any

from palladium.race_detect import OnRace, RaceDetector, RaceMemo
from palladium.shared_memory.buffers import OUT_OF_BOUNDS_HINT
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
from palladium.shared_memory.scheduler import Scheduler, Task
from palladium.shared_memory.semaphore_table import SemaphoreTable
from palladium.shared_memory.sim_buffers import BufferStore
from palladium.shared_memory.sim_dmas import DmaIssuer
from palladium.shared_memory.sim_semaphores import SemaphoreService
from palladium.shared_memory.sim_state import CoreId, LaunchLinks, UninitializedReports
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


class Simulation:
    """One kernel launch on a simulated TPU slice of ``num_devices`` x ``cores_per_device``.

    See the package's API.md for the contract; every method's docstring says what it
    does. All state is per instance: drop the object after the launch. This object is a
    facade over collaborators it owns, each with its own state and operations:
    ``buffers`` (a ``BufferStore``), ``semaphores`` (a ``SemaphoreTable``, operated on by
    a ``SemaphoreService``), ``dma_queue`` (a ``DmaQueue``, fed by a ``DmaIssuer``),
    ``kernel_barrier`` (a ``KernelBarrier``) and ``races`` (the race detector's
    ``CoreActors``, None unless ``detect_races``). Their public operations are this
    object's attributes, bound once (``sim.read`` is ``sim.buffers.read``): the hot
    paths pay no forwarding call. This class runs the cores.
    """

    __slots__ = (
        "allocate", "allocate_semaphores", "barrier_semaphore", "bounds", "buffers",
        "check_semaphores", "contents", "copy", "cores_per_device", "dma_execution_mode",
        "dma_order", "dma_queue", "dma_start", "dma_wait", "fork_agent", "free", "free_semaphores",
        "grid_point_of", "incref", "initialized", "initialized_mask", "is_allocated",
        "join_agent", "kernel_barrier",
        "mark_written", "set_initialized", "taint", "uninitialized_elements",
        "num_devices", "options", "out_of_bounds", "out_of_bounds_hint", "plan", "races",
        "read", "read_block", "record_access", "report_uninitialized", "seed", "semaphore_read",
        "semaphore_signal", "semaphore_wait", "semaphores", "snapshot_bytes", "swap",
        "tiling", "tpu_generation", "uninitialized", "uninitialized_hint", "watched",
        "uninitialized_reads", "uninitialized_reports", "unwritten", "value", "watchdog",
        "write", "write_block", "_cores", "_det", "_dmas", "_links", "_local", "_obs", "_rng", "_rounds", "_sched",
        "_scheduler_oracle", "_signals", "_trace", "_watchdog_hint",
    )

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
        race_memo: RaceMemo | None = None,
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
        reports = UninitializedReports(options.uninitialized_reads, uninitialized_hint)
        self.uninitialized_reports = reports.reports
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
        self._cores = [(d, c) for d in range(num_devices) for c in range(cores_per_device)]
        # The collaborators: each owns one part of the launch's state.
        self.semaphores = SemaphoreTable(self._cores, num_devices, cores_per_device)
        self.kernel_barrier = KernelBarrier()
        # ``race_memo``: the client's memo of race-free launches (one per kernel); a
        # partitioned run exports its clocks as it makes them, so it detects eagerly.
        memo = race_memo if partition is None else None
        races = self.races = (CoreActors(options.on_race, memo,
                                         (num_devices, cores_per_device, options))
                              if options.detect_races else None)
        self._det = None if races is None else races.detector
        self.dma_queue = DmaQueue(
            eager=options.dma_execution_mode == "eager", order=options.dma_order, rng=self._rng,
            det=self._det, root=None if races is None else races.root)
        # Some devices of a slice simulated by several processes (see ``partition``).
        rounds = self._rounds = (
            None if partition is None else Rounds(self, partition, self._release_barrier))
        self._sched = self._scheduler()
        links = self._links = LaunchLinks(races, rounds, self._local, self._sched, self._obs)
        self.buffers = BufferStore(options, links, check_core=self.semaphores.check_core,
                                   reports=reports, out_of_bounds_hint=out_of_bounds_hint)
        self._signals = SemaphoreService(self.semaphores, self.dma_queue, links)
        self._dmas = DmaIssuer(self.buffers, self.semaphores, self.dma_queue, links, reports)
        # The public operations, bound once (see the class docstring).
        buffers, signals = self.buffers, self._signals
        self.allocate = buffers.allocate
        self.incref = buffers.incref
        self.free = buffers.free
        self.is_allocated = buffers.is_allocated
        self.contents = buffers.contents
        self.record_access = buffers.record_access
        self.watched = buffers.watched
        self.plan = buffers.plan
        self.read = buffers.read
        self.write = buffers.write
        self.swap = buffers.swap
        self.copy = buffers.copy
        self.read_block = buffers.read_block
        self.write_block = buffers.write_block
        self.fork_agent = buffers.fork_agent
        self.join_agent = buffers.join_agent
        self.mark_written = buffers.mark_written
        self.unwritten = buffers.unwritten
        self.uninitialized_elements = buffers.uninitialized_elements
        self.set_initialized = buffers.set_initialized
        self.taint = buffers.taint
        self.initialized = buffers.initialized
        self.initialized_mask = buffers.initialized_mask
        self.report_uninitialized = buffers.report_uninitialized
        self.value = buffers.value
        self.allocate_semaphores = signals.allocate_semaphores
        self.barrier_semaphore = signals.barrier_semaphore
        self.semaphore_signal = signals.semaphore_signal
        self.semaphore_wait = signals.semaphore_wait
        self.semaphore_read = signals.semaphore_read
        self.check_semaphores = signals.check_semaphores
        self.free_semaphores = signals.free_semaphores
        self.dma_wait = signals.dma_wait
        self.dma_start = self._dmas.dma_start

    # -- introspection -------------------------------------------------------------------

    @property
    def race_detector(self) -> RaceDetector | None:
        """The race detector (None unless ``detect_races``); ``.reports`` lists races."""
        return self._det

    @property
    def detects_races(self) -> bool:
        """Whether the race detector is on."""
        return self._det is not None

    def current_core(self) -> CoreId | None:
        """The core whose body runs on this thread (None outside ``run``)."""
        task = getattr(self._local, "task", None)
        return task.core if task is not None else None

    def _task(self) -> Task | None:
        return getattr(self._local, "task", None)

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
        self._set_observers(obs)

    def remove_observer(self, observer: Observer) -> None:
        """Unregister ``observer``."""
        if self._obs is not None:
            self._obs.remove(observer)
            if not self._obs:
                self._set_observers(None)

    def _set_observers(self, obs: ObserverSet | None) -> None:
        """Every part that tells observers now tells ``obs``."""
        self._obs = self._sched.observers = self._links.obs = obs

    def _new_scheduler(self) -> None:
        """A new run's scheduler (a cancelled one would cancel every later call)."""
        self._sched = self._links.sched = self._scheduler()

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
        buffers = list(self.buffers.by_key.values())
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
        barrier = self.kernel_barrier
        participants = barrier.participants or [core]
        if self._obs is not None:
            self._obs.barrier_begin(core)
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
            self.races.barrier(self.kernel_barrier.participants)

    def run(self, bodies: dict[CoreId, Callable[[], None]], *, check_leaks: bool = True) -> None:
        """Run each body as one simulated core, one at a time, until all finish.

        Re-raises the first exception of any body (the others are unwound); raises
        ``DeadlockError`` when every body is blocked; observers hear ``run_failed``. Then pending DMAs execute and, with
        ``check_leaks``, semaphore counts are checked.
        """
        cores = [self.semaphores.check_core(c, "body for") for c in bodies]
        bodies = dict(zip(cores, bodies.values()))
        run_cores = sorted(cores)
        self.kernel_barrier.begin(run_cores)
        if self.races is not None:
            self.races.barrier(run_cores, with_root=True)
        self._new_scheduler()
        if self._obs is not None:
            self._obs.run_begin(tuple(run_cores))
        try:
            try:
                with frozen_heap():  # collections walk only what the run allocates
                    self._sched.run(bodies)
                    if self._rounds is not None:
                        self._rounds.drain()
            finally:
                self.kernel_barrier.end()
                self._new_scheduler()
            self.dma_queue.flush(self.semaphores)
            if self.races is not None:
                self.races.barrier(cores, with_root=True)
            if check_leaks:
                self.check_semaphores()
            if self.races is not None:
                self.races.remember()  # a run without error: its log, if race-free
        except BaseException as e:
            if self._rounds is not None:
                self._rounds.fail(e)
            if self._obs is not None:
                self._obs.run_failed(tuple(sorted(cores)), e)
            raise
        if self._obs is not None:
            self._obs.run_end(tuple(sorted(cores)))
