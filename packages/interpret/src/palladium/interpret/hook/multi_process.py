"""A launch split over the processes of a ``jax.distributed`` run.

After ``jax.distributed.initialize(...)`` with P processes, each holding D/P CPU devices,
a ``shard_map`` over the D devices calls each process's host callbacks for its own
devices only. Palladium then simulates, in each process, the devices of that process
(``shared_memory.partition``): the local callbacks meet as in one process, the processes
agree that they all reached the launch (in the coordination service's key-value store),
and remote DMAs, signals and barriers that cross processes travel as messages, one
exchange per lock-step round: over direct TCP connections between the processes
(:class:`SocketTransport`, ``peer_links``; made at the first launch, kept for the run),
or through the key-value store (:class:`KvTransport`) with
``PALLADIUM_PROCESS_TRANSPORT=kv`` in every process's environment.

The mesh must list the devices in ``jax.devices()`` order (``jax.make_mesh`` over all
devices does): process p then simulates the contiguous block of mesh positions
``[p*D/P, (p+1)*D/P)``.

Liveness: each process sets a heartbeat key every ``HEARTBEAT_INTERVAL`` seconds from
the moment palladium sees ``jax.distributed`` (its import, or the first kernel it
lowers); a process waiting for another to reach a launch, or for its round, gives up
with ``PeerProcessError`` when that process posted a failure, or its heartbeat stood
still for ``PEER_TIMEOUT`` seconds (also one that died before its first launch), or its
connection closed (it died or was killed), or the coordination service is gone. A
process alive that never reaches the launch is a ``RendezvousTimeoutError`` after
``InterpretParams.rendezvous_timeout`` on the others.

Agreement: a process reaching a split launch posts what it launches (the kernel's name,
a digest of its ``pallas_call`` parameters and operand types, its ``random_seed``); a
process that finds another launching something else here, or waiting for
``MISMATCH_WAIT`` seconds at another launch while it waits at this one, raises
``ProcessMismatchError`` naming both (every process must run the same kernels with the
same seed in the same order).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import threading
import time
from typing import Any

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import (
    KernelError,
)
from palladium.interpret.hook.kv_transport import KEY_PREFIX, TRANSPORT_ENV, KvTransport
from palladium.interpret.hook.peer_links import (
    LinkSetupError,
    PeerLinks,
    local_host,
)
from palladium.interpret.hook.socket_transport import SocketTransport
from palladium.interpret.state.process_state import STATE
from palladium.shared_memory import Partition

__all__ = ["KvTransport", "ProcessLayout", "SocketTransport", "SplitLaunch"]

HEARTBEAT_INTERVAL = 0.25  # seconds between a process's heartbeats
class ProcessLayout:
    """This process's place in a multi-process run: its index, the process count, and
    the block of mesh positions it simulates for a mesh of ``n`` devices."""

    def __init__(self, client: Any, process: int, num_processes: int,
                 sockets: bool = True) -> None:
        self.client = client
        self.process = process
        self.num_processes = num_processes
        self.sockets = sockets  # rounds over direct connections (else the KV store)
        self.links: PeerLinks | None = None
        self._link_error: str | None = None
        self._launches: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._heartbeat: threading.Thread | None = None
        # keys every process has read, deleted by the heartbeat thread (off the rounds'
        # critical path: a round is then one set and one get per other process)
        self._spent: collections.deque[str] = collections.deque()
        # the launches this process's threads wait at now (launch key -> what it runs)
        self._waiting: dict[str, str] = {}

    def waiting(self, launch: str, what: str | None) -> None:
        """Publish that this process waits at ``launch`` (running ``what``), or no
        longer does (``what`` None)."""
        with self._lock:
            if what is None:
                self._waiting.pop(launch, None)
            else:
                self._waiting[launch] = what
            text = json.dumps(self._waiting)
        with contextlib.suppress(Exception):
            self.client.key_value_set_bytes(f"{KEY_PREFIX}/waiting/{self.process}",
                                            text.encode(), allow_overwrite=True)

    def waits_at(self, launch: str) -> bool:
        with self._lock:
            return launch in self._waiting

    def block(self, num_devices: int, kernel_name: str) -> range:
        """The mesh positions this process simulates."""
        p, count = self.process, self.num_processes
        if num_devices % count:
            raise KernelError(
                f"kernel '{kernel_name}': a launch on {num_devices} devices cannot be split "
                f"over {count} processes evenly; give every process the same number of "
                f"devices of the mesh"
            )
        per = num_devices // count
        return range(p * per, (p + 1) * per)

    def launch_id(self, kernel_name: str) -> str:
        """The key prefix of this process's next split launch of ``kernel_name``: the
        same on every process, which run the same program (k-th launch of that name)."""
        with self._lock:
            k = self._launches[kernel_name]
            self._launches[kernel_name] += 1
        return f"{KEY_PREFIX}/launch/{kernel_name}/{k}"

    def start_heartbeat(self) -> None:
        """Start this process's heartbeat thread (once)."""
        with self._lock:
            if self._heartbeat is not None:
                return
            self._heartbeat = threading.Thread(
                target=self._beat, name="palladium-heartbeat", daemon=True
            )
            self._heartbeat.start()

    def listen(self) -> PeerLinks:
        """This process's end of the connections (made and published once)."""
        with self._lock:
            if self.links is None:
                self.links = PeerLinks(self.process, self.num_processes,
                                       local_host(jc.coordinator_address()))
                self.client.key_value_set_bytes(f"{KEY_PREFIX}/peer/{self.process}",
                                                self.links.address.encode(),
                                                allow_overwrite=True)
            return self.links

    def connect(self, deadline: float) -> PeerLinks:
        """The connections to every other process, made at the first launch all of
        them reached (``LinkSetupError`` if they cannot be, then at every launch)."""
        links = self.listen()
        with self._lock:
            if self._link_error is None and not links.connected:
                try:
                    links.connect(self._address, deadline)
                except LinkSetupError as e:
                    self._link_error = str(e)
            if self._link_error is not None:
                raise LinkSetupError(self._link_error)
        return links

    def _address(self, q: int) -> str | None:
        try:
            return bytes(self.client.key_value_try_get_bytes(f"{KEY_PREFIX}/peer/{q}")).decode()
        except Exception:
            return None

    def discard(self, key: str) -> None:
        """Delete ``key`` soon (every process has read it), on the heartbeat thread."""
        self._spent.append(key)

    def _beat(self) -> None:
        key = f"{KEY_PREFIX}/heartbeat/{self.process}"
        n = 0
        while True:
            try:
                self.client.key_value_set_bytes(key, str(n).encode(), allow_overwrite=True)
            except Exception:  # the coordination service is gone: the waits say so
                return
            while self._spent:
                with contextlib.suppress(Exception):
                    self.client.key_value_delete(self._spent.popleft())
            n += 1
            time.sleep(HEARTBEAT_INTERVAL)


