"""Observers: what happens in a simulation, reported to whoever registered to hear it.

Modelled on trio's ``Instrument``: :class:`Observer` is an interface whose hooks all
default to no-ops; a client overrides the few it needs and registers an instance with
``Simulation(observers=[...])`` or ``Simulation.add_observer``. The simulation keeps an
:class:`ObserverSet` only while someone is registered, and each hook site is one
``is not None`` test otherwise, so a run without observers pays nothing measurable.

The simulation itself reports allocations, frees, DMA start/complete, semaphore
signals and waits, barriers and core switches. A client that drives the simulation
(the interpreter) reports its own structure through the same seam with
:meth:`Simulation.observers`: grid steps, pipeline block copies and compute operations.

>>> import numpy as np
>>> from palladium.shared_memory import MemorySpace, Simulation
>>> class Bytes(Observer):
...     def __init__(self): self.total = 0
...     def allocate(self, buf, nbytes, core): self.total += nbytes
>>> counter = Bytes()
>>> sim = Simulation(observers=[counter])
>>> _ = sim.allocate(MemorySpace.VMEM, 0, 0, name="v", shape=(8, 128), dtype=np.float32)
>>> counter.total
4096
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from palladium.shared_memory.buffers import BufferRef, MemorySpace
from palladium.shared_memory.dma import Dma
from palladium.shared_memory.semaphores import Semaphore, SemaphoreKind

__all__ = [
    "BlockCopy",
    "DmaEvent",
    "Observer",
    "ObserverSet",
    "SemaphoreInfo",
    "dma_event",
    "semaphore_info",
]

CoreId = tuple[int, int]


@dataclasses.dataclass(frozen=True, slots=True)
class SemaphoreInfo:
    """One semaphore as observers see it: its owner core, id and the user's name."""

    core: CoreId
    id: int
    label: str
    kind: SemaphoreKind

    @property
    def key(self) -> tuple[CoreId, int]:
        """``(core, id)``: identifies the semaphore within a simulation."""
        return (self.core, self.id)


@dataclasses.dataclass(frozen=True, slots=True)
class DmaEvent:
    """A DMA as observers see it.

    ``core`` issued it; ``dst_core`` is the core whose ``dst_sem`` it signals (another
    device's core for a remote DMA); ``nbytes`` is what it signals.
    """

    id: int
    name: str
    core: CoreId
    dst_core: CoreId
    nbytes: int
    src: BufferRef
    dst: BufferRef
    dst_sem: SemaphoreInfo
    src_sem: SemaphoreInfo | None
    site: Any = None

    @property
    def device(self) -> int:
        """The device that issued the DMA."""
        return self.core[0]

    @property
    def remote(self) -> bool:
        """Whether the DMA crosses devices (over the inter-chip interconnect)."""
        return self.src.device != self.dst.device


@dataclasses.dataclass(frozen=True, slots=True)
class BlockCopy:
    """A pallas_call pipeline copy of one operand's block between HBM and VMEM/SMEM.

    ``direction`` is ``"in"`` (HBM -> core memory, before grid step ``step``) or
    ``"out"`` (back to HBM, after it). ``buffer_count`` is the operand's number of
    pipeline buffers (``pl.Buffered(n)``; 2 by default).
    """

    core: CoreId
    operand: str
    direction: str
    block: tuple[int, ...]
    nbytes: int
    step: int
    grid_point: tuple[int, ...]
    buffer_count: int = 2
    space: MemorySpace = MemorySpace.VMEM


