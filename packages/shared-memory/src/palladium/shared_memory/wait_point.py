"""What a blocked core waits on, so that the scheduler re-checks it only when it changed.

A ``WaitPoint`` (a semaphore, the barrier) lists the scheduler tasks blocked on it;
whoever changes the state their readiness depends on calls ``changed()``, and each
task's scheduler re-evaluates that task's readiness (see ``scheduler.py``: wake-lists).
Apart from the scheduler so that ``semaphores`` can use it without an import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from palladium.shared_memory.scheduler import Task

__all__ = ["WaitPoint"]


class WaitPoint:
    """Something tasks block on. Cheap when nobody waits: hot paths test ``waiting``
    before calling ``changed()``. ``waiting`` is the empty tuple until a task first
    blocks here (``wait``): most semaphores of a launch never have a waiter."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting: list[Task] | tuple = ()

    def wait(self, task: Task) -> None:
        """``task`` blocks here (``unwait`` when it no longer does)."""
        if self.waiting:
            self.waiting.append(task)  # type: ignore[union-attr]
        else:
            self.waiting = [task]

    def unwait(self, task: Task) -> None:
        """``task`` no longer blocks here."""
        self.waiting.remove(task)  # type: ignore[union-attr]

    def changed(self) -> None:
        """Re-evaluate the readiness of every task blocked here."""
        for task in self.waiting:
            assert task.sched is not None
            task.sched.recheck(task)
