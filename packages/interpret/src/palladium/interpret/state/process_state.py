"""Everything palladium.interpret keeps per process, in one place, and its one ``reset()``.

Each launch builds its own simulation and drops it at the end; what outlives a launch
is this, and only this:

=================  ========================================  ==============================
``STATE.``         what it holds                             ``reset()``
=================  ========================================  ==============================
failures           failed launches' exceptions, by failure    forgotten
                   id, for ``errors_as_raised`` (bounded)
races              ``on_race="collect"`` reports not yet      dropped
                   collected (bounded) and open scopes
rendezvous         multi-device launches waiting for their    must be empty (no launch in
                   devices                                    flight)
blas               the reference-counted one-BLAS-thread      must be idle (no launch in
                   limit of the launches in flight            flight)
rules              primitive -> interpreter rule              back to the table at import
                                                              (built-ins + entry points)
launch_observers   factories of ``add_launch_observer``       removed
launch_scopes      the ``scoped_launch_observer`` factories   untouched (each block ends
                   of the current context (a ContextVar) and   its own)
                   every open block's (for launches on XLA's
                   threads)
mode_loggers       ``LoggingMode`` -> observer factory        back to the ones at import
segments           compiled segments of kernel bodies by     untouched (a cache: what it
                   their equations (``eval.segment_cache``)  holds never changes results)
progress           the launches running now that report      nothing (empty when no launch
                   their progress, and its one thread        runs)
processes          this process's place in a jax.distributed  nothing (it belongs to the
                   run of 2+ processes and its heartbeat     jax.distributed client)
                   thread (from the first split launch)
=================  ========================================  ==============================

(``palladium.shared_memory.scheduler`` keeps one more set, of the schedulers running
right now, for Ctrl-C; it is empty whenever no launch runs, so it needs no reset.)

The classes live in their own modules (``failures``, ``race_log``, ``rendezvous``,
``blas_limit``, ``eval.rule_table``); the modules that *use* the state import it from
here. ``reset_tpu_interpret_mode_state()`` (jax's name) calls
``reset(registrations=False)``: it forgets failures and reports, not what the program
registered.
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from palladium.interpret.errors import ConfigError
from palladium.interpret.eval.rule_table import RuleRegistry, RuleSnapshot
from palladium.interpret.eval.segment_cache import SegmentExecutables
from palladium.interpret.hook.multi_process import ProcessLayouts
from palladium.interpret.state.blas_thread_limit import SingleThreadLimit
from palladium.interpret.state.failures import FailureLog
from palladium.interpret.state.progress import ProgressMonitor
from palladium.interpret.state.race_log import RaceLog
from palladium.interpret.state.rendezvous import RendezvousRegistry

__all__ = ["STATE", "ProcessState", "reset"]


@dataclasses.dataclass(eq=False)
class ProcessState:
    """The process-wide state (see the module docstring)."""

    failures: FailureLog = dataclasses.field(default_factory=FailureLog)
    races: RaceLog = dataclasses.field(default_factory=RaceLog)
    rendezvous: RendezvousRegistry = dataclasses.field(default_factory=RendezvousRegistry)
    # launches running now that report their progress (progress.py)
    progress: ProgressMonitor = dataclasses.field(default_factory=ProgressMonitor)
    blas: SingleThreadLimit = dataclasses.field(default_factory=SingleThreadLimit)
    rules: RuleRegistry = dataclasses.field(default_factory=RuleRegistry)
    # this process's place in a jax.distributed run (multi_process.py)
    processes: ProcessLayouts = dataclasses.field(default_factory=ProcessLayouts)
    # compiled segments of kernel bodies, by their equations' text (eval/segment_cache.py)
    segments: SegmentExecutables = dataclasses.field(default_factory=SegmentExecutables)
    # factory(LaunchInfo) -> Observer | None, in registration order (observers.py)
    launch_observers: list[Callable[[Any], Any]] = dataclasses.field(default_factory=list)
    observers_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    # The scoped factories of the current context (thread, asyncio task), innermost last,
    # and those of every open scope by scope (observers.py).
    launch_scopes: contextvars.ContextVar[tuple[Callable[[Any], Any], ...]] = dataclasses.field(
        default_factory=lambda: contextvars.ContextVar("palladium_launch_scopes", default=()))
    open_scopes: dict[int, tuple[Callable[[Any], Any], ...]] = dataclasses.field(
        default_factory=dict)
    # LoggingMode -> factory(LaunchInfo) -> Observer (logging_observer.py)
    mode_loggers: dict[Any, Callable[[Any], Any]] = dataclasses.field(default_factory=dict)
    _rules_at_import: RuleSnapshot | None = None
    _mode_loggers_at_import: dict[Any, Callable[[Any], Any]] | None = None

    def mark_imported(self) -> None:
        """Remember the registrations made while the package imported (what
        ``reset()`` goes back to). Called once, at the end of the package's import."""
        self._rules_at_import = self.rules.snapshot()
        self._mode_loggers_at_import = dict(self.mode_loggers)

    def reset(self, *, registrations: bool = True) -> None:
        """Forget failures and race reports; with ``registrations`` also restore the
        rule table and the mode loggers to what the package's import registered and
        remove every launch observer, which a running launch may be using: then it
        raises ``ConfigError`` while a launch runs."""
        if registrations:
            waiting, holding = len(self.rendezvous), self.blas.depth
            if waiting or holding:
                raise ConfigError(
                    f"palladium.interpret's registrations cannot be reset while launches "
                    f"run ({waiting} multi-device launch(es) waiting for devices, "
                    f"{holding} launch(es) in flight): call reset() after they finished "
                    f"(jax.block_until_ready on their results)"
                )
        self.failures.clear()
        self.races.clear()
        if not registrations:
            return
        if self._rules_at_import is not None:
            self.rules.restore(self._rules_at_import)
        if self._mode_loggers_at_import is not None:
            self.mode_loggers.clear()
            self.mode_loggers.update(self._mode_loggers_at_import)
        with self.observers_lock:
            self.launch_observers.clear()


STATE = ProcessState()


def reset(*, registrations: bool = True) -> None:
    """Put palladium.interpret's process-wide state back to how the import left it
    (see the module docstring); ``registrations=False`` keeps registered rules and
    observers."""
    STATE.reset(registrations=registrations)
