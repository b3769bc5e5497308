"""Direct TCP connections between the processes of a ``jax.distributed`` run, for the
rounds of split launches (``multi_process.SocketTransport``).

Every process listens on one port of the interface that reaches the coordinator
(:func:`local_host`) and publishes ``host:port:token`` once (the caller puts it in the
coordination service's key-value store). At the first launch every process reached,
process p connects to every process below it and accepts one connection from every
process above it (:meth:`PeerLinks.connect`); the connecting process proves it read
the store by sending the other's token. The connections are then kept for the run and
used by every later launch.

On a connection travel frames: kind (1 byte), launch id length (2), round (4), payload
length (8), the launch id (UTF-8), the payload. A round's frame is kept in a mailbox
under ``(launch, round, peer)`` until the round asks for it (a peer may be a round
ahead); an abort under ``(launch, peer)``. Sockets are non-blocking and every wait is a
``select`` with a timeout: what is not written yet stays in the connection's outgoing
queue and goes out at the next :meth:`PeerLinks.pump`, so a frame is never cut, and
two processes sending large payloads to each other at once both read while they write.
A connection that closes (the process died or was killed: its kernel closes its
sockets) or fails is marked ``closed`` with the reason.
"""

from __future__ import annotations

import collections
import secrets
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable

__all__ = ["ABORT", "ROUND", "LinkSetupError", "PeerLinks", "local_host"]

ROUND, ABORT, _HELLO = 0, 1, 2
_HEADER = struct.Struct("!BHIQ")
_RECV = 1 << 20
_MAILBOX_PER_PEER = 64  # frames kept for rounds nobody asked for (failed launches' last)


class LinkSetupError(Exception):
    """The connections between the processes could not be made."""


def local_host(coordinator_address: str) -> str:
    """The address of this host's interface that reaches ``coordinator_address``
    (``host:port``): the loopback for a coordinator on the loopback."""
    host, _, port = coordinator_address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, int(port or 0), type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(addr)  # UDP: no packet is sent, the route picks the interface
            return str(probe.getsockname()[0])
    except (OSError, ValueError):
        return socket.gethostbyname(socket.gethostname())


def _frame(kind: int, launch: str, k: int, payload: bytes) -> list[bytes]:
    name = launch.encode()
    return [_HEADER.pack(kind, len(name), k, len(payload)) + name, payload]


class _Link:
    """One connection: its socket, what is still to be written, what was read."""

    __slots__ = ("closed", "inbuf", "out", "peer", "sock", "writing")

    def __init__(self, peer: int, sock: socket.socket) -> None:
        self.peer = peer
        self.sock = sock
        self.out: collections.deque[memoryview] = collections.deque()
        self.inbuf = bytearray()
        self.closed: str | None = None
        self.writing = False  # registered for write readiness