class Observer:
    """Hooks a simulation calls as things happen. Every hook is a no-op by default:
    override the ones you need. Hooks run on the thread of the simulated core that
    caused the event (one core runs at a time), and must not call back into the
    simulation."""

    # -- reported by the simulation --------------------------------------------------
    def allocate(self, buf: BufferRef, nbytes: int, core: CoreId) -> None:
        """``buf`` (``nbytes`` bytes in ``buf.space``) was allocated for ``core``."""

    def free(self, buf: BufferRef, nbytes: int, core: CoreId) -> None:
        """The last reference to ``buf`` was dropped."""

    def dma_start(self, dma: DmaEvent) -> None:
        """``dma.core`` started ``dma``."""

    def dma_complete(self, dma: DmaEvent) -> None:
        """``dma`` wrote its destination (in host order; see the simulation's
        ``dma_execution_mode`` for when that is)."""

    def semaphore_signal(self, core: CoreId, sem: SemaphoreInfo, inc: int) -> None:
        """``core`` added ``inc`` to ``sem`` (a DMA's own signals are not reported
        here: they are part of its completion)."""

    def semaphore_wait_begin(self, core: CoreId, sem: SemaphoreInfo, value: int) -> None:
        """``core`` starts waiting for ``value`` on ``sem`` (DMA waits included)."""

    def semaphore_wait_end(self, core: CoreId, sem: SemaphoreInfo, value: int) -> None:
        """``core``'s wait on ``sem`` returned (``value`` was subtracted)."""

    def barrier_begin(self, core: CoreId) -> None:
        """``core`` arrived at a barrier of every core of the run."""

    def barrier_end(self, core: CoreId) -> None:
        """``core`` left the barrier (every core arrived)."""

    def core_switch(self, previous: CoreId | None, core: CoreId) -> None:
        """The scheduler handed the baton from ``previous`` to ``core``."""

    def run_begin(self, cores: tuple[CoreId, ...]) -> None:
        """``Simulation.run`` starts the bodies of ``cores``."""

    def run_end(self, cores: tuple[CoreId, ...]) -> None:
        """``Simulation.run`` succeeded: every body returned, pending DMAs executed and
        (with ``check_leaks``) no semaphore leaked. A failed run never reports it."""

    def run_failed(self, cores: tuple[CoreId, ...], error: BaseException) -> None:
        """``Simulation.run`` failed with ``error`` (raised right after): the run's last
        event, instead of ``run_end``."""

    # -- reported by the client that drives the simulation ---------------------------
    def grid_step_begin(self, core: CoreId, step: int, grid_point: tuple[int, ...]) -> None:
        """``core`` starts its ``step``-th grid step, at ``grid_point``."""

    def grid_step_end(self, core: CoreId, step: int, grid_point: tuple[int, ...]) -> None:
        """``core`` finished the body of that grid step (output copies follow)."""

    def block_copy(self, copy: BlockCopy) -> None:
        """A pipeline block copy (see :class:`BlockCopy`)."""

    def compute(self, core: CoreId, op: Any) -> None:
        """``core`` evaluated one compute operation ``op`` (for the interpreter, a jaxpr
        equation; opaque to the simulation)."""


_HOOKS = tuple(
    name for name, value in vars(Observer).items()
    if callable(value) and not name.startswith("_")
)


class ObserverSet(Observer):
    """The registered observers, called hook by hook: itself an :class:`Observer`
    whose every hook calls the registered observers that override it (as trio's
    ``Instruments`` do), so an observer costs nothing at the hooks it ignores.
    ``wants(hook)`` tells a caller whether building a hook's argument is worth it."""

    def __init__(self, observers: Iterable[Observer] = ()) -> None:
        self._observers: list[Observer] = []
        self._by_hook: dict[str, list[Callable[..., None]]] = {h: [] for h in _HOOKS}
        for obs in observers:
            self.add(obs)

    def __bool__(self) -> bool:
        return bool(self._observers)

    def __iter__(self) -> Iterator[Observer]:
        return iter(list(self._observers))

    def add(self, observer: Observer) -> None:
        """Register ``observer`` (once)."""
        if not isinstance(observer, Observer):
            raise TypeError("an observer must subclass palladium.shared_memory.Observer, "
                            f"got {observer!r}")
        if observer not in self._observers:
            self._observers.append(observer)
            self._rebuild()

    def remove(self, observer: Observer) -> None:
        """Unregister ``observer``."""
        self._observers.remove(observer)
        self._rebuild()

    def wants(self, hook: str) -> bool:
        """Whether any registered observer overrides ``hook``."""
        return bool(self._by_hook[hook])

    def _rebuild(self) -> None:
        for hook in _HOOKS:
            noop = getattr(Observer, hook)
            bound = [getattr(o, hook) for o in self._observers]
            targets = [fn for fn in bound if getattr(fn, "__func__", None) is not noop]
            self._by_hook[hook] = targets
            # The instance attribute shadows the no-op method: a direct call when one
            # observer listens, a loop when several do, the no-op when none.
            if len(targets) == 1:
                self.__dict__[hook] = targets[0]
            elif targets:
                self.__dict__[hook] = _fan_out(tuple(targets))
            else:
                self.__dict__.pop(hook, None)


def _fan_out(targets: tuple[Callable[..., None], ...]) -> Callable[..., None]:
    def call(*args: Any) -> None:
        for fn in targets:
            fn(*args)

    return call


def semaphore_info(sem: Semaphore) -> SemaphoreInfo:
    """The observers' view of ``sem`` (made once per semaphore: every signal, wait and
    DMA tells it)."""
    info = sem.info
    if info is None:
        info = sem.info = SemaphoreInfo(sem.core, sem.id, sem.label, sem.kind)
    return info


def dma_event(dma: Dma, dst_core: CoreId) -> DmaEvent:
    """The observers' view of ``dma`` (which signals ``dst_core``)."""
    return DmaEvent(
        dma.id, dma.name, dma.core, dst_core, dma.nbytes, dma.src.ref, dma.dst.ref,
        semaphore_info(dma.dst_sem),
        None if dma.src_sem is None else semaphore_info(dma.src_sem), dma.site,
    )
