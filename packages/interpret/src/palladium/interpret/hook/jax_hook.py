"""How ``pl.pallas_call(..., interpret=InterpretParams(...))`` reaches palladium.

``import palladium.interpret`` registers a CPU lowering rule for ``pallas_call_p``. With
palladium's ``InterpretParams`` it lowers the call to ONE host callback that runs the
whole kernel launch in the simulator; every other ``interpret`` value goes to the rule
jax had registered. The interpreted kernel is a pure function of its inputs, so the
callback declares no side effects (``jax.checkpoint`` and ``optimize_remat`` keep
working, as on a TPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from palladium import shared_memory
from palladium.interpret import _jax_compat as jc
from palladium.interpret.chip import resolve_chip
from palladium.interpret.compiled import bounded_call
from palladium.interpret.compiled.compiled_launch import compiled_launch
from palladium.interpret.errors import (
    DataRaceError,
    KernelError,
    SimulationError,
)
from palladium.interpret.fidelity import tpu_compiler
from palladium.interpret.fidelity.call_key import call_key
from palladium.interpret.fidelity.checks import check_compiles_and_fits
from palladium.interpret.hook import multi_process, tpu_host, typed_failures
from palladium.interpret.hook.host_call import host_call
from palladium.interpret.kernel.jaxpr_checks import check_prepared_kernel
from palladium.interpret.kernel.prepared_kernel import PreparedKernel
from palladium.interpret.observe.observers import may_observe
from palladium.interpret.params import InterpretParams
from palladium.interpret.run import interrupts
from palladium.interpret.run.devices import DeviceMesh
from palladium.interpret.run.execution_plan import COMPILED, ExecutionPlan, plan_launch
from palladium.interpret.run.launch import Launch
from palladium.interpret.run.order_check import check_dma_order
from palladium.interpret.state.process_state import STATE, reset
from palladium.race_detect import RaceReport
from palladium.shared_memory.collector import frozen_heap

_ORIGINAL_RULE = jc.original_cpu_lowering(jc.PALLAS_CALL_P)


_FAILURES = STATE.failures
_RACES = STATE.races


def collected_race_reports() -> list[RaceReport]:
    """Return (and forget) the race reports of the launches run with
    ``InterpretParams(detect_races=True, on_race="collect")`` since the last call,
    outside any ``collect_race_reports()`` scope. The latest 1024 are kept (a
    ``RaceWarning`` says how many older ones were dropped)."""
    return _RACES.drain()


@contextlib.contextmanager
def collect_race_reports() -> Iterator[list[RaceReport]]:
    """Collect the race reports of the ``on_race="collect"`` launches run within the
    block into the list it yields (instead of the process-wide log)::

        with collect_race_reports() as reports:
            kernel(x)
        assert not reports
    """
    with _RACES.scope() as reports:
        yield reports


_RENDEZVOUS = STATE.rendezvous


def in_flight_rendezvous() -> int:
    """How many multi-device launches are waiting for devices (0 when idle)."""
    return len(_RENDEZVOUS)


def _execute(kernel: PreparedKernel, params: InterpretParams, mesh: DeviceMesh,
             device_args: list[list[np.ndarray]],
             split: multi_process.SplitLaunch | None = None,
             views: bool = False) -> list[list[np.ndarray]]:
    """Run one launch on every device; with ``dma_order_trials``, check other orders
    (split over processes: each trial is a launch of every process). ``views``: the
    operands are the host callback's views, copied before a simulation keeps them."""
    def partition() -> shared_memory.Partition | None:
        return None if split is None else split.partition()

    try:
        plan = plan_launch(kernel, params, kernel.launches.next(),
                           num_devices=max(mesh.num_devices, len(device_args)),
                           observed=may_observe(params),
                           scalars=device_args[0] if len(device_args) == 1 else None)
        if plan.tier == COMPILED:
            compiled, why = compiled_launch(kernel, params, device_args, plan)
            if compiled is not None:
                kernel.launches.last_plan = plan
                return compiled
            plan = plan.fall_back(why)
        if views:
            device_args = [[_own_copy(a, params) for a in args] for args in device_args]
        # The launches are dropped inside the frozen heap: a large one's cyclic garbage
        # is collected there, without walking the whole jax heap (shared_memory.collector).
        with frozen_heap(collect=True), STATE.blas.held():
            results = _attempt(kernel, params, mesh, device_args, plan,
                               partition=partition()).results
            if params.dma_order_trials:
                # (reruns of this launch: its number, counted by nothing)
                check_dma_order(
                    lambda p: _attempt(kernel, p, mesh, device_args, plan.as_trial(p),
                                       observe=False, partition=partition()).results,
                    lambda p: _race_reports(kernel, p, mesh, device_args, plan, partition()),
                    params, results, kernel.name, [o.name for o in kernel.outputs],
                    agree=bool if split is None else split.agree,
                )
        return results
    except interrupts.LaunchInterrupted:
        raise  # not a failure of the kernel (see interrupts)
    except BaseException as e:
        _FAILURES.record(e)
        raise


