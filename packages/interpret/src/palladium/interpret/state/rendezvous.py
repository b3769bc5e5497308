"""Where the devices of one multi-device launch meet.

Under ``shard_map`` over N devices XLA calls the launch's host callback once per device,
concurrently, each on its own thread. Every callback deposits its operands in the
launch's ``Rendezvous``; the last to arrive runs all devices' cores in ONE simulation
(one scheduler, one seed), then every callback takes its own device's outputs, or
raises the simulation's error. If some device never arrives, the ones waiting give up
after a timeout with ``RendezvousTimeoutError`` instead of hanging; ``on_timeout`` then
lets the caller re-align the devices, so that the next launch meets again (a device that
skipped one launch, under ``lax.cond``, must not be one launch behind forever).

The registry of rendezvous still waiting for devices is the only process-wide state: an
entry is removed as soon as its last device arrived or its wait timed out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from palladium.interpret.errors import KernelError, RendezvousTimeoutError

Run = Callable[[list[Any]], list[Any]]


class Rendezvous:
    """One launch being assembled from its devices' callbacks."""

    def __init__(self, num_devices: int) -> None:
        self.num_devices = num_devices
        self.operands: dict[int, Any] = {}
        self.all_arrived = threading.Event()
        self.finished = threading.Event()
        self.results: list[Any] | None = None
        self.error: BaseException | None = None
        self.last_arrival = time.monotonic()  # (the deadline runs from the latest arrival)


class RendezvousRegistry:
    """The rendezvous still waiting for devices, by launch key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[Hashable, Rendezvous] = {}
        # Interrupted launches whose devices have not all arrived yet: {key: (exc, arrived)}
        # so that the late ones fail at once instead of waiting for the timeout.
        self._interrupted: dict[Hashable, tuple[BaseException, set[int]]] = {}
        #: How many device arrivals there were (ever): whether multi-device launches ran.
        self.arrivals = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting)

    def interrupt_all(self, exc: BaseException) -> int:
        """Fail every launch still waiting for devices with ``exc`` (Ctrl-C): the devices
        waiting raise it now, those still to come raise it on arrival."""
        with self._lock:
            waiting, self._waiting = self._waiting, {}
            for key, rv in waiting.items():
                rv.error = exc
                self._interrupted[key] = (exc, set(rv.operands))
                rv.all_arrived.set()
                rv.finished.set()
        return len(waiting)

    def join(
        self,
        key: Hashable,
        num_devices: int,
        device: int,
        operands: Any,
        run: Run,
        *,
        timeout: float,
        describe: Callable[[], str],
        on_timeout: Callable[[], None] | None = None,
    ) -> Any:
        """Deposit ``device``'s operands; return its share of ``run(all operands)``.

        The last device to arrive calls ``run`` with the operands in device order; its
        result (a list, one entry per device) is shared out. An exception of ``run`` is
        raised on every device. ``describe()`` names the launch in a timeout message;
        ``on_timeout()`` is called once (under the registry's lock) when it times out.
        """
        with self._lock:
            self.arrivals += 1
            gone = self._interrupted.get(key)
            if gone is not None:
                exc, bounced = gone
                bounced.add(device)
                if len(bounced) >= num_devices:
                    del self._interrupted[key]
                raise exc
            rv = self._waiting.get(key)
            if rv is None:
                rv = self._waiting[key] = Rendezvous(num_devices)
            if device in rv.operands:
                raise KernelError(f"{describe()}: device {device} arrived twice")
            rv.operands[device] = operands
            rv.last_arrival = time.monotonic()
            last = len(rv.operands) == num_devices
            if last:
                del self._waiting[key]
                rv.all_arrived.set()
        if last:
            try:
                rv.results = run([rv.operands[d] for d in range(num_devices)])
            except BaseException as e:
                rv.error = e
            finally:
                rv.finished.set()
        else:
            self._await_rest(rv, key, num_devices, timeout, describe, on_timeout)
        rv.finished.wait()
        if rv.error is not None:
            raise rv.error
        assert rv.results is not None
        return rv.results[device]

    def _await_rest(self, rv: Rendezvous, key: Hashable, num_devices: int, timeout: float,
                    describe: Callable[[], str],
                    on_timeout: Callable[[], None] | None) -> None:
        """Wait for the other devices; time out ``timeout`` seconds after the latest
        arrival (devices still arriving one by one, each slow to prepare its first
        launch on a loaded machine, are progress, not a hang)."""
        wait = timeout
        while not rv.all_arrived.wait(wait):
            with self._lock:
                if rv.all_arrived.is_set() or rv.error is not None:
                    return
                idle = time.monotonic() - rv.last_arrival
                if idle < timeout:
                    wait = timeout - idle
                    continue
                if self._waiting.get(key) is rv:
                    del self._waiting[key]
                arrived = sorted(rv.operands)
                missing = sorted(set(range(num_devices)) - set(arrived))
                rv.error = RendezvousTimeoutError(
                    f"{describe()}: waited {timeout:g} s after the latest arrival for "
                    f"all {num_devices} devices; "
                    f"devices {missing} never arrived (arrived: {arrived}). XLA must run "
                    f"every device's host callback concurrently (one thread per device); "
                    f"a launch whose devices run one after another cannot meet. Raise "
                    f"InterpretParams(rendezvous_timeout=...) if a device is merely slow."
                )
                rv.finished.set()
                if on_timeout is not None:
                    on_timeout()
                return
