"""A split launch's lock-step rounds through jax.distributed's key-value store
(``KvTransport``; ``socket_transport.SocketTransport`` sends the rounds over direct
connections instead), and the checks on the other processes while waiting: failed,
dead (heartbeat), or launching something else (``ProcessMismatchError``). ``where`` is
the process's ``multi_process.ProcessLayout``."""

from __future__ import annotations

import json
import time
from typing import Any

from palladium.interpret.errors import (
    PeerProcessError,
    ProcessMismatchError,
    RendezvousTimeoutError,
)

__all__ = ["KvTransport"]

PEER_TIMEOUT = 3.0  # a heartbeat standing still this long: the process is gone
#: Seconds another process may wait at another launch while this one waits at its own
#: before they are taken for processes running different programs (each waits for the
#: other forever otherwise; a process whose threads launch concurrently may wait at
#: several launches at once, which is not a mismatch while this one waits at one of them).
MISMATCH_WAIT = 5.0
POLL_MS = 100  # a blocking get's (or a socket wait's) slice while waiting for a peer
STORE_CHECK = 0.5  # seconds between a socket wait's questions to the store (failed? alive?)
ABORT_FLUSH = 1.0  # seconds a failing process spends handing its error to the sockets
TRANSPORT_ENV = "PALLADIUM_PROCESS_TRANSPORT"  # "sockets" (default) or "kv"

KEY_PREFIX = "palladium"
_MISMATCH = b"palladium: launches something else: "  # (a failure key's value)



