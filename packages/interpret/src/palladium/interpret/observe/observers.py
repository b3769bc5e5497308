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

import contextlib
import dataclasses
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from palladium.interpret.observe.logging_observer import launch_logger, mode_loggers
from palladium.interpret.state.process_state import STATE
from palladium.shared_memory import Observer

__all__ = [
    "LaunchInfo",
    "LaunchObserverFactory",
    "add_launch_observer",
    "launch_observers",
    "remove_launch_observer",
    "may_observe",
    "scoped_launch_observer",
]


@dataclasses.dataclass(frozen=True)
class LaunchInfo:
    """What an observer factory learns about a launch before it runs.

    ``kernel`` is the prepared kernel (``palladium.interpret.kernel.prepared_kernel.PreparedKernel``:
    its jaxpr, operands and their block specs); ``params`` the ``InterpretParams``;
    ``plan`` the launch's ``run.execution_plan.ExecutionPlan`` as decided before its
    observers were made (an observed launch is never compiled whole; ``str(plan)``:
    "launch 2 ran segments, because ..."). The logging mode's ``LoggingObserver`` gets
    the final plan (``simulated`` where an observer is told of every equation).
    """

    kernel_name: str
    grid: tuple[int, ...]
    num_devices: int
    num_cores: int
    chip: str
    params: Any
    kernel: Any
    launch_location: str | None = None
    plan: Any = None

    @property
    def memory(self) -> Any:
        """The kernel's VMEM/SMEM use per core and the chip's limits
        (``palladium.interpret.fidelity.memory_budget.MemoryUse``), or None."""
        return getattr(self.kernel, "memory_use", None)


LaunchObserverFactory = Callable[[LaunchInfo], Observer | None]

_FACTORIES = STATE.launch_observers  # reset() removes them all
_LOCK = STATE.observers_lock
_SCOPES = STATE.launch_scopes  # a ContextVar
_OPEN = STATE.open_scopes


def add_launch_observer(factory: LaunchObserverFactory) -> None:
    """Call ``factory(info)`` for every launch of the process from now on (every thread,
    jit's callback threads included); it returns the launch's observer or None. To
    observe only the launches of one thread or task, use ``scoped_launch_observer``."""
    with _LOCK:
        if factory not in _FACTORIES:
            _FACTORIES.append(factory)


def remove_launch_observer(factory: LaunchObserverFactory) -> None:
    """Stop calling ``factory`` (unknown factories are ignored)."""
    with _LOCK:
        if factory in _FACTORIES:
            _FACTORIES.remove(factory)


@contextlib.contextmanager
def scoped_launch_observer(factory: LaunchObserverFactory) -> Iterator[None]:
    """Call ``factory(info)`` for every launch of *this context* within the block: launches
    run by this thread (or asyncio task, and the tasks it creates inside the block), not
    by other threads. Blocks nest; ``palladium.interpret.timeline()`` and the pytest
    plugin record through this.

    A launch's host callback runs on the thread that called the kernel, except for a
    multi-device launch (``shard_map``), which runs on XLA's own threads, where no
    caller context exists: it is observed by the open blocks if they all belong to one
    context, and by none (with a ``RuntimeWarning``) if blocks are open in several.
    A thread started inside the block does not inherit it (``threading.Thread`` starts
    with an empty context): run its target in ``contextvars.copy_context()`` for that.
    """
    chain = (*_SCOPES.get(), factory)
    token = _SCOPES.set(chain)
    key = object()
    with _LOCK:
        _OPEN[id(key)] = chain
    try:
        yield
    finally:
        with _LOCK:
            del _OPEN[id(key)]
        _SCOPES.reset(token)


def _on_xla_thread() -> bool:
    # XLA's threads enter Python as "dummy" threads, never started by the program.
    return isinstance(threading.current_thread(), threading._DummyThread)


def _foreign_scopes(info: LaunchInfo) -> tuple[LaunchObserverFactory, ...]:
    """The open scopes a launch on XLA's threads belongs to: those of the one context
    that has scopes open (each open block's chain is a prefix of the longest), else none."""
    with _LOCK:
        chains = list(_OPEN.values())
    if not chains:
        return ()
    longest = max(chains, key=len)
    if all(longest[: len(c)] == c for c in chains):
        return longest
    contexts = sum(1 for c in chains
                   if not any(len(o) > len(c) and o[: len(c)] == c for o in chains))
    warnings.warn(
        f"palladium: kernel '{info.kernel_name}' ran on XLA's threads (a multi-device "
        f"launch) while launch observers (timelines, the pytest plugin) were open in "
        f"{contexts} contexts (threads or tasks); it cannot be told whose launch it is, so "
        f"none records it. Run multi-device launches from one thread at a time while "
        f"recording.", RuntimeWarning, stacklevel=2)
    return ()


def may_observe(params: Any) -> bool:
    """Whether a launch with ``params`` in this context may get an observer (a factory
    is registered, a scope is open, or a logging mode is set): cheap, without making
    the observers."""
    if getattr(params, "logging_mode", None):
        return True
    with _LOCK:
        if _FACTORIES:
            return True
    return bool(_SCOPES.get()) or (_on_xla_thread() and bool(_OPEN))


def launch_observers(info: LaunchInfo,
                     final: Callable[[list[Observer]], LaunchInfo] | None = None
                     ) -> list[Observer]:
    """The observers of one launch: the registered factories', the scoped ones of the
    context the launch runs in (see ``scoped_launch_observer``) and the logging mode's.
    ``final(observers)``: the launch's info once those others are known (its execution
    plan may change with them), which the logging mode's ``LoggingObserver`` logs."""
    with _LOCK:
        factories = list(_FACTORIES)
    scoped = _SCOPES.get()
    if not scoped and _on_xla_thread():
        scoped = _foreign_scopes(info)
    out = [obs for obs in (f(info) for f in (*factories, *scoped)) if obs is not None]
    out += mode_loggers(info)
    return out + launch_logger(info if final is None else final(out))
