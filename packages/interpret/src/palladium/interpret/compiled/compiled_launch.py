"""Compiled launches: a hot kernel's whole launch as one XLA executable.

A kernel made of many small operations per grid step (paged attention, a scan one time
step per iteration) spends its simulated launch in per-equation and per-DMA overhead,
not in arithmetic. From its ``WHOLE_LAUNCH``-th launch in the process on (its third:
``run/execution_plan.py``), such a kernel's launch runs as one executable
(``launch_function.py``): compiled (or loaded from the disk cache) at the start of
that launch, in its own thread, and kept per kernel, grid, order and operand types. Its
results are XLA's bits, as a compiled segment's. Nothing is compiled in the background:
beside the launch before, the compile's tracing held the GIL and slowed that launch
more than the overlap saved (the second call 9.0-9.2x of jax's HLO interpreter's in
geomean, 2.3-2.6x without it, calls 1-3 no faster; benchmarks/LOG.md, 2026-12-07), and a
kernel called twice paid for a compile it never used.

Whether a launch may run compiled is its execution plan's decision, made from the
params, the observers and the launch number, never timing (``run/execution_plan.py``:
the conditions, each with its reason); this module runs a ``"compiled"`` plan. The
simulator stays the oracle: a launch whose flags say it could differ from the simulated
one (``traced_state.FLAGS``) runs again simulated, which reports what it reports (with
races on, the flag of an access to a DMA in flight: with none, there is no race to
report), and so does a kernel whose tracing meets something unmodelled (``UnsupportedFeatureError``:
semaphore signals, remote DMAs, the MXU, prints, ...) or whose launch is not worth
compiling (``worth_compiling``, static). Under ``uninitialized_reads="on_use"`` a kernel
compiles whole while none of its launches read uninitialised memory or left an output
region unwritten (``PreparedKernel.reads_uninitialized``), or for a launch whose scalar
operands a simulated launch that read uninitialised memory and reported nothing had
(megablox gmm, whose masked merge of output rows its group offsets decide).
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from typing import Any

import jax
import numpy as np

from palladium.interpret.compiled.bounded_call import INLINE_SECONDS, bounded_call
from palladium.interpret.compiled.launch_function import launch_function
from palladium.interpret.compiled.launch_key import launch_key
from palladium.interpret.compiled.traced_eval import compile_traced
from palladium.interpret.compiled.traced_state import FLAG_BUDGET, FLAGS, TraceFacts
from palladium.interpret.eval.chip_arithmetic import NEGATIVE_ZERO
from palladium.interpret.eval.segments import work
from palladium.interpret.kernel.prepared_kernel import PreparedKernel
from palladium.interpret.params import InterpretParams
from palladium.interpret.run.execution_plan import ExecutionPlan
from palladium.interpret.run.grid_loop import schedule
from palladium.interpret.run.launch import launch_grid
from palladium.interpret.state.process_state import STATE

__all__ = ["INLINE_LOOPS", "MAX_GRIDS", "MAX_KEPT", "MAX_POINTS", "MIN_EQUATIONS_PER_LAUNCH",
           "PAST_BUDGET", "STATS", "compiled_launch", "worth_compiling"]

#: The least equations a launch evaluates (body work times grid points) for its kernel to
#: be compiled whole: below it the simulated launch costs about what a compiled one does.
MIN_EQUATIONS_PER_LAUNCH = 500
#: The most grid points a launch compiled whole has: its executable holds a table of
#: every point's block indices (a larger grid runs simulated, its points computed per
#: step: ``run/grid_points.py``).
MAX_POINTS = 1 << 20
#: Executables kept per kernel (the least recently used go first) and the most grids (and
#: orders) a kernel is compiled whole for: each dynamic grid size is its own executable
#: (~0.9 s to compile, ~2 MiB; 150 grids kept +256 MiB before), and a kernel called with
#: more grids than ``MAX_GRIDS`` runs its further grids simulated.
MAX_KEPT = 4
MAX_GRIDS = 8
#: Launches of the process that ran compiled ("compiled") and that ran simulated after
#: their flags were raised (by the flag's text, ``traced_state.FLAGS``).
#: ``STATS``' count of inline runs whose loops spent their budget (run again threaded).
PAST_BUDGET = "inline runs past their loop budget"
STATS: collections.Counter[str] = STATE.keep(
    "compiled_launch_stats", collections.Counter(), owner=__name__,
    holds="launches that ran compiled, and simulated by the flag that stopped them")


def worth_compiling(kernel: PreparedKernel, grid_points: int) -> bool:
    """Whether a launch of ``kernel`` over ``grid_points`` is compiled whole: it evaluates
    at least ``MIN_EQUATIONS_PER_LAUNCH`` equations (loop bodies once per iteration)."""
    return work(kernel.jaxpr.eqns) * grid_points >= MIN_EQUATIONS_PER_LAUNCH


_LOCK = threading.Lock()


def compiled_launch(kernel: PreparedKernel, params: InterpretParams,
                    device_args: list[list[np.ndarray]], plan: ExecutionPlan
                    ) -> tuple[list[list[np.ndarray]] | None, str]:
    """The outputs of a launch of ``kernel`` whose ``plan`` (``run/execution_plan.py``)
    is ``"compiled"`` run compiled, or (None, why it runs simulated instead: this grid
    is not compiled whole, or the launch's flags say so)."""
    n_dyn = kernel.grid_mapping.num_dynamic_grid_bounds
    args = device_args[0]
    grid = launch_grid(kernel, args[:n_dyn])
    if any(n < 0 for n in grid):
        return None, "its grid is negative (the simulator reports it)"
    # (the types only: the operands may be views valid during this call)
    types = tuple((np.shape(a), np.asarray(a).dtype) for a in args[n_dyn:])
    exe = _whole_launch(kernel, params, grid, types)
    if exe is _REFUSED:
        return None, (f"the kernel was compiled whole for {MAX_GRIDS} other grids "
                      f"(its other grids run simulated)")
    if exe is None:
        return None, ("the kernel is not compiled whole for this grid (too little work, "
                      "too many grid points, or something its tracing does not model)")
    # the scalar prefetch operands, then the inputs; under the watchdog, the progress
    # reports and Ctrl-C (``bounded_call``): on a worker thread, with operands of its own,
    # unless its last run was short: then inline, its ``while`` loops given a budget of
    # iterations (``_inline_budget``) that bounds how much longer it may run; a run that
    # spends it runs again on the worker thread, with no budget (the same results)
    last = _LAST_RUN.get(exe)
    inline = last is not None and last[0] < INLINE_SECONDS
    operands = [_aligned(a) if inline else _owned(a) for a in args[n_dyn:]]
    budget = _inline_budget(last[1]) if last is not None and inline else _NO_BUDGET
    start = time.perf_counter()
    outs, flag, loops = bounded_call(lambda: _run(exe, operands, budget),
                                     kernel_name=kernel.name, params=params, inline=inline)
    if int(flag) & FLAG_BUDGET:
        STATS[PAST_BUDGET] += 1
        operands = [_owned(a) for a in args[n_dyn:]]
        start = time.perf_counter()
        outs, flag, loops = bounded_call(lambda: _run(exe, operands, _NO_BUDGET),
                                         kernel_name=kernel.name, params=params, inline=False)
    _LAST_RUN[exe] = (time.perf_counter() - start, int(loops))
    flag = int(flag)
    if flag:
        raised = [text for bit, text in FLAGS.items() if flag & bit]
        STATS.update(raised)
        return None, (f"its compiled run raised the flag '{'; '.join(raised)}' (run again "
                      f"simulated, which reports what the simulator reports)")
    STATS["compiled"] += 1
    return [outs], plan.reason


#: Operand types: (shape, dtype) per operand.
_Types = tuple[tuple[tuple[int, ...], np.dtype], ...]


#: What ``_whole_launch`` gives for a grid it refuses (``MAX_GRIDS`` others compiled).
_REFUSED = object()


def _whole_launch(kernel: PreparedKernel, params: InterpretParams, grid: tuple[int, ...],
                  types: _Types) -> Any:
    """The executable of ``kernel``'s whole launch over ``grid`` for operands of ``types``
    (kept, else compiled or loaded here), None: not compiled whole (too little work, too
    many grid points, or something its tracing does not model), or ``_REFUSED``: the
    kernel was compiled whole for ``MAX_GRIDS`` other grids (and orders). Launches of
    one kernel in several threads compile it once: the others wait for that compile (one
    per key: never for another kernel's or grid's); a kept one is read under one lock."""
    # per grid, order and operand types: the executable (None: not compiled whole)
    kept: dict[Any, Any] = kernel.launches.whole_launches
    key = (grid, params.seed, params.uninitialized_memory, types)
    with _LOCK:
        if key in kept:
            kept[key] = exe = kept.pop(key)  # (the most recently used last)
            return exe
        if _new_grid_refused(kernel.launches.whole_launch_keys, key):
            return _REFUSED
        compiling = _COMPILING.setdefault((kernel.launches, key), threading.Lock())
    with compiling:
        with _LOCK:
            if key in kept:  # (compiled by another thread while this one waited)
                return kept[key]
        gm = kernel.grid_mapping
        points = schedule(kernel, grid, 1, tuple(gm.vmapped_dims), params.seed)[0]
        exe = None
        if len(points) <= MAX_POINTS and worth_compiling(kernel, len(points)):
            try:
                exe = _compile(kernel, grid, list(points), tuple(gm.vmapped_dims),
                               params.uninitialized_memory,
                               [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in types])
            except Exception:  # noqa: BLE001 - not modelled: simulated
                exe = None
        with _LOCK:
            while len(kept) >= MAX_KEPT:
                kept.pop(next(iter(kept)))  # the least recently used
            kept[key] = exe
            _COMPILING.pop((kernel.launches, key), None)
        return exe


#: The lock of each whole launch being compiled now, by its kernel's launches and key.
_COMPILING: dict[Any, threading.Lock] = STATE.keep(
    "compiled_launch_compiling", {}, owner=__name__,
    holds="the lock of each whole launch being compiled now (by kernel and key)")


def _new_grid_refused(seen: set[Any], key: Any) -> bool:
    """Whether a launch under ``key`` not kept now must run simulated: the kernel was
    compiled whole for ``MAX_GRIDS`` other keys (``seen``, which it records)."""
    if key in seen:
        return False
    if len(seen) >= MAX_GRIDS:
        return True
    seen.add(key)
    return False


def _run(exe: Any, operands: list[np.ndarray], budget: np.int32
         ) -> tuple[list[np.ndarray], Any, Any]:
    outs, flag, loops = exe(NEGATIVE_ZERO, budget, *operands)
    return [np.asarray(o) for o in outs], np.asarray(flag), np.asarray(loops)


#: The loop budget of a run not inline: none (each loop is still bounded by
#: ``traced_eval.WHILE_LIMIT``).
_NO_BUDGET = np.int32(np.iinfo(np.int32).max)
#: ``while`` iterations an inline run may run beyond twice its last run's.
INLINE_LOOPS = 1 << 12


def _inline_budget(last_loops: int) -> np.int32:
    """The ``while`` iterations an inline run may run: twice its last run's and
    ``INLINE_LOOPS`` more (so it runs about as long as its last run, which was short)."""
    return np.int32(min(2 * last_loops + INLINE_LOOPS, int(_NO_BUDGET)))


#: Per executable: the seconds its last run took and the ``while`` iterations it ran
#: (``bounded_call``'s choice of running inline, and the inline run's budget).
_LAST_RUN: weakref.WeakKeyDictionary[Any, tuple[float, int]] = STATE.keep(
    "compiled_launch_last_run", weakref.WeakKeyDictionary(), owner=__name__,
    holds="an executable's last run (seconds, loop iterations), kept weakly by the executable")


#: XLA's CPU client reads an operand in place (no copy) when it is aligned to this many
#: bytes. palladium's FFI handler hands over XLA's own (aligned) buffers; jax's callback,
#: which serves where that handler does not (packed sub-byte types, another jaxlib),
#: hands over numpy copies at 16-byte addresses.
_ALIGNMENT = 64


def _aligned(a: np.ndarray) -> np.ndarray:
    """``a``, or a copy of it at an ``_ALIGNMENT``-byte address: numpy's copy into a
    fresh buffer costs about half of the copy XLA's client makes of a misaligned
    operand (2 MiB: ~50 against ~110 us)."""
    if a.nbytes < 4096 or a.ctypes.data % _ALIGNMENT == 0:
        return a
    raw = np.empty(a.nbytes + _ALIGNMENT, np.uint8)
    skip = -raw.ctypes.data % _ALIGNMENT
    out = raw[skip:skip + a.nbytes].view(a.dtype).reshape(a.shape)
    np.copyto(out, a)
    return out


def _owned(a: np.ndarray) -> np.ndarray:
    """An aligned copy of ``a`` that the executable owns: it may outlive the call that
    handed ``a`` over (a launch abandoned by the watchdog or Ctrl-C)."""
    copy = _aligned(a)
    return np.array(a, copy=True) if copy is a else copy


def _compile(kernel: PreparedKernel, grid: tuple[int, ...], points: list[tuple[int, ...]],
             vmapped: tuple[int, ...], fill: str, specs: list[Any]) -> Any:
    """The whole launch's executable (None: not modelled), kept across processes under
    what it is a function of (a kernel whose description the key cannot write down is
    traced and compiled each time)."""

    def build() -> Any:
        # First trace: which buffers DMAs reach (only their accesses need checking) and
        # which anything writes (only those are carried through loops).
        found = TraceFacts(gathering=True)
        budget = jax.ShapeDtypeStruct((), np.int32)
        jax.eval_shape(launch_function(kernel, grid, points, vmapped, fill, found), budget,
                       *specs)
        fn = launch_function(kernel, grid, points, vmapped, fill, found.second())
        return compile_traced(fn, [budget, *specs], wide=True)

    def built() -> Any:
        try:
            return build()
        except Exception:  # noqa: BLE001 - not modelled: the kernel stays simulated
            return None

    key = launch_key(kernel, grid, points, vmapped, fill, specs)
    return built() if key is None else STATE.segments.get(key, built)