class PeerLinks:
    """This process's connections to every other process of the run."""

    def __init__(self, process: int, num_processes: int, host: str) -> None:
        self.process = process
        self.num_processes = num_processes
        self.token = secrets.token_hex(16)
        self._listener: socket.socket | None = socket.create_server(
            (host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
            backlog=max(num_processes, 8))
        self.address = f"{host}:{self._listener.getsockname()[1]}:{self.token}"
        self._links: dict[int, _Link] = {}
        self._selector = selectors.DefaultSelector()
        self._mailbox: dict[tuple[str, int, int], bytes] = {}
        self._aborts: dict[tuple[str, int], str] = {}
        self.lock = threading.Lock()  # one pump at a time (launches on several threads)

    # -- setting up ---------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return len(self._links) == self.num_processes - 1

    def connect(self, address_of: Callable[[int], str | None], deadline: float) -> None:
        """Connect to every process below this one (``address_of(q)``: its published
        address) and accept every process above it, by ``deadline`` (else
        ``LinkSetupError``)."""
        for q in range(self.process):
            self._links[q] = self._dial(q, address_of, deadline)
        assert self._listener is not None
        listener = self._listener
        while len(self._links) < self.num_processes - 1:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(self.process + 1, self.num_processes)) - set(self._links))
                raise LinkSetupError(f"processes {missing} did not connect in time")
            listener.settimeout(remaining)
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            peer = self._hello(sock, deadline)
            if peer is None or peer in self._links or not self.process < peer < self.num_processes:
                sock.close()  # not one of this run's processes
                continue
            self._links[peer] = _Link(peer, sock)
        listener.close()
        self._listener = None
        for link in self._links.values():
            link.sock.setblocking(False)
            link.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._selector.register(link.sock, selectors.EVENT_READ, link)

    def _dial(self, q: int, address_of: Callable[[int], str | None], deadline: float) -> _Link:
        address = address_of(q)
        if address is None:
            raise LinkSetupError(f"process {q} published no address")
        host, port, token = address.rsplit(":", 2)
        try:
            sock = socket.create_connection(
                (host, int(port)), timeout=max(deadline - time.monotonic(), 0.1))
            sock.sendall(b"".join(_frame(_HELLO, "", self.process, token.encode())))
        except OSError as e:
            raise LinkSetupError(f"cannot connect to process {q} at {host}:{port}: {e}") from None
        return _Link(q, sock)

    def _hello(self, sock: socket.socket, deadline: float) -> int | None:
        """The process index an accepted connection announces with this one's token."""
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.1))
            head = _recv_exactly(sock, _HEADER.size)
            kind, name_len, peer, size = _HEADER.unpack(head)
            if kind != _HELLO or name_len or size != len(self.token):
                return None
            if _recv_exactly(sock, size).decode(errors="replace") != self.token:
                return None
            return int(peer)
        except (OSError, ValueError):
            return None

    def endpoints(self) -> dict[int, tuple[int, int]]:
        """Each open connection's (local port, peer's port), by peer."""
        return {q: (link.sock.getsockname()[1], link.sock.getpeername()[1])
                for q, link in sorted(self._links.items()) if link.closed is None}

    def close(self) -> None:
        """Close every connection (and the listener)."""
        if self._listener is not None:
            self._listener.close()
        for link in self._links.values():
            link.sock.close()
        self._selector.close()

    # -- frames -------------------------------------------------------------------------

    def post(self, peers: Iterable[int], kind: int, launch: str, k: int, payload: bytes) -> None:
        """Queue a frame to each of ``peers`` and write what the sockets take now."""
        frame = [memoryview(b) for b in _frame(kind, launch, k, payload)]
        with self.lock:  # (a frame's parts stay together whatever other threads post)
            for q in peers:
                link = self._links[q]
                if link.closed is None:
                    link.out.extend(frame)
                    self._write(link)

    def take(self, launch: str, k: int, peer: int) -> bytes | None:
        """``peer``'s frame of round ``k`` of ``launch``, once it arrived."""
        return self._mailbox.pop((launch, k, peer), None)

    def aborted(self, launch: str, peer: int) -> str | None:
        """The error ``peer`` posted for ``launch`` (None if it did not)."""
        return self._aborts.get((launch, peer))

    def closed(self, peer: int) -> str | None:
        """Why the connection to ``peer`` closed (None while it is open)."""
        return self._links[peer].closed

    def flushed(self) -> bool:
        """Whether everything posted was written (to the connections still open)."""
        return not any(link.out for link in self._links.values() if link.closed is None)

    def pump(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a connection to be readable (or writable
        while it has something to write); read and write what they allow. Whether
        anything moved."""
        with self.lock:
            moved = False
            for link in self._links.values():
                want = bool(link.out) and link.closed is None
                if want != link.writing and link.closed is None:
                    link.writing = want
                    events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
                    self._selector.modify(link.sock, events, link)
            for key, mask in self._selector.select(timeout):
                link = key.data
                if mask & selectors.EVENT_READ:
                    moved |= self._read(link)
                if mask & selectors.EVENT_WRITE:
                    moved |= self._write(link)
            return moved

    def _write(self, link: _Link) -> bool:
        moved = False
        while link.out and link.closed is None:
            head = link.out[0]
            try:
                n = link.sock.send(head)
            except BlockingIOError:
                break
            except OSError as e:
                self._close(link, f"writing failed: {e}")
                break
            moved = True
            if n == len(head):
                link.out.popleft()
            else:
                link.out[0] = head[n:]
        return moved

    def _read(self, link: _Link) -> bool:
        moved = False
        while link.closed is None:
            try:
                data = link.sock.recv(_RECV)
            except BlockingIOError:
                break
            except OSError as e:
                self._close(link, f"reading failed: {e}")
                break
            if not data:
                self._close(link, "its connection closed")
                break
            moved = True
            link.inbuf += data
            if len(data) < _RECV:
                break
        self._frames(link)
        return moved

    def _frames(self, link: _Link) -> None:
        buf, at = link.inbuf, 0
        while len(buf) - at >= _HEADER.size:
            kind, name_len, k, size = _HEADER.unpack_from(buf, at)
            start = at + _HEADER.size
            end = start + name_len + size
            if len(buf) < end:
                break
            with memoryview(buf) as view:  # one copy of the payload, not two
                launch = bytes(view[start:start + name_len]).decode()
                payload = bytes(view[start + name_len:end])
            at = end
            if kind == ROUND:
                self._mailbox[(launch, k, link.peer)] = payload
                if len(self._mailbox) > _MAILBOX_PER_PEER * self.num_processes:
                    del self._mailbox[next(iter(self._mailbox))]  # the oldest
            elif kind == ABORT:
                self._aborts[(launch, link.peer)] = payload.decode(errors="replace")
                if len(self._aborts) > _MAILBOX_PER_PEER * self.num_processes:
                    del self._aborts[next(iter(self._aborts))]
        if at:
            del buf[:at]

    def _close(self, link: _Link, why: str) -> None:
        link.closed = why
        link.out.clear()
        self._selector.unregister(link.sock)
        link.sock.close()


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data
