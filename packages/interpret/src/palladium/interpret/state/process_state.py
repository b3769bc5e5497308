"""Everything palladium.interpret keeps per process, in one place, and its one ``reset()``.

Each launch builds its own simulation and drops it at the end; what outlives a launch
is ``STATE``, and only this. What each field holds and what ``reset()`` does to it, and
the stores each part registers with :meth:`ProcessState.keep` (``reset()`` leaves them;
``clear_caches()`` empties those that can be emptied): docs/architecture.md, "Process-wide
state" (every registered store named there: ``integration_tests/test_architecture_homes.py``).
``reset_tpu_interpret_mode_state()`` (jax's name) calls ``reset(registrations=False)``:
it forgets failures and reports, not what the program registered.
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from palladium.interpret.errors import ConfigError
from palladium.interpret.state import disk_cache
from palladium.interpret.state.blas_thread_limit import SingleThreadLimit
from palladium.interpret.state.failures import FailureLog
from palladium.interpret.state.process_layouts import ProcessLayouts
from palladium.interpret.state.progress import ProgressMonitor
from palladium.interpret.state.race_log import RaceLog
from palladium.interpret.state.rendezvous import RendezvousRegistry
from palladium.interpret.state.rule_table import RuleRegistry, RuleSnapshot
from palladium.interpret.state.segment_cache import SegmentExecutables

__all__ = ["STATE", "ProcessState", "Store", "reset"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Store:
    """A part's module-level store, registered with :meth:`ProcessState.keep`."""

    name: str
    owner: str  #: the module that keeps it
    holds: str  #: what it holds, for a reader of :meth:`ProcessState.describe`
    clear: Callable[[], Any] | None  #: how ``clear_caches()`` empties it; None: it is kept


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
    # compiled segments of kernel bodies, by their equations' text (segment_cache.py)
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
    # the parts' own stores by name (keep())
    stores: dict[str, Store] = dataclasses.field(default_factory=dict)
    _rules_at_import: RuleSnapshot | None = None
    _mode_loggers_at_import: dict[Any, Callable[[Any], Any]] | None = None

    def keep(self, name: str, store: T, *, owner: str, holds: str,
             clear: Callable[[], Any] | None = None) -> T:
        """Register ``store``, a module-level store of module ``owner``, and return it
        (``_CACHE = STATE.keep("name", {}, owner=__name__, holds="...", clear=...)``)."""
        known = self.stores.get(name)
        if known is not None and known.owner != owner:
            raise ConfigError(f"a process store named {name!r} is {known.owner}'s")
        self.stores[name] = Store(name, owner, holds, clear)
        return store

    def clear_caches(self) -> None:
        """Empty every registered store that can be emptied (the caches)."""
        for store in list(self.stores.values()):
            if store.clear is not None:
                store.clear()

    def describe(self) -> str:
        """One line per registered store: its name, owner and what it holds."""
        return "\n".join(f"{s.name} ({s.owner}): {s.holds}"
                         for s in sorted(self.stores.values(), key=lambda s: s.name))

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
STATE.keep("disk_cache_secret", disk_cache.SECRET, owner=disk_cache.__name__,
           holds="the disk cache's secret, read once", clear=disk_cache.SECRET.forget)
STATE.keep("disk_cache_budget", disk_cache.BUDGET, owner=disk_cache.__name__,
           holds="the bytes the disk cache holds, counted once", clear=disk_cache.BUDGET.forget)


def reset(*, registrations: bool = True) -> None:
    """Put palladium.interpret's process-wide state back to how the import left it
    (see the module docstring); ``registrations=False`` keeps registered rules and
    observers."""
    STATE.reset(registrations=registrations)
