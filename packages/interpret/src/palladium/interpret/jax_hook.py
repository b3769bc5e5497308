"""How ``pl.pallas_call(..., interpret=InterpretParams(...))`` reaches palladium.

``import palladium.interpret`` registers a CPU lowering rule for ``pallas_call_p``. With
palladium's ``InterpretParams`` it lowers the call to ONE host callback that runs the
whole kernel launch in the simulator; every other ``interpret`` value goes to the rule
jax had registered. The interpreted kernel is a pure function of its inputs, so the
callback declares no side effects (``jax.checkpoint`` and ``optimize_remat`` keep
working, as on a TPU).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.kernel import PreparedKernel
from palladium.interpret.launch import Launch
from palladium.interpret.params import InterpretParams
from palladium.race_detect import RaceReport

_ORIGINAL_RULE = jc.original_cpu_lowering(jc.PALLAS_CALL_P)


class _FailureLog:
    """The exceptions of recently failed launches, so ``errors_as_raised`` can re-raise
    the original instead of jax's ``JaxRuntimeError`` wrapper. Bounded; entries are
    removed when claimed."""

    def __init__(self, capacity: int = 32) -> None:
        self._entries: collections.OrderedDict[int, BaseException] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._next = 0
        self._capacity = capacity

    def record(self, exc: BaseException) -> None:
        with self._lock:
            self._entries[self._next] = exc
            self._next += 1
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def claim(self, message: str) -> BaseException | None:
        """The most recent recorded exception whose text appears in ``message``."""
        with self._lock:
            for key in reversed(self._entries):
                exc = self._entries[key]
                text = f"{type(exc).__name__}: {exc}".splitlines()[0]
                if text in message:
                    del self._entries[key]
                    return exc
        return None


_FAILURES = _FailureLog()


class _RaceLog:
    """Race reports of launches run with ``on_race="collect"``, until collected."""

    def __init__(self) -> None:
        self._reports: list[RaceReport] = []
        self._lock = threading.Lock()

    def extend(self, reports: list[RaceReport]) -> None:
        with self._lock:
            self._reports.extend(reports)

    def drain(self) -> list[RaceReport]:
        with self._lock:
            out, self._reports = self._reports, []
        return out


_RACES = _RaceLog()


def collected_race_reports() -> list[RaceReport]:
    """Return (and forget) the race reports of the launches run with
    ``InterpretParams(detect_races=True, on_race="collect")`` since the last call."""
    return _RACES.drain()


def _run_launch(kernel: PreparedKernel, params: InterpretParams, *args: Any) -> list[np.ndarray]:
    launch = Launch(kernel, params)
    try:
        return launch.execute([np.asarray(a) for a in args])
    except BaseException as e:
        _FAILURES.record(e)
        raise
    finally:
        detector = launch.sim.race_detector
        if params.on_race == "collect" and detector is not None:
            _RACES.extend(list(detector.reports))


def _pallas_call_lowering(ctx: Any, *in_nodes: Any, interpret: Any, **params: Any) -> Any:
    if not isinstance(interpret, InterpretParams):
        return _ORIGINAL_RULE(ctx, *in_nodes, interpret=interpret, **params)
    kernel = PreparedKernel.from_params(**params)
    out_shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in ctx.avals_out]
    host = functools.partial(_run_launch, kernel, interpret)

    def impl(*args: Any) -> Any:
        return jax.pure_callback(host, out_shapes, *args, vmap_method="sequential")

    return jc.lower_fun(impl, multiple_results=True)(ctx, *in_nodes)


def install() -> None:
    """Register palladium's CPU lowering for ``pallas_call_p`` (idempotent)."""
    jc.register_lowering(jc.PALLAS_CALL_P, _pallas_call_lowering, platform="cpu")
    # core_map lowers through jax's mpmd fallback, which calls the pallas_call lowering
    # function directly rather than through the registry.
    jc.route_direct_pallas_call_lowering(_pallas_call_lowering)


@contextlib.contextmanager
def force_tpu_interpret_mode(params: InterpretParams | None = None) -> Iterator[None]:
    """Within this context every ``pallas_call`` / ``core_map`` runs under palladium.

    Calls traced inside the context (whatever their own ``interpret=`` says) use
    ``params`` (default ``InterpretParams()``)::

        with force_tpu_interpret_mode(InterpretParams(detect_races=True)):
            out = my_pallas_kernel(x)
    """
    option = jc.tpu_interpret_mode_config()
    prev = option.swap_local(params if params is not None else InterpretParams())
    try:
        yield
    finally:
        option.set_local(prev)


def set_tpu_interpret_mode(params: InterpretParams | None = None) -> None:
    """Globally run every ``pallas_call`` / ``core_map`` under palladium with ``params``.

    ``set_tpu_interpret_mode(None)``-style undoing is ``reset_tpu_interpret_mode_state()``.
    """
    jc.tpu_interpret_mode_config().set_global(
        params if params is not None else InterpretParams()
    )


def reset_tpu_interpret_mode_state() -> None:
    """Undo ``set_tpu_interpret_mode`` and forget recorded launch failures.

    Palladium keeps no simulator state between launches (each launch builds and drops
    its own), so unlike jax's interpreter nothing needs resetting after a failure.
    """
    jc.tpu_interpret_mode_config().set_global(None)
    _FAILURES.__init__()  # type: ignore[misc]


@contextlib.contextmanager
def errors_as_raised() -> Iterator[None]:
    """Re-raise the kernel's own exception instead of jax's ``JaxRuntimeError`` wrapper.

    A kernel that fails inside a jitted (or eager) ``pallas_call`` surfaces as
    ``jax.errors.JaxRuntimeError`` whose message contains palladium's. Within this
    context the original typed exception (``OutOfBoundsError``, ``RevisitError``, ...)
    is raised instead, chained from the wrapper::

        with errors_as_raised():
            kernel(x)          # raises palladium.interpret.OutOfBoundsError
    """
    try:
        yield
    except jax.errors.JaxRuntimeError as wrapper:
        original = _FAILURES.claim(str(wrapper))
        if original is None:
            raise
        raise original.with_traceback(original.__traceback__) from wrapper
