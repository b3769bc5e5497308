"""The direct connections between the processes of a split launch (``peer_links``),
here between threads of one process on the loopback: the multi-process tests
(integration_tests/test_multi_process.py) run them between real processes."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from palladium.interpret.hook.peer_links import ABORT, ROUND, LinkSetupError, PeerLinks, local_host


def _mesh(n: int, timeout: float = 10.0) -> list[PeerLinks]:
    """``n`` connected ends, as ``n`` processes would make them (each on its thread)."""
    ends = [PeerLinks(p, n, "127.0.0.1") for p in range(n)]
    errors: list[BaseException] = []

    def connect(end: PeerLinks) -> None:
        try:
            end.connect(lambda q: ends[q].address, time.monotonic() + timeout)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=connect, args=(e,)) for e in ends]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    assert not errors, errors
    assert all(e.connected for e in ends)
    return ends


def _round(end: PeerLinks, launch: str, k: int, payload: bytes, timeout: float = 10.0) -> list[bytes]:
    """One lock-step round as ``SocketTransport`` makes it: post, then pump until every
    peer's frame is in and everything is written."""
    peers = [q for q in range(end.num_processes) if q != end.process]
    end.post(peers, ROUND, launch, k, payload)
    got: dict[int, bytes] = {end.process: payload}
    deadline = time.monotonic() + timeout
    while len(got) < end.num_processes or not end.flushed():
        assert time.monotonic() < deadline, "round did not complete"
        for q in peers:
            frame = end.take(launch, k, q)
            if frame is not None:
                got[q] = frame
        if len(got) < end.num_processes or not end.flushed():
            end.pump(0.05)
    return [got[q] for q in range(end.num_processes)]


def _in_threads(ends: list[PeerLinks], body) -> list:
    out: list = [None] * len(ends)
    errors: list[BaseException] = []

    def run(p: int) -> None:
        try:
            out[p] = body(ends[p])
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(p,)) for p in range(len(ends))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a round hung"
    assert not errors, errors
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [2, 4])
def test_rounds_deliver_every_payload_in_process_order(n):
    ends = _mesh(n)
    try:
        def rounds(end: PeerLinks) -> list[list[bytes]]:
            return [_round(end, "launch/a/0", k, f"{end.process}:{k}".encode()) for k in range(50)]

        for p, got in enumerate(_in_threads(ends, rounds)):
            assert got == [[f"{q}:{k}".encode() for q in range(n)] for k in range(50)], p
    finally:
        for e in ends:
            e.close()


@pytest.mark.timeout(60)
def test_large_payloads_sent_both_ways_at_once_do_not_block():
    """8 MiB each way: far more than the sockets' buffers; each end reads while it writes."""
    ends = _mesh(2)
    big = [bytes([p + 1]) * (8 << 20) for p in range(2)]
    try:
        got = _in_threads(ends, lambda end: _round(end, "launch/big/0", 0, big[end.process]))
        assert got[0] == big and got[1] == big
    finally:
        for e in ends:
            e.close()


@pytest.mark.timeout(60)
def test_frames_of_a_later_round_or_another_launch_wait_in_the_mailbox():
    a, b = _mesh(2)
    try:
        b.post([0], ROUND, "launch/x/1", 0, b"other launch")
        b.post([0], ROUND, "launch/x/0", 1, b"round 1")
        b.post([0], ROUND, "launch/x/0", 0, b"round 0")
        b.post([0], ABORT, "launch/x/2", 0, b"KernelError: boom")
        deadline = time.monotonic() + 10
        while a.take("launch/x/0", 0, 1) is None:
            assert time.monotonic() < deadline
            a.pump(0.05)
        assert a.take("launch/x/0", 1, 1) == b"round 1"
        assert a.take("launch/x/1", 0, 1) == b"other launch"
        assert a.take("launch/x/0", 1, 1) is None  # taken once
        while a.aborted("launch/x/2", 1) is None:
            assert time.monotonic() < deadline
            a.pump(0.05)
        assert a.aborted("launch/x/2", 1) == "KernelError: boom"
        assert a.aborted("launch/x/0", 1) is None
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(60)
def test_a_closed_peer_is_seen_at_once_with_its_reason():
    a, b = _mesh(2)
    try:
        b.close()  # as the kernel closes a killed process's sockets
        start = time.monotonic()
        while a.closed(1) is None:
            assert time.monotonic() - start < 5
            a.pump(0.05)
        assert a.closed(1) == "its connection closed"
        a.post([1], ROUND, "launch/y/0", 0, b"nobody reads this")  # dropped, no error
        assert a.flushed()
    finally:
        a.close()


@pytest.mark.timeout(60)
def test_a_connection_without_the_token_is_refused_and_setup_times_out_naming_who_is_missing():
    end = PeerLinks(0, 2, "127.0.0.1")
    host, port, _ = end.address.rsplit(":", 2)
    stranger = socket.create_connection((host, int(port)), timeout=5)
    stranger.sendall(b"GET / HTTP/1.0\r\n\r\n")
    try:
        with pytest.raises(LinkSetupError, match=r"processes \[1\] did not connect in time"):
            end.connect(lambda q: None, time.monotonic() + 1.5)
        assert not end.connected
    finally:
        stranger.close()
        end.close()


@pytest.mark.timeout(60)
def test_a_process_with_no_published_address_cannot_connect():
    end = PeerLinks(1, 2, "127.0.0.1")
    try:
        with pytest.raises(LinkSetupError, match="process 0 published no address"):
            end.connect(lambda q: None, time.monotonic() + 1.0)
    finally:
        end.close()


def test_the_host_is_the_interface_that_reaches_the_coordinator():
    assert local_host("127.0.0.1:1234") == "127.0.0.1"
    assert local_host("localhost:1234") in ("127.0.0.1", "::1")
