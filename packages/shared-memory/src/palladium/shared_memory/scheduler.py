"""The scheduler: simulated cores run as coroutines, exactly one at a time.

Each body runs as its own greenlet (a coroutine with its own stack) on the thread that
called ``run``: exactly one executes at a time. At each synchronisation point the running
body asks the scheduler who runs next, picked with a seeded ``random.Random`` among the
runnable bodies, and switches to it. Because nothing else runs concurrently, a run is a
pure function of the seed. (Bodies used to be OS threads handing a baton over: each
switch then cost two or three kernel context switches and GIL hand-offs, ~60-100 µs
under load, and dominated DMA-heavy multi-device runs; a greenlet switch costs ~1 µs.)

A body that must wait (a semaphore count too low, a barrier) is *blocked* with a
readiness predicate; the scheduler only switches to it once the predicate holds.
When no body is runnable and some are blocked, that is a deadlock: the body that
found it raises :class:`DeadlockError` listing every blocked core.

Wake-lists: the candidates of a pick are the runnable tasks in task order, kept
incrementally (``_runnable``, sorted task indices) instead of evaluating every blocked
task's predicate at every switch. A task blocks *on* a :class:`WaitPoint` (a semaphore,
the barrier); whoever changes what the wait depends on calls ``changed()`` on it, which
re-evaluates the predicates of the tasks blocked there. The candidates, their order and
the RNG calls are exactly those of the full scan (``_scan``), which a scheduler built
with ``oracle=True`` (tests) runs at every pick and compares with the wake-list.

The first exception of any body cancels the run: every other body is resumed in turn
(one at a time, still), raises the private ``_Cancelled`` inside its blocked wait and
unwinds; then ``run`` re-raises the first exception.
"""

from __future__ import annotations

import bisect
import contextlib
import enum
import math
import random
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import greenlet

from palladium.shared_memory.errors import DeadlockError, WatchdogError, at_site, core_name
from palladium.shared_memory.observer import Observer
from palladium.shared_memory.wait_point import WaitPoint

__all__ = ["Scheduler", "Task", "WaitPoint", "interrupt_all"]

# The schedulers running right now: the only process-wide state, so that an interrupt
# (Ctrl-C seen by a thread other than the one blocked in XLA) can cancel them.
_RUNNING: weakref.WeakSet[Scheduler] = weakref.WeakSet()
_RUNNING_LOCK = threading.Lock()


def interrupt_all(exc: BaseException) -> int:
    """Cancel every running scheduler with ``exc`` (raised from its ``run``); its cores
    unwind at their next scheduling point. Returns how many runs were cancelled."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for sched in running:
        sched.interrupt(exc)
    return len(running)


class _Cancelled(BaseException):
    """Raised inside a body whose run was cancelled by another body's error."""


class _State(enum.Enum):
    READY = 0
    BLOCKED = 1
    DONE = 2


class Task:
    """A simulated core's body and its scheduling state."""

    __slots__ = ("body", "core", "describe", "glet", "index", "listed", "ready", "sched",
                 "site", "state", "watch")

    def __init__(self, core: Any, body: Callable[[], None], index: int = 0,
                 sched: Scheduler | None = None) -> None:
        self.core = core
        self.body = body
        self.index = index  # position in the scheduler's task order
        self.sched = sched
        self.state = _State.READY
        self.ready: Callable[[], bool] | None = None
        self.describe: Callable[[], str] | None = None
        self.watch: WaitPoint | None = None  # what a blocked task waits on (None: unknown)
        self.listed = True  # in the scheduler's runnable list
        self.glet: greenlet.greenlet | None = None  # the body's coroutine (None: not started)
        self.site: object = None  # where the body last reached a scheduling point


