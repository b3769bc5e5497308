"""``InterpretParams.logging_mode`` as an observer: what each mode logs, and when."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from palladium.interpret.params import LoggingMode
from palladium.interpret.state.process_state import STATE
from palladium.shared_memory import BlockCopy, BufferRef, MemorySpace, Observer, SemaphoreInfo

if TYPE_CHECKING:  # observers imports this module to build the logging observer
    from palladium.interpret.observe.observers import LaunchInfo

logger = logging.getLogger("palladium.interpret")

CoreId = tuple[int, int]


#: The hooks each mode logs by.
_HOOKS = ((LoggingMode.GRID, ("grid_step_begin",)),
          (LoggingMode.MEMORY, ("allocate", "block_copy")),
          (LoggingMode.SEMAPHORE, ("semaphore_signal", "semaphore_wait_begin",
                                   "semaphore_wait_end")),
          (LoggingMode.BARRIER, ("barrier_begin", "barrier_end")))


class LoggingObserver(Observer):
    """Logs (DEBUG, logger ``palladium.interpret``) what ``mode`` asks for: ``LAUNCH``
    the launch, ``GRID`` every grid point a core runs, ``MEMORY`` every allocation and
    pipeline block copy, ``SEMAPHORE`` every signal and wait, ``BARRIER`` every barrier."""

    def __init__(self, info: LaunchInfo, mode: LoggingMode) -> None:
        self.name = info.kernel_name
        self.mode = mode
        if LoggingMode.LAUNCH in mode:
            logger.debug("launch %s: grid %s on %d device(s) x %d core(s), chip %s",
                         info.kernel_name, info.grid, info.num_devices, info.num_cores,
                         info.chip)
            if info.plan is not None:  # "launch 3 ran segments, because ..."
                logger.debug("launch %s: %s", info.kernel_name, info.plan)
            if info.memory is not None:
                logger.debug("launch %s: %s", info.kernel_name, info.memory.summary())
        # A hook the mode does not ask for is the no-op again: ObserverSet skips it.
        for flag, hooks in _HOOKS:
            if flag not in mode:
                for hook in hooks:
                    vars(self)[hook] = getattr(Observer, hook).__get__(self)

    def semaphore_signal(self, core: CoreId, sem: SemaphoreInfo, inc: int) -> None:
        logger.debug("%s: device %d core %d signals semaphore %s of device %d core %d by %d",
                     self.name, core[0], core[1], sem.label, sem.core[0], sem.core[1], inc)

    def semaphore_wait_begin(self, core: CoreId, sem: SemaphoreInfo, value: int) -> None:
        logger.debug("%s: device %d core %d waits for %d on semaphore %s", self.name,
                     core[0], core[1], value, sem.label)

    def semaphore_wait_end(self, core: CoreId, sem: SemaphoreInfo, value: int) -> None:
        logger.debug("%s: device %d core %d got %d from semaphore %s", self.name, core[0],
                     core[1], value, sem.label)

    def barrier_begin(self, core: CoreId) -> None:
        logger.debug("%s: device %d core %d enters the barrier", self.name, core[0], core[1])

    def barrier_end(self, core: CoreId) -> None:
        logger.debug("%s: device %d core %d leaves the barrier", self.name, core[0], core[1])

    def grid_step_begin(self, core: CoreId, step: int, grid_point: tuple[int, ...]) -> None:
        logger.debug("%s: core %d grid point %s", self.name, core[1], grid_point)

    def allocate(self, buf: BufferRef, nbytes: int, core: CoreId) -> None:
        logger.debug("%s: allocate %s %s %s on core %s", self.name, buf.space, buf.name,
                     buf.shape, core[1])

    def block_copy(self, copy: BlockCopy) -> None:
        space = copy.space.name if isinstance(copy.space, MemorySpace) else str(copy.space)
        kind, src, dst = (("input", "HBM", space) if copy.direction == "in"
                          else ("output", space, "HBM"))
        logger.debug("%s: core %d grid point %s: copy block %s of %s '%s' %s -> %s", self.name,
                     copy.core[1], copy.grid_point, copy.block, kind, copy.operand, src, dst)


def launch_logger(info: LaunchInfo) -> list[Observer]:
    """The ``LoggingObserver`` of a launch (none without a ``logging_mode``): it logs
    ``info`` (with the launch's final execution plan) when made."""
    mode = getattr(info.params, "logging_mode", None)
    return [LoggingObserver(info, mode)] if mode else []


def mode_loggers(info: LaunchInfo) -> list[Observer]:
    """The observers of the logging modes built elsewhere (``register_mode_logger``)."""
    mode = getattr(info.params, "logging_mode", None)
    if not mode:
        return []
    return [factory(info) for flag, factory in _MODE_LOGGERS.items() if flag in mode]


# The observers of logging modes built elsewhere, registered by the module that builds
# them (``perf.timeline``: ``LoggingMode.TIMELINE``'s summary), so that this module
# imports none of them (they import ``observers``, which imports this module).
_MODE_LOGGERS = STATE.mode_loggers


def register_mode_logger(mode: LoggingMode, factory: Callable[[LaunchInfo], Observer]) -> None:
    """Have ``mode_loggers`` add ``factory(info)`` to each launch logging ``mode``."""
    _MODE_LOGGERS[mode] = factory