def _layout(client: Any, index: int, count: int) -> ProcessLayout:
    """This process's ``ProcessLayout`` (the transport ``PALLADIUM_PROCESS_TRANSPORT``
    names), made by ``STATE.processes`` for the current ``jax.distributed`` client."""
    return ProcessLayout(client, index, count, os.environ.get(TRANSPORT_ENV, "sockets") != "kv")


STATE.processes.make = _layout


class SplitLaunch:
    """The launches of one split ``pallas_call``: the launch itself, and with
    ``dma_order_trials`` each trial (a launch of every process, in the same order
    everywhere) and the processes' agreement on whether any found a difference."""

    def __init__(self, where: ProcessLayout, kernel_name: str, block: range,
                 timeout: float, describe: str, what: str = "") -> None:
        self.where = where
        self.kernel_name = kernel_name
        self.block = block
        self.timeout = timeout
        self.describe = describe
        self.what = what or f"kernel '{kernel_name}'"  # (the same on every process)

    def partition(self) -> Partition:
        """A new launch of every process (they meet first)."""
        transport = self._transport(self.kernel_name)
        transport.meet(self.timeout, self.what)
        return Partition(frozenset(self.block), transport)

    def agree(self, found: bool) -> bool:
        """Whether ``found`` holds on any process (every process asks, in order)."""
        transport = self._transport(f"{self.kernel_name}.agree")
        return any(p == b"1" for p in transport.exchange(b"1" if found else b"0"))

    def _transport(self, name: str) -> KvTransport:
        kind = SocketTransport if self.where.sockets else KvTransport
        return kind(self.where, self.where.launch_id(name), self.describe)