def _own_copy(view: Any, params: InterpretParams) -> np.ndarray:
    """The launch's own copy of an operand the host callback lends (``view``); under
    ``keep_float_data=False`` a floating-point operand's data is never kept (its buffer
    holds the fill), so it is not copied: a zero-stride stand-in of its shape (a 256 MiB
    operand of paged attention cost ``predict`` half a second)."""
    if not params.keep_float_data and shared_memory.is_float_dtype(np.dtype(view.dtype)) \
            and np.ndim(view):
        return np.broadcast_to(np.zeros((), view.dtype), np.shape(view))
    return np.array(view, copy=True)


@dataclasses.dataclass
class _Attempt:
    launch: Launch
    results: list[list[np.ndarray]]


def _attempt(kernel: PreparedKernel, params: InterpretParams, mesh: DeviceMesh,
             device_args: list[list[np.ndarray]], plan: ExecutionPlan, observe: bool = True,
             partition: shared_memory.Partition | None = None) -> _Attempt:
    launch = Launch(kernel, params, mesh, observe=observe, partition=partition, plan=plan)
    try:
        return _Attempt(launch, launch.execute_devices(device_args))
    finally:
        detector = launch.sim.race_detector
        if detector is not None:
            if params.on_race == "collect":
                _RACES.extend(list(detector.reports))
            detector.free_buffers()  # freed now, not by the collection of the launch


def _race_reports(kernel: PreparedKernel, params: InterpretParams, mesh: DeviceMesh,
                  device_args: list[list[np.ndarray]], plan: ExecutionPlan,
                  partition: shared_memory.Partition | None = None) -> list[RaceReport]:
    params = dataclasses.replace(params, detect_races=True, on_race="collect")
    launch = Launch(kernel, params, mesh, observe=False, partition=partition,
                    plan=plan.as_trial(params))
    try:
        launch.execute_devices(device_args)
    finally:
        detector = launch.sim.race_detector
        reports = list(detector.reports) if detector is not None else []
        if detector is not None:
            detector.free_buffers()
    return reports