class Scheduler:
    """Runs bodies one at a time, choosing the next runner from a seeded RNG.

    ``trace`` records the core handed the baton at every switch (for tests and
    debugging); ``local.task`` is the task whose body runs now (on the thread of ``run``).
    """

    def __init__(self, rng: random.Random, local: threading.local, trace: list,
                 observers: Observer | None = None, *, watchdog: float | None = None,
                 watchdog_hint: str = "", oracle: bool = False):
        self.rng = rng
        self.local = local
        self.tasks: list[Task] = []
        self._runnable: list[int] = []  # indices of READY tasks and ready BLOCKED ones
        self._unwatched: list[Task] = []  # blocked on no WaitPoint: checked at each pick
        # Check every pick's wake-list candidates against the full scan (tests only).
        self.oracle = oracle
        self.cancelled = False
        self.error: BaseException | None = None
        self.trace = trace
        self.observers = observers  # told of every core switch (None: nobody listens)
        # A run still going ``watchdog`` seconds after it started fails (None: never).
        self.watchdog = watchdog
        self.watchdog_hint = watchdog_hint
        self.deadline = math.inf
        # A partitioned simulation's round (``partition.Rounds.stall``): called when no
        # local task can run; None when something changed, else the deadlock message.
        self.on_stall: Callable[[Sequence[Task]], str | None] | None = None
        # Told of the run's first error while every core is still where it was (before
        # the others unwind): the simulation snapshots its state there.
        self.on_error: Callable[[BaseException, Task | None], None] | None = None

    # -- running -----------------------------------------------------------------------

    def run(self, bodies: dict) -> None:
        """Run every body to completion (or the first error, re-raised here)."""
        self.tasks = [Task(core, bodies[core], i, self) for i, core in enumerate(sorted(bodies))]
        self._runnable = list(range(len(self.tasks)))
        self._unwatched = []
        if self.watchdog is not None:
            self.deadline = time.monotonic() + self.watchdog
        if len(self.tasks) == 1:
            # One body: no other thread could ever take the baton, run it right here.
            task = self.tasks[0]
            self.local.task = task
            with _RUNNING_LOCK:
                _RUNNING.add(self)
            try:
                task.body()
            except _Cancelled:
                error, self.error = self.error, None
                assert error is not None
                raise error from None
            except BaseException as e:
                self._failed(e, task)
                raise
            finally:
                with _RUNNING_LOCK:
                    _RUNNING.discard(self)
                task.state = _State.DONE
                self.local.task = None
            return
        hub = greenlet.getcurrent()
        for task in self.tasks:
            # Started here, where it parks at once: every body's stack then begins at the
            # hub's, whoever first switches to it. A greenlet first entered from another
            # body would stack on top of that body's frames: with hundreds of cores the
            # recursion limit is reached, and each switch copies the stacks in between.
            task.glet = greenlet.greenlet(self._task_main, parent=hub)
            task.glet.switch(task)
        nxt = self._pick()
        assert nxt is not None
        self._switch(None, nxt)
        with _RUNNING_LOCK:
            _RUNNING.add(self)
        try:
            # Bodies switch to one another directly; a body that finishes returns here
            # with the task to run next (None: the run is over).
            while nxt is not None:
                try:
                    self.local.task = nxt
                    assert nxt.glet is not None
                    nxt = nxt.glet.switch(nxt)
                except BaseException as e:  # Ctrl-C between switches: unwind every core
                    self.interrupt(e)
                    nxt = next((t for t in self.tasks if t.state is not _State.DONE), None)
        finally:
            self.local.task = None
            with _RUNNING_LOCK:
                _RUNNING.discard(self)
        error, self.error = self.error, None
        if error is not None:
            raise error

    def _task_main(self, task: Task) -> Task | None:
        hub = greenlet.getcurrent().parent
        assert hub is not None
        hub.switch()  # parked until first picked
        try:
            if self.cancelled:
                raise _Cancelled
            task.body()
        except _Cancelled:
            pass
        except BaseException as e:  # the body's error ends the whole run
            if self.error is None:
                self._failed(e, task)
                self.error = e
            self.cancelled = True
        return self._finish(task)

    def _finish(self, task: Task) -> Task | None:
        """``task`` ended: the task to run next (None: the run is over)."""
        task.state = _State.DONE
        self._unlist(task)
        nxt = None
        if not self.cancelled:
            nxt = self._pick()
            if nxt is None and any(t.state is _State.BLOCKED for t in self.tasks):
                try:
                    nxt, message = self._stalled()
                except BaseException as e:  # a peer process failed or vanished
                    nxt, message = None, None
                    self.error = e
                    self._failed(e, None)
                    self.cancelled = True
                if nxt is None and not self.cancelled:
                    self.error = DeadlockError(message or self.deadlock_message())
                    self._failed(self.error, None)
                    self.cancelled = True
        if self.cancelled:
            nxt = next((t for t in self.tasks if t.state is not _State.DONE), None)
        if nxt is not None:
            self._switch(task, nxt)
        return nxt

    # -- synchronisation points ----------------------------------------------------------

    def _failed(self, error: BaseException, task: Task | None) -> None:
        if self.on_error is not None:
            # A snapshot must never hide the error itself.
            with contextlib.suppress(Exception):
                self.on_error(error, task)

    def core_states(self, failed: Task | None = None) -> list[tuple[Any, str, str]]:
        """(core, state, where) of every task: ``failed`` (the task whose error this
        is), blocked (with what it waits for), runnable, finished; ``where`` is what
        it waits for, or where it last reached a scheduling point."""
        out = []
        for t in self.tasks:
            seen = "" if t.site is None else f"last seen at {t.site}"
            if t is failed:
                out.append((t.core, "failed", seen))
            elif t.state is _State.BLOCKED and t.describe is not None:
                out.append((t.core, "blocked", t.describe()))
            elif t.state is _State.DONE:
                out.append((t.core, "finished", ""))
            elif len(self.tasks) == 1 or (self.trace and self.trace[-1] == t.core):
                out.append((t.core, "running", seen))  # it holds the baton
            else:
                out.append((t.core, "runnable", seen))
        return out

    def check(self) -> None:
        """Raise the cancellation exception if the run was cancelled."""
        if self.cancelled:
            raise _Cancelled

    def interrupt(self, exc: BaseException) -> None:
        """Cancel the run from outside it: ``run`` raises ``exc`` once every core has
        unwound (at its next scheduling point or loop iteration)."""
        if self.error is None:
            self.error = exc
        self.cancelled = True

    def tick(self, task: Task | None, site: object = None) -> None:
        """A point a looping body passes on every iteration (``site``: where): raises
        ``WatchdogError`` once the run outlived its watchdog budget."""
        if self.cancelled:
            raise _Cancelled
        if task is not None and site is not None:
            task.site = site
        if time.monotonic() > self.deadline:
            self.deadline = math.inf  # one report; the others are cancelled by it
            raise WatchdogError(self.watchdog_message(task))

    def yield_point(self, task: Task | None, site: object = None) -> None:
        """A synchronisation point: maybe hand the baton to another runnable task."""
        self.tick(task, site)
        if task is None or len(self.tasks) < 2:
            return
        nxt = self._pick()
        if nxt is not None and nxt is not task:
            self._handoff(task, nxt)

    def block(self, task: Task | None, ready: Callable[[], bool], describe: Callable[[], str],
              watch: WaitPoint | None = None) -> None:
        """Wait until ``ready()`` holds (the caller re-checks its condition afterwards).

        ``watch``: the WaitPoint told of every change ``ready()`` depends on (without
        one, ``ready()`` is evaluated at every pick). Raises ``DeadlockError`` when no
        task could ever run again.
        """
        if self.cancelled:
            raise _Cancelled
        if task is None:
            raise DeadlockError(
                "a wait outside a running simulation can never be satisfied:\n  " + describe()
            )
        task.state = _State.BLOCKED
        task.ready = ready
        task.describe = describe
        task.watch = watch
        if watch is None:
            self._unwatched.append(task)
            self._unlist(task)
        else:
            watch.wait(task)
            if not ready():
                self._unlist(task)
        try:
            nxt = self._pick()
            if nxt is None:
                nxt, message = self._stalled()
                if nxt is None:
                    raise DeadlockError(message or self.deadlock_message())
            if nxt is not task:
                self._handoff(task, nxt)
        finally:
            task.state = _State.READY
            task.ready = None
            task.describe = None
            if watch is None:
                self._unwatched.remove(task)
            else:
                watch.unwait(task)
            task.watch = None
            self._list(task)

    def _stalled(self) -> tuple[Task | None, str | None]:
        """No task can run: without ``on_stall``, (None, None); else rounds with the
        other processes until a task can run, or (None, their deadlock message)."""
        while self.on_stall is not None:
            message = self.on_stall(self.tasks)
            if message is not None:
                return None, message
            nxt = self._pick()
            if nxt is not None:
                return nxt, None
        return None, None

    # -- the runnable list -------------------------------------------------------------

    def recheck(self, task: Task) -> None:
        """``task``'s wait point changed: list or unlist it by its readiness now."""
        if task.state is not _State.BLOCKED:
            return
        assert task.ready is not None
        if task.ready():
            self._list(task)
        else:
            self._unlist(task)

    def _list(self, task: Task) -> None:
        if not task.listed:
            task.listed = True
            bisect.insort(self._runnable, task.index)

    def _unlist(self, task: Task) -> None:
        if task.listed:
            task.listed = False
            runnable = self._runnable
            del runnable[bisect.bisect_left(runnable, task.index)]

    def _candidates(self) -> list[int]:
        """Indices of the runnable tasks, in task order (the wake-list's view)."""
        if not self._unwatched:
            return self._runnable
        extra = [t.index for t in self._unwatched if t.ready()]  # type: ignore[misc]
        return sorted(self._runnable + extra) if extra else self._runnable

    def _scan(self) -> list[int]:
        """The candidates by brute force: every task's state and predicate (the oracle)."""
        return [
            t.index for t in self.tasks
            if t.state is _State.READY or (t.state is _State.BLOCKED and t.ready())  # type: ignore[misc]
        ]

    def _pick(self) -> Task | None:
        candidates = self._candidates()
        if self.oracle:  # pick from the brute-force scan, after checking the wake-list
            scanned = self._scan()
            if scanned != candidates:
                raise AssertionError(
                    f"wake-list candidates {candidates} differ from the scan's {scanned}"
                )
            candidates = scanned
        if not candidates:
            return None
        if len(candidates) == 1:
            return self.tasks[candidates[0]]
        return self.tasks[candidates[self.rng.randrange(len(candidates))]]

    def _switch(self, task: Task | None, nxt: Task) -> None:
        self.trace.append(nxt.core)
        if self.observers is not None:
            self.observers.core_switch(None if task is None else task.core, nxt.core)

    def _handoff(self, task: Task, nxt: Task) -> None:
        self._switch(task, nxt)
        self.local.task = nxt  # whoever switches back to ``task`` sets it back
        assert nxt.glet is not None
        nxt.glet.switch(nxt)
        if self.cancelled:
            raise _Cancelled

    # -- messages ----------------------------------------------------------------------

    def watchdog_message(self, running: Task | None) -> str:
        """Every core's state and where it is, for a run that outlived its budget."""
        lines = [f"watchdog: the run is still going after {self.watchdog:g} s (a core "
                 f"loops and nothing ends it); each core:"]
        for t in self.tasks:
            if t is running:
                lines.append(f"  {core_name(t.core)} is looping{at_site(t.site)}")
            elif t.state is _State.BLOCKED:
                assert t.describe is not None
                lines.append(f"  {core_name(t.core)} is blocked: {t.describe()}")
            elif t.state is _State.DONE:
                lines.append(f"  {core_name(t.core)} finished")
            else:
                seen = "" if t.site is None else f" (last seen at {t.site})"
                lines.append(f"  {core_name(t.core)} is runnable{seen}")
        if self.watchdog_hint:
            lines.append(self.watchdog_hint)
        return "\n".join(lines)

    def deadlock_message(self) -> str:
        """Every blocked core with what it waits for (and which cores finished)."""
        lines = ["deadlock: every core is blocked and no DMA can make progress."]
        for t in self.tasks:
            if t.state is _State.BLOCKED:
                assert t.describe is not None
                lines.append(f"  {core_name(t.core)} {t.describe()}")
        finished = [core_name(t.core) for t in self.tasks if t.state is _State.DONE]
        if finished:
            lines.append(f"  finished: {', '.join(finished)}")
        return "\n".join(lines)
