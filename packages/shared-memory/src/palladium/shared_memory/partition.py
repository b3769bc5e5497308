"""A simulation of some devices of a slice, in lock-step with the processes simulating
the others.

A ``Simulation`` given a :class:`Partition` holds every device's buffers and semaphores
(allocated in the same order on every process, so a buffer has the same identity
everywhere) but runs the cores of its ``local_devices`` only. What a local core does to
another process's device becomes a message instead:

- a DMA into a remote device executes at once on the sender (read, send semaphore)
  and posts the data read (``dma``); the owning process stores it, or adds it into its
  buffer, and signals the receive semaphore, when it applies the message;
- a DMA that reads a remote device's memory posts a request (``read``); the owner
  reads the region when it applies the request and posts the data back (``data``);
  the requester then completes the DMA as if it had read it (send semaphore, then the
  write: local, or posted on as a ``dma`` when the destination is remote too);
- a semaphore signal to a remote core posts ``(core, semaphore, increment)``;
- the kernel-wide barrier completes in a round in which every process has all its cores
  at the barrier.

The processes advance in rounds (:class:`Rounds`): each runs its cores with its own
seeded scheduler until none can run (every local core finished or blocked), then every
process posts its status and outgoing messages and receives everyone's
(``Transport.exchange``), and applies the messages addressed to it in process order,
then in the order they were sent. A round's local run depends only on the messages
applied before it, so the launch is a pure function of the seed and the process count.
A round in which nothing was posted, no barrier completed and some core is blocked is a
deadlock: every process sees the same statuses and raises the same ``DeadlockError``,
naming every blocked core of every process. A process that fails posts its error; the
others raise ``PeerProcessError`` naming it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from palladium.race_detect import Clock, ClockExchange, VectorClock
from palladium.shared_memory.dma import Dma, report_read, report_write
from palladium.shared_memory.errors import (
    ConfigError,
    DeadlockError,
    PeerProcessError,
    at_site,
    core_name,
)

__all__ = ["Partition", "Rounds", "Transport"]

CoreId = tuple[int, int]


class Transport(Protocol):
    """How the processes of a partitioned launch meet once per round."""

    process: int
    num_processes: int

    def exchange(self, payload: bytes) -> list[bytes]:
        """Post this process's ``payload`` for the next round; return every process's
        payload of that round, in process order (this one's included). Raises
        ``PeerProcessError`` when a process died, failed or never posts."""
        ...

    def abort(self, error: str) -> None:
        """This process failed with ``error``: make every ``exchange`` of the others
        raise ``PeerProcessError`` naming this process and ``error``."""
        ...


@dataclasses.dataclass(frozen=True)
class Partition:
    """Which devices this process simulates, and how it reaches the other processes."""

    local_devices: frozenset[int]
    transport: Transport


@dataclasses.dataclass
class _Status:
    state: str  # "blocked" or "done"
    at_barrier: bool = False
    blocked: list[tuple[CoreId, str]] = dataclasses.field(default_factory=list)
    finished: list[CoreId] = dataclasses.field(default_factory=list)
    messages: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)
    barrier_clock: Any = ()  # race detection: the join of the cores' clocks at the barrier


def _encode(status: _Status) -> bytes:
    """A round's payload: the status's fields as one pickled tuple of plain values (no
    class to look up on either side; strings shared within a payload are written once)."""
    fields = (status.state, status.at_barrier, status.blocked, status.finished,
              status.messages, status.barrier_clock)
    return pickle.dumps(fields, pickle.HIGHEST_PROTOCOL)


def _decode(payload: bytes) -> _Status:
    return _Status(*pickle.loads(payload))


class Rounds:
    """One partitioned launch's outbox and rounds (see the module docstring).

    ``sim`` is the ``Simulation``, used through its collaborators' public names
    (``buffers``, ``semaphores``, ``kernel_barrier``, ``races``, ``race_detector``);
    ``release_barrier()`` completes the kernel-wide barrier on the local cores.
    """

    def __init__(self, sim: Any, partition: Partition, release_barrier: Callable[[], None]):
        self.sim = sim
        self.local = partition.local_devices
        self.transport = partition.transport
        self.release_barrier = release_barrier
        self.outbox: list[tuple[Any, ...]] = []
        self.rounds = 0
        self.messages_sent = 0
        self.failed = False
        self._clocks: ClockExchange | None = None
        # (device, core, space, n): the n-th buffer of that owner, the same on every
        # process; key <-> identity of every buffer allocated.
        self.identity: dict[int, tuple[int, int, str, int]] = {}
        self.key_of: dict[tuple[int, int, str, int], int] = {}
        self._owned: dict[tuple[int, int, str], int] = {}
        # DMAs of local cores waiting for another process's source data: id -> (DMA,
        # destination core).
        self._fetching: dict[int, tuple[Dma, CoreId]] = {}

    # -- what the simulation tells it --------------------------------------------------

    def allocated(self, key: int, device: int, core: int, space: str) -> None:
        owner = (device, core, space)
        n = self._owned.get(owner, 0)
        self._owned[owner] = n + 1
        ident = (device, core, space, n)
        self.identity[key] = ident
        self.key_of[ident] = key

    def is_local(self, device: int) -> bool:
        return device in self.local

    @property
    def clocks(self) -> ClockExchange | None:
        """Race detection's clock translation (None without race detection)."""
        if self._clocks is None and self.sim.race_detector is not None:
            self._clocks = ClockExchange(self.sim.race_detector, self.transport.process)
        return self._clocks

    def crosses(self, src: Any, dst: Any, dst_core: CoreId) -> bool:
        """Whether a DMA from ``src`` into ``dst`` (receive semaphore on ``dst_core``)
        touches another process's device (then :meth:`start_dma` runs it)."""
        local = self.local
        return not (src.device in local and dst.device in local and dst_core[0] in local)

    def start_dma(self, dma: Dma, dst_core: CoreId) -> None:
        """Start ``dma`` (a local core's) that :meth:`crosses` processes: from local
        memory it executes now and posts its data; from another process's memory it
        asks the owner for the data and completes when that arrives."""
        if dma.src.ref.device in self.local:
            self._send(dma, dst_core)
            return
        self._fetching[dma.id] = (dma, dst_core)
        race = None
        if self.clocks is not None and dma.actor is not None:
            race = (dma.name, self.transport.process, dma.actor.slot,
                    self.clocks.export(dma.actor.clock()))
        self.outbox.append(
            (
                "read",
                dma.src.ref.device,
                self.identity[dma.src.ref.key],
                dma.src_plan.region,
                dma.src_mask,
                dma.core,
                dma.id,
                "" if dma.site is None else str(dma.site),
                race,
            )
        )

    def _send(self, dma: Dma, dst_core: CoreId) -> None:
        """Execute ``dma`` (its source read) and post what it writes to the owner of its
        destination."""
        dma.sent = []
        dma.execute(self.sim.race_detector)
        data, bits, clock = dma.sent
        race = None
        if self.clocks is not None and clock is not None:
            race = (dma.name, self.transport.process, dma.actor.slot, self.clocks.export(clock))
        self.outbox.append(
            (
                "dma",
                dst_core[0],
                self.identity[dma.dst.ref.key],
                dma.dst_plan.region,
                data,
                dma.dst_mask,
                bits,
                dma.add,
                dst_core,
                dma.dst_sem.id,
                dma.nbytes,
                dma.core,
                "" if dma.site is None else str(dma.site),
                race,
            )
        )

    def send_signal(self, target: CoreId, sem_id: int, inc: int, clock: Clock | None) -> None:
        """A local core signalled semaphore ``sem_id`` of ``target`` (another process's)."""
        entries = None if clock is None or self.clocks is None else self.clocks.export(clock)
        self.outbox.append(("signal", target[0], target, sem_id, inc, entries))

    # -- rounds ------------------------------------------------------------------------

    def stall(self, tasks: Sequence[Any]) -> str | None:
        """No local core can run: one round. None if something changed (run again),
        else the deadlock message (every process gets the same)."""
        statuses = self._round(self._status(tasks))
        progress = self._apply(statuses)
        if progress:
            return None
        if all(s.state == "done" for s in statuses):
            return None  # cannot happen while a local core is blocked; the caller ends
        # Every process saw the same: a deadlock. One more round says who waits on what
        # (a round's status leaves that out: it is only needed here).
        return self._deadlock_message(self._round(self._status(tasks, describe=True)))

    def drain(self) -> None:
        """Every local core finished: take part in rounds until every process has."""
        while True:
            statuses = self._round(_Status("done"))
            progress = self._apply(statuses)
            if progress:
                continue
            if all(s.state == "done" for s in statuses):
                return
            raise DeadlockError(self._deadlock_message(self._round(_Status("done"))))

    def fail(self, error: BaseException) -> None:
        """This process failed: tell the others (once) so that none waits for it."""
        if self.failed or isinstance(error, PeerProcessError):
            return
        self.failed = True
        text = f"{type(error).__name__}: {error}".splitlines()[0][:2000]
        with contextlib.suppress(Exception):  # the others may be gone too
            self.transport.abort(text)

    def _status(self, tasks: Sequence[Any], describe: bool = False) -> _Status:
        status = _Status("blocked")
        for t in tasks if describe else ():
            if t.describe is not None and t.state.name == "BLOCKED":
                status.blocked.append((t.core, t.describe()))
            elif t.state.name == "DONE":
                status.finished.append(t.core)
        arrived = self.sim.kernel_barrier.arrived
        status.at_barrier = bool(arrived) and len(arrived) == len(self.sim.kernel_barrier.participants)
        if status.at_barrier and self.clocks is not None:
            merged = VectorClock()
            for core in self.sim.kernel_barrier.participants:
                merged.join(self.sim.races.actor(core).clock())
            status.barrier_clock = self.clocks.export(merged.snapshot())
        return status

    def _round(self, status: _Status) -> list[_Status]:
        status.messages, self.outbox = self.outbox, []
        self.messages_sent += len(status.messages)
        self.rounds += 1
        payloads = self.transport.exchange(_encode(status))
        me = self.transport.process  # this process's own status is not decoded again
        return [status if q == me else _decode(p) for q, p in enumerate(payloads)]

    def _apply(self, statuses: list[_Status]) -> bool:
        """Apply the messages addressed to this process; whether anything changed."""
        progress = False
        for s in statuses:
            for m in s.messages:
                progress = True
                if m[1] in self.local:
                    self._deliver(m)
        if statuses and all(s.at_barrier for s in statuses):
            clocks = self.clocks
            if clocks is not None:  # every process's cores happen-before the barrier's end
                det = self.sim.race_detector
                for s in statuses:
                    clock = clocks.imported(s.barrier_clock)
                    for core in self.sim.kernel_barrier.participants:
                        det.acquire(self.sim.races.actor(core), clock)
            self.release_barrier()
            progress = True
        return progress

    def _deliver(self, m: tuple[Any, ...]) -> None:
        sim = self.sim
        clocks = self.clocks
        kind = m[0]
        if kind == "signal":
            _, _, target, sem_id, inc, entries = m
            clock = None if entries is None or clocks is None else clocks.imported(entries)
            sim.semaphores.get(target, sem_id).signal(inc, clock)
        elif kind == "read":
            self._read(m)
        elif kind == "data":
            _, _, dma_id, data, stored = m
            dma, dst_core = self._fetching.pop(dma_id)
            dma.read_from(data, stored, sim.race_detector)
            if dma.dst.ref.device in self.local and dst_core[0] in self.local:
                dma.execute(sim.race_detector)
            else:
                self._send(dma, dst_core)  # into another process's device in turn
        else:
            self._write(m)

    def _buffer(self, ident: Any, src_core: CoreId, site: str, what: str) -> Any:
        key = self.key_of.get(ident)
        if key is None or key not in self.sim.buffers.by_key:
            raise ConfigError(
                f"{core_name(src_core)}: a DMA {what} device {ident[0]} (another process) "
                f"names a buffer that process does not hold (scoped or freed)"
                f"{at_site(site or None)}"
            )
        return self.sim.buffers.by_key[key]

    def _read(self, m: tuple[Any, ...]) -> None:
        """Another process's DMA reads a local buffer: read it now, post the data back."""
        _, _, ident, region, mask, src_core, dma_id, site, race = m
        buf = self._buffer(ident, src_core, site, "reading from")
        plan = buf.plan(region)
        data = buf.read(plan, False, "DMA read", src_core, site or None, mask)
        stored = buf.written_bits(plan) if buf.written is not None else None
        clocks = self.clocks
        if race is not None and clocks is not None and plan.index is not None:
            name, process, slot, entries = race
            actor = clocks.actor(f"{name} (process {process})", process, slot, entries)
            report_read(self.sim.race_detector, actor, buf, plan, mask, site or None)
        self.outbox.append(("data", src_core[0], dma_id, data, stored))

    def _write(self, m: tuple[Any, ...]) -> None:
        """Another process's DMA lands in a local buffer: store (or add) its data, check
        the write with the sender's clock, signal the receive semaphore."""
        sim = self.sim
        clocks = self.clocks
        (_, _, ident, region, data, mask, bits, add, dst_core, sem_id, nbytes, src_core,
         site, race) = m
        buf = self._buffer(ident, src_core, site, "writing into")
        plan = buf.plan(region)
        old_bits = None
        if add:  # the destination accumulates: dst += data, as a local DMA adds
            old = buf.read(plan, False, "DMA add", src_core, site or None, mask)
            data = (old + data).astype(old.dtype, copy=False)
            old_bits = buf.written_bits(plan) if buf.written is not None else None
        buf.write(plan, data, mask, "DMA write", src_core, site or None)
        if bits is not None and buf.written is not None:
            buf.set_written(plan, bits if old_bits is None else bits & old_bits, mask)
        clock = None
        if race is not None and clocks is not None:
            name, process, slot, entries = race
            if plan.index is not None:  # the write checked here, as the sender's DMA's
                actor = clocks.actor(f"{name} (process {process})", process, slot, entries)
                report_write(sim.race_detector, actor, buf, plan, mask, site or None)
            clock = clocks.imported(entries)
        sim.semaphores.get(dst_core, sem_id).signal(nbytes, clock)

    @staticmethod
    def _deadlock_message(statuses: list[_Status]) -> str:
        lines = [
            f"deadlock: every core is blocked and no DMA can make progress "
            f"(across {len(statuses)} processes)."
        ]
        blocked = sorted((c, text, p) for p, s in enumerate(statuses) for c, text in s.blocked)
        for core, text, p in blocked:
            lines.append(f"  {core_name(core)} (process {p}) {text}")
        finished = sorted(c for s in statuses for c in s.finished)
        if finished:
            lines.append(f"  finished: {', '.join(core_name(c) for c in finished)}")
        return "\n".join(lines)