class _LaunchSite:
    """One lowered ``pallas_call``: the host callback of each of its launches.

    Under ``shard_map`` every device calls ``run_device``; the k-th call of device d
    belongs to launch k, so (site, k) keys the rendezvous where the devices meet.
    """

    def __init__(self, kernel: PreparedKernel, params: InterpretParams, mesh: DeviceMesh,
                 call: Callable[[], str | None] = lambda: None):
        self.kernel = kernel
        self.params = params
        self.mesh = mesh
        self._lock = threading.Lock()
        self._launches = [0] * max(mesh.num_devices, 1)
        # (a process of a jax.distributed run beats from its first kernel on: one that
        # dies before its first launch is noticed by the others' heartbeat checks)
        STATE.processes.start_heartbeat()
        # A jax.distributed run of 2+ processes: this process simulates its devices only.
        self.layout = STATE.processes.current() if mesh.num_devices > 1 else None
        # what the processes compare when they meet: the kernel, its operands, its seed
        self.what = ""
        if self.layout is not None:
            digest = call()
            self.what = (f"kernel '{kernel.name}' "
                         + (f"(call key {digest[:12]}) " if digest else "")
                         + f"with random_seed={params.seed}")

    def run(self, *views: Any) -> list[np.ndarray]:
        """One device's launch; ``views`` of the operands, valid during the call only (a
        compiled launch reads them as they are, a simulated one copies them)."""
        return self._interruptible(lambda: _execute(
            self.kernel, self.params, self.mesh, [list(views)], views=True)[0])

    def run_device(self, device: Any, *args: Any) -> list[np.ndarray]:
        d = int(np.asarray(device))
        with self._lock:
            seq = self._launches[d]
            self._launches[d] += 1
        n = self.mesh.num_devices
        return self._interruptible(lambda: self._join(seq, d, n, args))  # a timeout too

    def _interruptible(self, launch: Callable[[], list[np.ndarray]]) -> list[np.ndarray]:
        """``launch()`` tagged for the failure log, cancelled by Ctrl-C (``interrupts``):
        a cancelled launch the main thread is about to abandon returns placeholders."""
        try:
            with interrupts.main_thread_launch(), _FAILURES.tagging():
                return launch()
        except interrupts.LaunchInterrupted:
            if interrupts.abandon_on_interrupt():
                return self._placeholders()
            raise

    def _placeholders(self) -> list[np.ndarray]:
        """The outputs of a launch abandoned on Ctrl-C (see ``interrupts``): NaN, or 0
        where the dtype has no NaN. Nobody reads them: the main thread raises
        ``KeyboardInterrupt`` as soon as it runs Python again."""
        return [np.full(a.shape, np.nan if np.issubdtype(a.dtype, np.inexact) else 0,
                        dtype=a.dtype) for a in self.kernel.out_avals]

    def _join(self, seq: int, d: int, n: int, args: tuple[Any, ...]) -> list[np.ndarray]:
        if self.layout is not None:
            return self._join_split(seq, d, n, args)
        return _RENDEZVOUS.join(
            (self, seq), n, d, [np.asarray(a) for a in args],
            lambda device_args: _execute(self.kernel, self.params, self.mesh, device_args),
            timeout=self.params.rendezvous_timeout,
            describe=lambda: f"kernel '{self.kernel.name}' launch #{seq} on {n} devices",
            on_timeout=lambda: self._skip_launch(seq),
        )

    def _join_split(self, seq: int, d: int, n: int, args: tuple[Any, ...]) -> list[np.ndarray]:
        """A launch split over processes: this process's devices meet here, then the
        processes meet in the key-value store (``multi_process``)."""
        assert self.layout is not None
        block = self.layout.block(n, self.kernel.name)
        if d not in block:
            raise KernelError(
                f"kernel '{self.kernel.name}': device {d} of the mesh runs in process "
                f"{self.layout.process}, which simulates mesh positions {block.start}-"
                f"{block.stop - 1}; a launch split over processes needs the mesh to list "
                f"jax.devices() in order (e.g. jax.make_mesh over all devices)"
            )
        return _RENDEZVOUS.join(
            (self, seq), len(block), d - block.start, [np.asarray(a) for a in args],
            lambda local_args: self._execute_split(block, local_args),
            timeout=self.params.rendezvous_timeout,
            describe=lambda: f"kernel '{self.kernel.name}' launch #{seq} on {len(block)} "
                             f"devices of process {self.layout.process if self.layout else 0}",
            on_timeout=lambda: self._skip_launch(seq),
        )

    def _execute_split(self, block: range, local_args: list[Any]) -> list[Any]:
        assert self.layout is not None
        name, n = self.kernel.name, self.mesh.num_devices
        split = multi_process.SplitLaunch(
            self.layout, name, block, self.params.rendezvous_timeout,
            f"kernel '{name}' on {n} devices over {self.layout.num_processes} processes",
            self.what)
        device_args = [local_args[d - block.start] if d in block else local_args[0]
                       for d in range(n)]
        results = _execute(self.kernel, self.params, self.mesh, device_args, split)
        return results[block.start:block.stop]

    def _skip_launch(self, seq: int) -> None:
        """Launch ``seq`` timed out: every device's next call is launch ``seq + 1`` at
        least (a device that never arrived at ``seq`` skipped it), so they meet again."""
        with self._lock:
            self._launches = [max(k, seq + 1) for k in self._launches]


def _pallas_call_lowering(ctx: Any, *in_nodes: Any, interpret: Any, **params: Any) -> Any:
    if not isinstance(interpret, InterpretParams):
        return _ORIGINAL_RULE(ctx, *in_nodes, interpret=interpret, **params)
    kernel = PreparedKernel.from_params(call_site=jc.lowering_call_frame(ctx), **params)
    check_prepared_kernel(kernel, interpret)
    if interpret.chip is None:  # the abstract mesh of the tracing context decides
        interpret = dataclasses.replace(interpret, chip=resolve_chip(None))
    mesh_axes = {k: v for k, v in jc.axis_sizes().items() if k not in kernel.core_axis_names}

    def bind_for_tpu(*args: Any) -> Any:
        return jc.PALLAS_CALL_P.bind(*args, interpret=False, **params)

    bind_for_tpu.__name__ = bind_for_tpu.__qualname__ = kernel.name  # the compiler's op_name

    check_compiles_and_fits(kernel, interpret, ctx, bind=bind_for_tpu, avals_in=ctx.avals_in,
                 mesh_axes=mesh_axes, call=params)
    out_shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in ctx.avals_out]
    mesh = DeviceMesh.from_axis_env(mesh_axes)
    avals_in = ctx.avals_in
    site = _LaunchSite(kernel, interpret, mesh,
                       lambda: call_key(params, avals_in, "split launch", mesh.axis_sizes))

    def impl(*args: Any) -> Any:
        if mesh.num_devices <= 1:
            return host_call(site.run, out_shapes, *args, views=True)
        device = jnp.int32(0)
        for name, size in zip(mesh.axis_names, mesh.axis_sizes):
            device = device * size + jax.lax.axis_index(name)
        return host_call(site.run_device, out_shapes, device, *args)

    return jc.lower_fun(impl, multiple_results=True)(ctx, *in_nodes)


