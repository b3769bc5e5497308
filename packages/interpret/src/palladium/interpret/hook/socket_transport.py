"""The rounds of a split launch over direct connections between the processes
(``SocketTransport``, the default transport of ``multi_process``; ``peer_links`` holds
the connections)."""

from __future__ import annotations

import time
from typing import Any

from palladium.interpret.errors import PeerProcessError
from palladium.interpret.hook.kv_transport import (
    ABORT_FLUSH,
    POLL_MS,
    STORE_CHECK,
    TRANSPORT_ENV,
    KvTransport,
)
from palladium.interpret.hook.peer_links import ABORT, ROUND, LinkSetupError

__all__ = ["SocketTransport"]


class SocketTransport(KvTransport):
    """A split launch's rounds over the direct connections between the processes
    (``ProcessLayout.connect``): a round is one frame to every other process and one
    from each, no coordinator hop. The meeting, a failure's error (also sent as a
    frame) and the heartbeats stay in the key-value store; a peer whose connection
    closes (it died or was killed) is a ``PeerProcessError`` at once."""

    def __init__(self, where: Any, launch: str, describe: str) -> None:
        super().__init__(where, launch, describe)
        self._peers = [q for q in range(self.num_processes) if q != self.process]

    def meet(self, timeout: float, what: str = "") -> None:
        self.where.listen()  # published before this process says it is ready
        super().meet(timeout, what)
        try:  # (every process met: the connections are made in a moment)
            self.where.connect(time.monotonic() + timeout)
        except LinkSetupError as e:
            error = (f"{self.describe}: process {self.process} cannot reach the other "
                     f"processes directly ({e}); set {TRANSPORT_ENV}=kv in every "
                     f"process's environment to exchange rounds through the "
                     f"coordination service instead")
            KvTransport.abort(self, error)
            raise PeerProcessError(error) from None

    def _swap(self, k: int, payload: bytes) -> list[bytes]:
        links = self.where.links
        if links is None or not links.connected:  # (a launch's transport meets first)
            raise PeerProcessError(f"{self.describe}: process {self.process} is not "
                                   f"connected to the other processes")
        launch, peers = self.launch, self._peers
        links.post(peers, ROUND, launch, k, payload)
        got: dict[int, bytes] = {}
        ask_store = time.monotonic() + STORE_CHECK
        while True:
            for q in peers:
                if q not in got:
                    frame = links.take(launch, k, q)
                    if frame is not None:
                        got[q] = frame
            missing = [q for q in peers if q not in got]
            for q in missing:  # (a peer may fail once it has this round: not an error here)
                error = links.aborted(launch, q)
                if error is not None:
                    raise self._failed(q, error)
                why = links.closed(q)
                if why is not None:
                    raise PeerProcessError(
                        f"{self.describe}: process {q} of {self.num_processes} stopped "
                        f"responding ({why}: it died or was killed) while process "
                        f"{self.process} waited for its round {k}"
                    )
            if not missing and links.flushed():
                break
            links.pump(POLL_MS / 1000)
            now = time.monotonic()
            if now >= ask_store:  # a long wait: ask the store about the peers
                ask_store = now + STORE_CHECK
                for q in missing:
                    self._check_peer(q)
                for q in () if missing else peers:  # all in, ours not yet written
                    self._check_alive(q)
        got[self.process] = payload
        return [got[q] for q in range(self.num_processes)]

    def abort(self, error: str) -> None:
        links = self.where.links
        if links is not None and links.connected:
            links.post(self._peers, ABORT, self.launch, 0, error.encode())
            deadline = time.monotonic() + ABORT_FLUSH
            while not links.flushed() and time.monotonic() < deadline:
                links.pump(0.05)
        super().abort(error)