class KvTransport:
    """One split launch's rounds over the coordination service's key-value store:
    round k of process p is the key ``<launch>/r<k>/<p>``."""

    def __init__(self, where: Any, launch: str, describe: str) -> None:
        self.client = where.client
        self.process = where.process
        self.num_processes = where.num_processes
        self.launch = launch
        self.describe = describe
        self.where = where
        self.round = 0
        self.seconds = 0.0  # spent in exchanges (the benchmark's cost per message)
        self._beats: dict[int, tuple[bytes | None, float]] = {}
        self._meeting: str | None = None  # what this process launches, while it meets
        self._elsewhere: dict[int, tuple[bytes, float]] = {}  # a peer waiting elsewhere
        where.start_heartbeat()

    def meet(self, timeout: float, what: str = "") -> None:
        """Every process reached this launch and launches the same ``what`` here (else
        ``RendezvousTimeoutError`` after ``timeout`` seconds naming the missing ones,
        ``ProcessMismatchError`` naming what each launches)."""
        what = what or self.launch
        self._meeting = what
        self.where.waiting(self.launch, what)
        try:
            self._meet(timeout, what)
        finally:
            self._meeting = None
            self.where.waiting(self.launch, None)

    def _meet(self, timeout: float, what: str) -> None:
        self._set(f"{self.launch}/ready/{self.process}", what.encode())
        deadline = time.monotonic() + timeout
        for q in range(self.num_processes):
            if q == self.process:
                continue
            theirs = self._wait(f"{self.launch}/ready/{q}", q, deadline)
            if theirs is not None and theirs.decode(errors="replace") != what:
                raise self._mismatch(q, what, theirs.decode(errors="replace"), "here")
            if theirs is None:
                missing = [
                    r
                    for r in range(self.num_processes)
                    if r != self.process and self._try(f"{self.launch}/ready/{r}") is None
                ]
                raise RendezvousTimeoutError(
                    f"{self.describe}: waited {timeout:g} s for all {self.num_processes} "
                    f"processes; processes {missing} never reached this launch (process "
                    f"{self.process} did). Every process must run the same launches in the "
                    f"same order; raise InterpretParams(rendezvous_timeout=...) if one is "
                    f"merely slow."
                )

    def exchange(self, payload: bytes) -> list[bytes]:
        start = time.perf_counter()
        k = self.round
        self.round += 1
        out = self._swap(k, payload)
        self.seconds += time.perf_counter() - start
        return out

    def _swap(self, k: int, payload: bytes) -> list[bytes]:
        """Every process's payload of round ``k``."""
        self._set(f"{self.launch}/r{k}/{self.process}", payload)
        out = []
        for q in range(self.num_processes):
            if q == self.process:
                out.append(payload)
                continue
            got = self._wait(f"{self.launch}/r{k}/{q}", q, None)
            assert got is not None
            out.append(got)
        if k:  # every process posted round k, so all have read round k - 1
            self.where.discard(f"{self.launch}/r{k - 1}/{self.process}")
        return out

    def abort(self, error: str) -> None:
        self._set(f"{self.launch}/failed/{self.process}", error.encode())

    # -- the key-value store ------------------------------------------------------------

    def _wait(self, key: str, peer: int, deadline: float | None) -> bytes | None:
        """The value of ``key`` (posted by ``peer``) once it exists; None at
        ``deadline``; ``PeerProcessError`` when ``peer`` failed or is gone."""
        while True:
            try:
                return bytes(self.client.blocking_key_value_get_bytes(key, POLL_MS))
            except Exception as e:  # a timeout, or the service is gone
                if "DEADLINE_EXCEEDED" not in str(e) and "timed out" not in str(e).lower():
                    raise PeerProcessError(
                        f"{self.describe}: the coordination service of jax.distributed is "
                        f"unreachable from process {self.process} (its process 0, the "
                        f"coordinator, died?): {str(e).splitlines()[0][:300]}"
                    ) from None
            self._check_peer(peer)
            if deadline is not None and time.monotonic() > deadline:
                return None

    def _check_peer(self, peer: int) -> None:
        """``PeerProcessError`` if ``peer`` posted a failure or stopped beating;
        ``ProcessMismatchError`` if, while this process meets, it waits elsewhere (or
        found that this process does)."""
        failed = self._try(f"{self.launch}/failed/{peer}")
        if failed is not None:
            if failed.startswith(_MISMATCH) and self._meeting is not None:
                theirs = failed[len(_MISMATCH):].decode(errors="replace")
                raise self._mismatch(peer, self._meeting, theirs, "at another launch")
            raise self._failed(peer, failed.decode(errors="replace"))
        self._check_alive(peer)
        if self._meeting is not None:
            self._check_elsewhere(peer, self._meeting)

    def _check_elsewhere(self, peer: int, what: str) -> None:
        """``ProcessMismatchError`` if ``peer`` has waited at launches none of which this
        process waits at, for ``MISMATCH_WAIT`` seconds (the same ones all along); the
        peer learns it from its launches' failure keys."""
        now = time.monotonic()
        posted = self._try(f"{KEY_PREFIX}/waiting/{peer}")
        try:
            theirs: dict[str, str] = json.loads(posted) if posted else {}
        except ValueError:
            theirs = {}
        if not theirs or self.launch in theirs or any(
                self.where.waits_at(launch) for launch in theirs):
            self._elsewhere.pop(peer, None)
            return
        assert posted is not None
        seen, since = self._elsewhere.get(peer, (None, now))
        if seen != posted:
            self._elsewhere[peer] = (posted, now)
            return
        if now - since >= MISMATCH_WAIT:
            for launch in theirs:
                self._set(f"{launch}/failed/{self.process}", _MISMATCH + what.encode())
            raise self._mismatch(peer, what, " and ".join(sorted(set(theirs.values()))),
                                 "at another launch")

    def _mismatch(self, peer: int, ours: str, theirs: str, where: str) -> ProcessMismatchError:
        return ProcessMismatchError(
            f"{self.describe}: the processes launch different kernels: process "
            f"{self.process} launches {ours}, process {peer} of {self.num_processes} waits "
            f"{where} with {theirs}. Every process of a jax.distributed run must run the "
            f"same kernels, on operands of the same types, with the same "
            f"InterpretParams(random_seed=...), in the same order."
        )

    def _failed(self, peer: int, error: str) -> PeerProcessError:
        return PeerProcessError(
            f"{self.describe}: process {peer} of {self.num_processes} failed in this "
            f"launch: {error}"
        )

    def _check_alive(self, peer: int) -> None:
        beat = self._try(f"{KEY_PREFIX}/heartbeat/{peer}")
        if beat is None:  # not beating yet: it has not reached a split launch so far
            return
        now = time.monotonic()
        last, since = self._beats.get(peer, (None, now))
        if beat != last or peer not in self._beats:
            self._beats[peer] = (beat, now)
            return
        if now - since > PEER_TIMEOUT:
            waited = ("for it to reach this launch" if self._meeting is not None
                      else f"for its round {self.round - 1}")
            raise PeerProcessError(
                f"{self.describe}: process {peer} of {self.num_processes} stopped "
                f"responding (no heartbeat for {now - since:.1f} s): it died or was killed "
                f"while process {self.process} waited {waited}"
            )

    def _try(self, key: str) -> bytes | None:
        try:
            return bytes(self.client.key_value_try_get_bytes(key))
        except Exception:
            return None

    def _set(self, key: str, value: bytes) -> None:
        self.client.key_value_set_bytes(key, value, allow_overwrite=True)