class _PalladiumFailureFilter(logging.Filter):
    """Drops jax's "jax.pure_callback failed" record (with its full traceback) when the
    callback failed with a palladium exception: that exception reaches the caller with
    the whole message anyway. Other callback failures are still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, (SimulationError, DataRaceError))


_FAILURE_FILTER = _PalladiumFailureFilter()


def _interrupt(exc: BaseException) -> None:
    """Ctrl-C: cancel every running simulation and every launch waiting for devices."""
    shared_memory.interrupt_all(exc)
    _RENDEZVOUS.interrupt_all(exc)
    bounded_call.interrupt_all(exc)


def install() -> None:
    """Register palladium's CPU lowering for ``pallas_call_p`` (idempotent)."""
    interrupts.install(_interrupt)
    logger = jc.callback_logger()
    if _FAILURE_FILTER not in logger.filters:
        logger.addFilter(_FAILURE_FILTER)
    jc.register_lowering(jc.PALLAS_CALL_P, _pallas_call_lowering, platform="cpu")
    tpu_host.install()
    tpu_compiler.prestart()  # where libtpu is installed: the TPU compiler's process
    STATE.processes.start_heartbeat()  # (imported after jax.distributed.initialize)
    # core_map lowers through jax's mpmd fallback, which calls the pallas_call lowering
    # function directly rather than through the registry.
    jc.route_direct_pallas_call_lowering(_pallas_call_lowering)
    typed_failures.install()  # pl.pallas_call's functions raise palladium's types


@contextlib.contextmanager
def force_tpu_interpret_mode(params: InterpretParams | None = None) -> Iterator[None]:
    """Within this context every ``pallas_call`` / ``core_map`` runs under palladium.

    Calls traced inside the context (whatever their own ``interpret=`` says) use
    ``params`` (default ``InterpretParams()``). On a TPU host the CPU is the default device
    inside the context (palladium simulates there; see ``tpu_host.ON_TPU_DEVICE``)::

        with force_tpu_interpret_mode(InterpretParams(detect_races=True)):
            out = my_pallas_kernel(x)
    """
    option = jc.tpu_interpret_mode_config()
    prev = option.swap_local(params if params is not None else InterpretParams())
    try:
        with tpu_host.on_the_cpu_device():
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
    """Undo ``set_tpu_interpret_mode`` and forget recorded launch failures and
    uncollected race reports (``process_state.reset(registrations=False)``).

    Palladium keeps no simulator state between launches (each launch builds and drops
    its own), so unlike jax's interpreter nothing else needs resetting after a failure;
    ``palladium.interpret.state.process_state.reset()`` also undoes registered rules and
    observers.
    """
    jc.tpu_interpret_mode_config().set_global(None)
    reset(registrations=False)


@contextlib.contextmanager
def errors_as_raised() -> Iterator[None]:
    """Re-raise the kernel's own exception instead of jax's ``JaxRuntimeError`` wrapper.

    A ``pallas_call``'s function called on its own raises palladium's exception already
    (``hook.typed_failures``). A kernel that fails inside the caller's own ``jax.jit``
    (or ``shard_map``, ``jax.jit(call)``) surfaces from jax's dispatch as
    ``jax.errors.JaxRuntimeError`` whose message is palladium's (its first line names
    the type). Within this context the original typed exception (``OutOfBoundsError``,
    ``RevisitError``, ``RendezvousTimeoutError``, ...) is raised instead, chained from
    the wrapper. It is found by the failure id its message carries (``[palladium failure
    #N: ...]``); its traceback keeps file and line of each frame, not their locals (see
    ``failures``)::

        with errors_as_raised():
            step(x)            # a jitted step calling the kernel: OutOfBoundsError
    """
    try:
        yield
    except (jax.errors.JaxRuntimeError, ValueError) as wrapper:
        original = _FAILURES.claim(str(wrapper))
        if original is None:
            raise
        raise original.with_traceback(original.__traceback__) from wrapper
