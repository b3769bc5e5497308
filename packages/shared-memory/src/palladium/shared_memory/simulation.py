"""The simulated TPU slice of one kernel launch: buffers, semaphores, DMAs, cores.

>>> import numpy as np
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
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from palladium.race_detect import RaceDetector
from palladium.shared_memory.buffers import (
    OUT_OF_BOUNDS_HINT,
    Buffer,
    BufferRef,
    MemorySpace,
    outside_mask,
    stored_mask,
)
from palladium.shared_memory.dma import Dma, DmaState, DmaView
from palladium.shared_memory.errors import (
    SemaphoreLeakError,
    SimulationError,
    at_site,
    core_name,
)
from palladium.shared_memory.observer import Observer, ObserverSet, dma_event, semaphore_info
from palladium.shared_memory.regions import describe_region
from palladium.shared_memory.scheduler import Scheduler, Task
from palladium.shared_memory.semaphores import (
    BARRIER_SEMAPHORE_ID,
    Semaphore,
    SemaphoreKind,
    indices_of,
)
from palladium.shared_memory.tpu_facts import (
    GENERATION_DEFAULT,
    TILING_DEFAULT,
    padded_shape,
    uninitialized_value,
)

__all__ = ["CoreId", "Simulation"]

CoreId = tuple[int, int]

_ELLIPSIS = (Ellipsis,)

_CHOICES = {
    "dma_execution_mode": ("on_wait", "eager"),
    "dma_order": ("issue", "random"),
    "out_of_bounds": ("raise", "uninitialized"),
    "uninitialized": ("nan", "zero"),
    "bounds": ("logical", "padded"),
}


class Simulation:
    """One kernel launch on a simulated TPU slice of ``num_devices`` x ``cores_per_device``.

    See the package's API.md for the contract; every method's docstring says what it
    does. All state is per instance: drop the object after the launch.
    """

    def __init__(
        self,
        num_devices: int = 1,
        cores_per_device: int = 1,
        *,
        seed: int = 0,
        detect_races: bool = False,
        on_race="raise",
        dma_execution_mode: str = "on_wait",
        dma_order: str = "issue",
        out_of_bounds: str = "raise",
        uninitialized: str = "nan",
        bounds: str = "logical",
        tiling: tuple[int, int] = TILING_DEFAULT,
        tpu_generation: int = GENERATION_DEFAULT,
        out_of_bounds_hint: str = OUT_OF_BOUNDS_HINT,
        observers: Iterable[Observer] = (),
        watchdog: float | None = None,
        watchdog_hint: str = "",
    ):
        options = dict(
            dma_execution_mode=dma_execution_mode, dma_order=dma_order,
            out_of_bounds=out_of_bounds, uninitialized=uninitialized, bounds=bounds,
        )
        for option, value in options.items():
            if value not in _CHOICES[option]:
                raise ValueError(f"{option} must be one of {_CHOICES[option]}, got {value!r}")
        if num_devices < 1 or cores_per_device < 1:
            raise ValueError("a simulation needs at least one device and one core per device")
        self.num_devices = num_devices
        self.cores_per_device = cores_per_device
        self.seed = seed
        self.dma_execution_mode = dma_execution_mode
        self.dma_order = dma_order
        self.out_of_bounds = out_of_bounds
        self.uninitialized = uninitialized
        self.bounds = bounds
        self.tiling = tiling
        self.tpu_generation = tpu_generation
        self.out_of_bounds_hint = out_of_bounds_hint
        self._eager = dma_execution_mode == "eager"
        self._oob_raise = out_of_bounds == "raise"
        self._rng = random.Random(seed)
        self._local = threading.local()
        self._trace: list[CoreId] = []
        # None while no observer is registered: every hook site is one ``is not None``.
        self._obs: ObserverSet | None = ObserverSet(observers) or None
        self.watchdog = watchdog  # seconds a run may take before WatchdogError (None: any)
        self._watchdog_hint = watchdog_hint
        self._sched = self._scheduler()
        self._buffers: dict[int, Buffer] = {}
        self._next_key = itertools.count()
        self._next_dma = itertools.count()
        self._dmas: list[Dma] = []  # pending DMAs (on_wait mode), in issue order
        self._cores = [(d, c) for d in range(num_devices) for c in range(cores_per_device)]
        self._sems: dict[CoreId, dict[int, Semaphore]] = {}
        self._next_sem: dict[CoreId, int] = {}
        for core in self._cores:
            self._sems[core] = {
                BARRIER_SEMAPHORE_ID: Semaphore(
                    core, BARRIER_SEMAPHORE_ID, SemaphoreKind.BARRIER, "barrier_semaphore", ()
                )
            }
            self._next_sem[core] = BARRIER_SEMAPHORE_ID + 1
        self._barrier_generation = 0
        self._barrier_arrived: list[CoreId] = []
        self._barrier_sites: dict[CoreId, object] = {}
        self._run_cores: list[CoreId] = []
        self._det = RaceDetector(on_race=on_race) if detect_races else None
        self._root = self._det.new_actor("kernel launch") if self._det is not None else None
        self._actors: dict[CoreId, object] = {}

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
        return Scheduler(self._rng, self._local, self._trace, self._obs,
                         watchdog=self.watchdog, watchdog_hint=self._watchdog_hint)

    def current_core(self) -> CoreId | None:
        """The core whose body runs on this thread (None outside ``run``)."""
        task = getattr(self._local, "task", None)
        return task.core if task is not None else None

    def _task(self) -> Task | None:
        return getattr(self._local, "task", None)

    def _actor(self, core: CoreId):
        actor = self._actors.get(core)
        if actor is None:
            assert self._det is not None
            actor = self._det.new_actor(core_name(core), parent=self._root)
            self._actors[core] = actor
        return actor

    def _check_core(self, core, what: str = "core") -> CoreId:
        core = (int(core[0]), int(core[1]))
        if core not in self._sems:
            raise SimulationError(
                f"{what} {core_name(core)} does not exist: the simulation has "
                f"{self.num_devices} device(s) x {self.cores_per_device} core(s)"
            )
        return core

    # -- buffers ---------------------------------------------------------------------------

    def allocate(
        self,
        space: MemorySpace,
        device: int,
        core: int,
        *,
        name: str,
        shape=None,
        dtype=None,
        value: np.ndarray | None = None,
        fill: str | None = None,
    ) -> BufferRef:
        """Allocate a buffer holding a copy of ``value``, else uninitialised memory.

        HBM belongs to the device (``core`` is ignored); VMEM and SMEM to one core.
        """
        space = MemorySpace(space)
        core = 0 if space is MemorySpace.HBM else int(core)
        self._check_core((device, core))
        if value is not None:
            data = np.array(value, dtype=dtype, copy=True)
            if shape is not None and tuple(shape) != data.shape:
                raise ValueError(f"buffer '{name}': value has shape {data.shape}, not {tuple(shape)}")
        else:
            if shape is None or dtype is None:
                raise ValueError(f"buffer '{name}': give a value, or a shape and a dtype")
            dtype = np.dtype(dtype)
            data = np.full(tuple(int(d) for d in shape),
                           uninitialized_value(dtype, fill or self.uninitialized), dtype)
        bound = data.shape
        if self.bounds == "padded" and space is not MemorySpace.SMEM:
            bound = padded_shape(data.shape, data.dtype, self.tiling,
                                 generation=self.tpu_generation)
        key = next(self._next_key)
        ref = BufferRef(key, space, int(device), core, name, data.shape, data.dtype)
        self._buffers[key] = Buffer(
            ref, data, bound, uninitialized_value(data.dtype, fill or self.uninitialized),
            self.out_of_bounds_hint,
        )
        if self._det is not None:
            self._det.register_buffer(key, data.shape, f"{name} ({ref.where})")
        if self._obs is not None:
            self._obs.allocate(ref, data.nbytes, (int(device), core))
        return ref

    def _buffer(self, buf: BufferRef) -> Buffer:
        b = self._buffers.get(buf.key)
        if b is None:
            raise SimulationError(f"buffer {buf.label} was used after it was freed")
        return b

    def incref(self, buf: BufferRef) -> None:
        """One more owner of ``buf``: it survives one more ``free``."""
        self._buffer(buf).refcount += 1

    def free(self, buf: BufferRef) -> None:
        """Drop one reference; the last one deallocates the buffer."""
        b = self._buffer(buf)
        b.refcount -= 1
        if b.refcount == 0:
            del self._buffers[buf.key]
            if self._det is not None:
                self._det.free_buffer(buf.key)
            if self._obs is not None:
                self._obs.free(buf, b.data.nbytes, (buf.device, buf.core))

    def is_allocated(self, buf: BufferRef) -> bool:
        """Whether ``buf`` has not been freed yet."""
        return buf.key in self._buffers

    def read(self, buf: BufferRef, region, *, mask=None, core: CoreId, site=None) -> np.ndarray:
        """A copy of ``buf[region]`` as read by ``core``.

        With ``mask`` (broadcastable to the region's shape) only the True elements are
        read: a False element may lie out of bounds (it reads the fill), and the race
        detector sees only the True ones.
        """
        b = self._buffers.get(buf.key) or self._buffer(buf)
        plan = b.plan(region)
        if plan.full:  # the common case, inlined: the interpreter reads on every load
            out = b.data[plan.index + _ELLIPSIS].copy()
        else:
            out = b.read(plan, self._oob_raise, "read", core, site, mask)
        if self._det is not None and plan.index is not None:
            if mask is None:
                self._det.read(self._actor(core), buf.key, plan.index, site=site)
            else:
                sub = stored_mask(plan, mask)
                if sub.any():
                    shape = b.data[plan.index + _ELLIPSIS].shape
                    self._det.read(self._actor(core), buf.key, plan.index, site=site,
                                   mask=np.broadcast_to(sub, shape))
        return out

    def write(self, buf: BufferRef, region, value, *, mask=None, core: CoreId, site=None) -> None:
        """Store ``value`` into ``buf[region]`` (only where ``mask`` is True)."""
        b = self._buffers.get(buf.key) or self._buffer(buf)
        plan = b.plan(region)
        mask = b.write(plan, value, mask, "write", core, site)
        if self._det is not None and plan.index is not None:
            self._race_write(core, buf.key, plan, mask, site)

    def swap(self, buf: BufferRef, region, value, *, mask=None, core: CoreId, site=None) -> np.ndarray:
        """Store ``value`` (where ``mask``) into ``buf[region]``; return the old contents."""
        b = self._buffers.get(buf.key) or self._buffer(buf)
        plan = b.plan(region)
        old, mask = b.swap(plan, value, mask, core, site)
        if self._det is not None and plan.index is not None:
            self._race_write(core, buf.key, plan, mask, site)
        return old

    def _race_write(self, core, key, plan, mask, site) -> None:
        assert self._det is not None
        if mask is None:
            self._det.write(self._actor(core), key, plan.index, site=site)
        elif mask.any():
            shape = self._buffers[key].data[plan.index + (Ellipsis,)].shape
            self._det.write(self._actor(core), key, plan.index, site=site,
                            mask=np.broadcast_to(mask, shape))

    def value(self, buf: BufferRef) -> np.ndarray:
        """The whole logical contents of ``buf`` (a copy; no race check)."""
        return self._buffer(buf).data.copy()

    # -- semaphores ------------------------------------------------------------------------

    def allocate_semaphores(
        self, device: int, core: int, *, kind: SemaphoreKind, name: str, shape=()
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

    def _sem(self, core: CoreId, sem_id) -> Semaphore:
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

    def barrier_semaphore(self, device: int) -> int:
        """The id of the device-wide barrier semaphore (the same on every core)."""
        return BARRIER_SEMAPHORE_ID

    def semaphore_signal(self, sem_id, inc, *, core: CoreId, target: CoreId | None = None, site=None) -> None:
        """Add ``inc`` to ``sem_id`` on ``target`` (default: the signalling core)."""
        task = self._task()
        self._sched.check()
        sem = self._sem(core if target is None else (int(target[0]), int(target[1])), sem_id)
        clock = self._det.release(self._actor(core)) if self._det is not None else None
        sem.signal(int(inc), clock)
        if self._obs is not None:
            self._obs.semaphore_signal(core, semaphore_info(sem), int(inc))
        self._sched.yield_point(task)

    def semaphore_wait(self, sem_id, value, *, core: CoreId, site=None) -> None:
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
            )
        clocks = sem.take(value)
        if self._det is not None:
            actor = self._actor(core)
            for clock in clocks:
                self._det.acquire(actor, clock)
        if self._obs is not None:
            self._obs.semaphore_wait_end(core, semaphore_info(sem), value)

    def _describe_wait(self, sem: Semaphore, value: int, site) -> str:
        kind = "" if sem.kind is SemaphoreKind.REGULAR else f"{sem.kind.value} "
        return (
            f"waits on {kind}semaphore {sem.label} (id {sem.id}) for {value}{sem.unit}, "
            f"count {sem.count}{sem.unit}{at_site(site)}"
        )

    def semaphore_read(self, sem_id, *, core: CoreId, site=None) -> int:
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
        leaks = [s for c in cores for s in self._sems[c].values() if s.count != 0]
        if leaks:
            raise SemaphoreLeakError(self._leak_message(leaks, "at kernel exit"))

    def free_semaphores(self, ids, *, device: int, core: int, site=None) -> None:
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

    # -- DMAs ------------------------------------------------------------------------------

    def dma_start(
        self,
        src: BufferRef,
        src_region,
        dst: BufferRef,
        dst_region,
        *,
        core: CoreId,
        dst_sem,
        src_sem=None,
        dst_core: CoreId | None = None,
        site=None,
        name: str | None = None,
        view: DmaView | None = None,
        add: bool = False,
    ) -> None:
        """Start copying ``src[src_region]`` into ``dst[dst_region]`` (see API.md); with
        ``add`` the destination accumulates (``dst += src``) instead."""
        task = self._task()
        self._sched.check()
        sb, db = self._buffer(src), self._buffer(dst)
        sp, dp = sb.plan(src_region), db.plan(dst_region)
        if view is None and sp.shape != dp.shape:
            raise ValueError(
                f"{core_name(core)}: DMA from {src.label}{describe_region(src_region)} (shape "
                f"{sp.shape}) to {dst.label}{describe_region(dst_region)} (shape {dp.shape}): "
                f"the shapes differ{at_site(site)}"
            )
        if view is None and sb.data.dtype != db.data.dtype:
            # A DMA moves bytes: it never converts values (a view's ``convert`` may).
            raise ValueError(
                f"{core_name(core)}: DMA from {src.label} ({sb.data.dtype}) to {dst.label} "
                f"({db.data.dtype}): the dtypes differ; a DMA copies bytes{at_site(site)}"
            )
        src_mask = None if view is None else view.src_mask
        dst_mask = None if view is None else view.dst_mask
        if sp.oob and self._oob_raise and (src_mask is None or outside_mask(sp, src_mask).any()):
            raise sb.oob_error("DMA read", sp, core, site, hint=True)
        db.check_write_bounds(dp, dst_mask, "DMA write", core, site)
        if dst_core is None:
            # Like the reference: the same core index on the destination's device.
            dst_core = core if dst.device == core[0] else (dst.device, core[1])
        dst_core = (int(dst_core[0]), int(dst_core[1]))
        dsem = self._sem(dst_core, dst_sem)
        ssem = self._sem(core, src_sem) if src_sem is not None else None
        dma_id = next(self._next_dma)
        if name is None:
            name = f"DMA #{dma_id} {src.name}->{dst.name}"
        actor = None
        if self._det is not None:
            actor = self._det.new_actor(name, parent=self._actor(core))
        dma = Dma(dma_id, name, core, sb, sp, db, dp, ssem, dsem, actor, site, view, add)
        if self._obs is not None:
            event = dma_event(dma, dst_core)
            self._obs.dma_start(event)
            dma.on_done = lambda obs=self._obs: obs.dma_complete(event)
        if self._eager:
            dma.execute(self._det)
        else:
            self._dmas.append(dma)
            dma.queue()
        self._sched.yield_point(task)

    def dma_wait(self, sem_id, nbytes, *, core: CoreId, site=None) -> None:
        """Wait until ``nbytes`` bytes arrived on ``sem_id`` and subtract them."""
        self.semaphore_wait(sem_id, nbytes, core=core, site=site)

    def _progress(self, sem: Semaphore, value: int) -> None:
        """Execute pending DMAs that signal ``sem`` until its count reaches ``value``.

        With ``dma_order="random"`` any other pending DMA (on any semaphore, core or
        device) may complete first, as on hardware: completion order is explored across
        semaphores, not only among the DMAs of the one waited for.
        """
        while sem.count < value:
            candidates = [d for d in sem.pending if d.signals(sem)]
            sem.pending = candidates
            if not candidates:
                return
            if self.dma_order != "random":
                candidates[0].execute_for(sem, self._det)
                continue
            self._dmas = [d for d in self._dmas if d.state is not DmaState.DONE]
            waited = {d.id for d in candidates}
            others = [d for d in self._dmas if d.id not in waited]
            pick = self._rng.randrange(len(candidates) + len(others))
            if pick < len(candidates):
                candidates[pick].execute_for(sem, self._det)
            else:
                others[pick - len(candidates)].execute(self._det)

    def _flush_dmas(self) -> None:
        """Execute every pending DMA (end of the run), in issue or random order."""
        pending = [d for d in self._dmas if d.state is not DmaState.DONE]
        self._dmas = []
        if self.dma_order == "random":
            self._rng.shuffle(pending)
        for dma in pending:
            dma.execute(self._det)
            if self._det is not None and self._root is not None:
                self._det.join(self._root, dma.actor)
        for table in self._sems.values():
            for sem in table.values():
                sem.pending = []

    # -- running ---------------------------------------------------------------------------

    def yield_point(self, site=None) -> None:
        """A scheduling point (``pl.delay``): pending DMAs may progress and the scheduler
        may switch cores."""
        self._let_dmas_progress()
        self._sched.yield_point(self._task(), site)

    def tick(self, site=None) -> None:
        """A point a looping body passes on each iteration (a ``while`` loop): raises
        ``WatchdogError`` once the run outlived ``watchdog`` seconds, naming every
        core's state and where it is (``site``: this core's)."""
        self._sched.tick(self._task(), site)

    def _let_dmas_progress(self) -> None:
        """On hardware a DMA in flight lands on its own, waited for or not, so a core
        polling its destination or a semaphore (with ``pl.delay``, ``semaphore_read``)
        must eventually see it. In ``on_wait`` mode, at each such point one pending DMA
        completes with probability 1/2 (seeded): the oldest, or with
        ``dma_order="random"`` any one."""
        if self._eager or not self._dmas:
            return
        self._sched.check()
        pending = [d for d in self._dmas if d.state is not DmaState.DONE]
        self._dmas = pending
        if not pending or self._rng.random() < 0.5:
            return
        random_order = self.dma_order == "random" and len(pending) > 1
        dma = pending[self._rng.randrange(len(pending))] if random_order else pending[0]
        dma.execute(self._det)

    def barrier(self, core: CoreId, *, site=None) -> None:
        """Wait until every core of the run (all devices) reached the barrier."""
        task = self._task()
        self._sched.check()
        participants = self._run_cores or [core]
        if self._obs is not None:
            self._obs.barrier_begin(core)
        self._barrier_arrived.append(core)
        self._barrier_sites[core] = site
        generation = self._barrier_generation
        if len(self._barrier_arrived) >= len(participants):
            self._barrier_arrived = []
            self._barrier_generation += 1
            if self._det is not None:
                self._det.barrier([self._actor(c) for c in participants])
            if self._obs is not None:
                self._obs.barrier_end(core)
            self._sched.yield_point(task)
            return
        self._sched.block(
            task,
            lambda: self._barrier_generation != generation,
            lambda: (
                f"waits at the barrier ({len(self._barrier_arrived)} of {len(participants)} "
                f"cores arrived){at_site(self._barrier_sites.get(core))}"
            ),
        )
        if self._obs is not None:
            self._obs.barrier_end(core)

    def run(self, bodies: dict[CoreId, Callable[[], None]], *, check_leaks: bool = True) -> None:
        """Run each body as one simulated core, one at a time, until all finish.

        Re-raises the first exception of any body (the others are unwound); raises
        ``DeadlockError`` when every body is blocked. Then pending DMAs execute and, with
        ``check_leaks``, semaphore counts are checked.
        """
        cores = [self._check_core(c, "body for") for c in bodies]
        bodies = dict(zip(cores, bodies.values()))
        self._run_cores = sorted(cores)
        self._barrier_arrived = []
        if self._det is not None and self._root is not None:
            self._det.barrier([self._root, *(self._actor(c) for c in self._run_cores)])
        self._sched = self._scheduler()
        if self._obs is not None:
            self._obs.run_begin(tuple(self._run_cores))
        try:
            self._sched.run(bodies)
        finally:
            self._run_cores = []
            # A cancelled scheduler would cancel every later call: start afresh.
            self._sched = self._scheduler()
        self._flush_dmas()
        if self._det is not None and self._root is not None:
            self._det.barrier([self._root, *(self._actor(c) for c in cores)])
        if check_leaks:
            self.check_semaphores()
        if self._obs is not None:
            self._obs.run_end(tuple(sorted(cores)))
