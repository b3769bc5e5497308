"""Launch observers: who hears what a kernel launch does.

``palladium.shared_memory`` reports a simulation's events to :class:`Observer` objects
(allocations, DMAs, semaphore waits, barriers, core switches); the interpreter adds its
own through the same seam (grid steps, pipeline block copies, compute equations). A
tool that wants to see every launch (the timeline, a pytest plugin) registers a
*factory* here with :func:`add_launch_observer`: each launch calls it with a
:class:`LaunchInfo` and registers the observer it returns (None: not interested). The
logging modes (``InterpretParams.logging_mode``) are one such observer.

>>> from palladium.shared_memory import Observer
>>> class Steps(Observer):
...     def __init__(self): self.steps = 0
...     def grid_step_begin(self, core, step, grid_point): self.steps += 1
>>> seen = []
>>> def factory(info):
...     seen.append(Steps())
...     return seen[-1]
>>> add_launch_observer(factory)
>>> remove_launch_observer(factory)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from palladium.interpret.logging_observer import logging_observers
from palladium.interpret.process_state import STATE
from palladium.shared_memory import Observer

__all__ = [
    "LaunchInfo",
    "LaunchObserverFactory",
    "add_launch_observer",
    "launch_observers",
    "remove_launch_observer",
]


@dataclasses.dataclass(frozen=True)
class LaunchInfo:
    """What an observer factory learns about a launch before it runs.

    ``kernel`` is the prepared kernel (``palladium.interpret.kernel.PreparedKernel``:
    its jaxpr, operands and their block specs); ``params`` the ``InterpretParams``.
    """

    kernel_name: str
    grid: tuple[int, ...]
    num_devices: int
    num_cores: int
    chip: str
    params: Any
    kernel: Any
    launch_location: str | None = None

    @property
    def memory(self) -> Any:
        """The kernel's VMEM/SMEM use per core and the chip's limits
        (``palladium.interpret.fidelity.memory_budget.MemoryUse``), or None."""
        return getattr(self.kernel, "memory_use", None)


LaunchObserverFactory = Callable[[LaunchInfo], Observer | None]

_FACTORIES = STATE.launch_observers  # reset() removes them all
_LOCK = STATE.observers_lock


def add_launch_observer(factory: LaunchObserverFactory) -> None:
    """Call ``factory(info)`` for every launch from now on (from any thread, jit's
    callback threads included); it returns the launch's observer or None."""
    with _LOCK:
        if factory not in _FACTORIES:
            _FACTORIES.append(factory)


def remove_launch_observer(factory: LaunchObserverFactory) -> None:
    """Stop calling ``factory`` (unknown factories are ignored)."""
    with _LOCK:
        if factory in _FACTORIES:
            _FACTORIES.remove(factory)


def launch_observers(info: LaunchInfo) -> list[Observer]:
    """The observers of one launch: the registered factories' and the logging mode's."""
    with _LOCK:
        factories = list(_FACTORIES)
    out = [obs for obs in (f(info) for f in factories) if obs is not None]
    return out + logging_observers(info)
