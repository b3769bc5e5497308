"""Compiled segments: a kernel body's runs of pure array code run as one XLA executable.

Between the equations that touch the simulation (DMAs, semaphores, program ids, ...), a
kernel body is straight-line array code, ``ref[...]`` loads and stores and loops of the
same. :func:`find_segments` picks such runs when a jaxpr is compiled (``program.py``);
each becomes one step whose rule, :class:`Segment`, runs it as one ``jax.jit``-compiled
function of its inputs and its refs' contents (``compiled/segment_function.py``), compiled on the
segment's first run and kept with the kernel's programs for every later launch.

The equation-by-equation path stays the oracle and runs instead whenever the compiled
one could differ from it in anything but XLA's own arithmetic bits:
- a launch whose execution plan (``run/execution_plan.py``) is ``"simulated"``:
  ``skip_floating_point_ops``, ``deterministic_dot``, ``uninitialized_reads="raise"``
  or ``"warn"``, ``keep_float_data=False`` and an observer of every equation (the
  timeline) need each equation seen;
- with ``uninitialized_reads="on_use"`` (the default), an input value that carries a
  shadow (``value_shadows.py``); where a ref holds uninitialised elements (an output
  block at a new block index), the variant that tracks each ref's initialised elements
  runs (a second executable, compiled as the first is): a store marks its region, a
  read of an element not marked sends the segment one by one, where values carry
  shadows;
- with ``detect_races``, in a kernel that starts DMAs or uses semaphores (another agent
  may touch a buffer while the core computes: the race detector must see each access), a
  segment with a ``cond`` or ``while`` around an access; any other segment of such a
  kernel runs compiled and its accesses are replayed to the detector in order
  (``segment_races.py``). A kernel without DMAs or semaphores has nothing but its own
  core and the grid loop's block copies touching its VMEM and SMEM, so its accesses can
  race with nothing and are not replayed;
- a ref that is not a whole VMEM/SMEM buffer of the aval's shape (HBM, a transformed ref);
- an access out of bounds or a ``while`` loop past ``WHILE_LIMIT`` (the compiled result
  is dropped, and the one-equation path reports the access or runs the loop under the
  watchdog: the same error at the same site);
- a segment XLA cannot compile (a primitive with no CPU lowering).
Hot segments (``HOT_MIN_WORK``, ``HOT_LAUNCH``): runs too small to pay back their compile
within one call are compiled for a kernel's third and later launches in the process
(the plan's ``hot``: compiled where the third launch first runs them);
``InterpretParams(compile_segments="static")`` keeps them equation by equation (every
call the same bits), ``compile_segments=False`` turns the compiled path off.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.compiled.segment_function import fusible, is_ref, segment_function
from palladium.interpret.compiled.traced_eval import compile_traced
from palladium.interpret.eval.chip_arithmetic import NEGATIVE_ZERO
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.jaxprs import any_equation, nested_jaxprs
from palladium.interpret.eval.primitive_groups import INDEXED_ACCESSES
from palladium.interpret.eval.refs import MemRef
from palladium.interpret.eval.segment_races import access_log_plan, replay
from palladium.interpret.eval.value_shadows import Tainted
from palladium.interpret.state.process_state import STATE
from palladium.shared_memory import MemorySpace

__all__ = ["ASYNC_PRIMITIVES", "HOT_LAUNCH", "HOT_MIN_WORK", "MIN_WORK", "MIN_WORK_PER_LAUNCH",
           "Segment", "find_segments", "segment_io", "uses_async", "work"]

#: The least work (equations run per execution of the segment, loop bodies counted once
#: per iteration) worth compiling. A call of a compiled segment costs ~20-80 us, about
#: what numpy takes for 4-8 small equations; compiling one costs ~0.2-0.5 s (~10 ms from
#: the disk cache). Whether a segment is compiled must not depend on timing or on the
#: cache (its results are XLA's bits, the one-equation path's may differ in the last
#: place), so the rule is static: loops of small equations, where the gain is 10-100x.
MIN_WORK = 256
#: The least work per launch (``work`` times the runs of the jaxpr in one launch: the
#: kernel body's grid points) worth compiling: about what numpy takes in the time a
#: segment takes to compile (~0.3 s), so that compiling pays back within the first call.
MIN_WORK_PER_LAUNCH = 30_000
#: Hot segments: a run of at least ``HOT_MIN_WORK`` equations that is not worth compiling
#: for the first call (under both thresholds above) runs equation by equation in the
#: kernel's first ``HOT_LAUNCH - 1`` launches of the process and compiled from launch
#: ``HOT_LAUNCH`` on: compiled (or loaded from the disk cache) where launch
#: ``HOT_LAUNCH`` first runs them, never in the background beside a launch (whose
#: Python the compile's tracing would slow: benchmarks/LOG.md, 2026-12-07). A
#: kernel called once or twice pays nothing; one called in a loop runs XLA's code. The
#: switch is at a fixed launch, never at a time: a given call's results do not depend on
#: timing or on the cache (those of launches before and after the switch may differ in
#: the last place where numpy's and XLA's arithmetic bits differ).
HOT_MIN_WORK = 8
HOT_LAUNCH = 3
#: Iterations assumed of a ``while`` loop (a ``fori_loop`` with traced bounds).
WHILE_GUESS = 8
_SPACES = (MemorySpace.VMEM, MemorySpace.SMEM)


def _async_primitives() -> frozenset[Any]:
    names = ("dma_start_p", "dma_wait_p", "semaphore_signal_p", "semaphore_wait_p",
             "semaphore_read_p", "get_barrier_semaphore_p")
    return frozenset(p for p in (getattr(jc, n, None) for n in names) if p is not None)


ASYNC_PRIMITIVES = _async_primitives()


def uses_async(jaxpr: Any) -> bool:
    """Whether ``jaxpr`` (at any depth) starts or waits on a DMA or uses a semaphore."""
    return any_equation(jaxpr, lambda eqn: eqn.primitive in ASYNC_PRIMITIVES)


def _stores(eqn: Any) -> bool:
    return eqn.primitive is jc.swap_p or eqn.primitive is jc.addupdate_p


def _loads(used: set[Any]) -> Callable[[Any], bool]:
    """Whether a ref access reads: a load, an accumulation, a swap whose old value is
    in ``used``."""
    def loads(eqn: Any) -> bool:
        prim = eqn.primitive
        return (prim is jc.get_p or prim is jc.addupdate_p
                or prim is jc.swap_p and eqn.outvars[0] in used)
    return loads


def _whole_store(eqn: Any) -> bool:
    """Whether a store writes its whole ref (``ref[...] = x``: no indexer, or slices
    from 0 of the full size)."""
    if eqn.primitive is not jc.swap_p:
        return False
    transforms = eqn.params["tree"].unflatten(eqn.invars[2:])
    if not transforms:
        return True
    if len(transforms) > 1 or not isinstance(transforms[0], jc.NDIndexer):
        return False
    shape = eqn.invars[0].aval.shape
    for i, n in zip(transforms[0].indices, shape):
        start = getattr(i, "start", None)
        start = getattr(start, "val", start)
        if (not isinstance(i, jc.Slice) or not isinstance(start, int | np.integer)
                or start != 0 or i.size != n or i.stride != 1):
            return False
    return True


def _used(eqns: Sequence[Any], outputs: Sequence[Any]) -> set[Any]:
    """Every variable an equation of ``eqns`` (at any depth) or ``outputs`` reads."""
    used: set[Any] = {a for a in outputs if not isinstance(a, jc.Literal)}
    for eqn in eqns:
        used.update(a for a in eqn.invars if not isinstance(a, jc.Literal))
        for inner in nested_jaxprs(eqn):
            used |= _used(inner.eqns, inner.outvars)
    return used


def _written(eqns: Sequence[Any], accesses: Callable[[Any], bool] = _stores) -> set[Any]:
    """The refs (variables of ``eqns``' scope) some equation stores to (or, with
    ``accesses=_loads``, reads), at any depth."""
    out: set[Any] = set()
    for eqn in eqns:
        prim, p = eqn.primitive, eqn.params
        if prim in INDEXED_ACCESSES:
            if accesses(eqn):
                out.add(eqn.invars[0])
            continue
        if prim is jc.scan_p:
            pairs = [(p["jaxpr"].jaxpr, eqn.invars)]
        elif prim is jc.while_p:
            pairs = [(p["body_jaxpr"].jaxpr, eqn.invars[p["cond_nconsts"]:])]
        elif prim is jc.cond_p:
            pairs = [(b.jaxpr, eqn.invars[1:]) for b in p["branches"]]
        elif prim is jc.jit_p:
            pairs = [(p["jaxpr"].jaxpr, eqn.invars)]
        elif "call_jaxpr" in p:
            pairs = [(getattr(p["call_jaxpr"], "jaxpr", p["call_jaxpr"]), eqn.invars)]
        else:
            continue
        for inner, outer in pairs:
            inner_written = _written(inner.eqns, accesses)
            out.update(o for v, o in zip(inner.invars, outer) if v in inner_written)
    return out


class Segment:
    """One compiled segment: the rule of the step that replaces its equations."""

    def __init__(self, eqns: Sequence[Any], inputs: Sequence[Any], outputs: Sequence[Any],
                 fallback: Any, races_ok: bool, hot: bool = False) -> None:
        self.eqns = tuple(eqns)
        self.hot = hot  # compiled only from the kernel's launch HOT_LAUNCH on
        self.plain = [v for v in inputs if not is_ref(v)]
        self.refs = [v for v in inputs if is_ref(v)]
        self.outputs = list(outputs)
        written = _written(self.eqns)
        self.written = [i for i, r in enumerate(self.refs) if r in written]
        self._used = _used(self.eqns, self.outputs)
        read = _written(self.eqns, _loads(self._used))
        # (uninitialized_reads="on_use") the refs the segment reads: a tracking variant
        # takes their masks of initialised elements; the others' start empty
        self.read = frozenset(i for i, r in enumerate(self.refs) if r in read)
        # ... and of those it only writes, the ones every store writes whole: a flag
        # (did a store run) stands for their mask
        partial = _written(self.eqns, lambda eqn: _stores(eqn) and not _whole_store(eqn))
        self.whole = frozenset(i for i in self.written
                               if i not in self.read and self.refs[i] not in partial)
        self._tracking: list[frozenset[int]] = []  # the tracked sets compiled so far
        self.fallback = fallback  # the same equations as a Program of their own
        self.races_ok = races_ok
        self._shapes = [(tuple(r.aval.shape), np.dtype(r.aval.dtype)) for r in self.refs]
        self._dtypes = [np.dtype(v.aval.dtype) for v in self.plain]
        # With races on in a kernel with DMAs: the accesses to replay (None: not possible)
        self.log_plan = None if races_ok else access_log_plan(self.eqns, self.refs)
        self._compiled: dict[tuple[bool, frozenset[int]], Callable[..., Any]] = {}
        self._failed = False
        self._lock = threading.Lock()

    @property
    def inputs(self) -> list[Any]:
        return [*self.plain, *self.refs]

    def _job(self, variant: tuple[bool, frozenset[int]]) -> tuple[str, Callable[[], Any]]:
        """The cache key text and the compile function of a variant: (``log``, whether
        it also returns the access log; ``tracked``, the refs (by position) whose
        initialised elements it tracks, ``uninitialized_reads="on_use"``)."""
        log, tracked = variant
        order = sorted(tracked)
        fn = segment_function(self.eqns, self.plain, self.refs, self.outputs,
                              self.written, log,
                              {i: "read" if i in self.read else "whole" if i in self.whole
                               else "written" for i in order} if order else None,
                              self._used)
        specs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in self.plain]
        specs += [jax.ShapeDtypeStruct(s, d) for s, d in self._shapes]
        specs += [jax.ShapeDtypeStruct(self._shapes[i][0], np.bool_)
                  for i in order if i in self.read]
        text = f"{self.fallback.jaxpr}\nwritten={self.written}\nlog={log}" + (
            f"\ntracked={order}" if order else "")
        return text, lambda: compile_traced(fn, specs)

    def _compile(self, log: tuple[bool, frozenset[int]]) -> Callable[..., Any] | None:
        """The executable of a variant (see ``_job``), compiled or loaded here once."""
        with self._lock:
            if log not in self._compiled and not self._failed:
                try:
                    self._compiled[log] = STATE.segments.get(*self._job(log))
                except Exception:  # noqa: BLE001 - no CPU lowering: the one-equation path
                    self._failed = True
            return self._compiled.get(log)

    def _tracked(self, unclean: list[int]) -> frozenset[int]:
        """The refs a run with ``unclean`` refs tracks: a set compiled before that holds
        them all, else all refs ever unclean here (one executable serves a kernel's
        first grid step, whose scratch is not yet written, and the later ones)."""
        if not unclean:
            return frozenset()
        need = frozenset(unclean)
        for known in self._tracking:
            if need <= known:
                return known
        union = need.union(*self._tracking)
        self._tracking.append(union)
        return union

    def _mode(self, ev: KernelContext) -> bool | None:
        """None: run equation by equation; else whether to log the accesses. The
        launch's execution plan (``run/execution_plan.py``) says whether segments run
        and whether hot ones do yet; this segment, whether its accesses need replaying."""
        plan = ev.plan
        if not plan.segments or self.hot and not plan.hot:
            return None
        if self.races_ok or not plan.replay_races:
            return False
        return None if self.log_plan is None else True

    def __call__(self, ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        log = None if self._failed else self._mode(ev)
        if log is None:
            return ev.run_program(self.fallback, invals)
        n = len(self.plain)
        tracks = ev.tracks_values
        if tracks and any(x.__class__ is Tainted for x in invals[:n]):
            return ev.run_program(self.fallback, invals)  # shadows: one by one
        contents = []
        unclean = []
        for i, (ref, (shape, dtype)) in enumerate(zip(invals[n:], self._shapes)):
            if type(ref) is not MemRef or ref.buffer.space not in _SPACES:
                return ev.run_program(self.fallback, invals)
            if tracks and not ev.sim.initialized(ref.buffer):
                unclean.append(i)  # (a ref holding uninitialised elements: an output block)
            data = ev.sim.contents(ref.buffer)
            if data.shape != shape or data.dtype != dtype:
                return ev.run_program(self.fallback, invals)
            contents.append(data)
        tracked = self._tracked(unclean)
        variant = (log, tracked)
        compiled = self._compiled.get(variant) or self._compile(variant)
        if compiled is None:
            return ev.run_program(self.fallback, invals)
        plain = [x if getattr(x, "dtype", None) == d else np.asarray(x, d)
                 for x, d in zip(invals[:n], self._dtypes)]
        masks = {}
        for i in sorted(tracked):
            mask = ev.sim.initialized_mask(invals[n + i].buffer)
            masks[i] = np.ones(contents[i].shape, bool) if mask is None else mask
        outs, new, ok, *rest = compiled(NEGATIVE_ZERO, *plain, *contents,
                                        *(masks[i] for i in sorted(tracked) if i in self.read))
        if not ok:
            return ev.run_program(self.fallback, invals)
        if log:
            assert self.log_plan is not None
            replay(ev, self.log_plan, rest[0], [r.buffer for r in invals[n:]])
        for i, value in zip(self.written, new):
            contents[i][...] = np.asarray(value)
        if tracked:
            for i, value in zip([i for i in self.written if i in tracked], rest[-1]):
                if i in self.read:  # the mask it was given, updated
                    masks[i][...] = np.asarray(value)
                elif i in self.whole:  # whether a store (of all of it) ran
                    if value:
                        masks[i][...] = True
                else:  # what it wrote
                    masks[i] |= np.asarray(value)
        return [np.asarray(o) for o in outs]


def work(eqns: Sequence[Any]) -> int:
    """Equations one run of ``eqns`` evaluates (loop bodies once per iteration)."""
    total = 0
    for eqn in eqns:
        prim, p = eqn.primitive, eqn.params
        if prim is jc.scan_p:
            total += int(p["length"]) * work(p["jaxpr"].jaxpr.eqns)
        elif prim is jc.while_p:
            total += WHILE_GUESS * (work(p["body_jaxpr"].jaxpr.eqns)
                                    + work(p["cond_jaxpr"].jaxpr.eqns))
        elif prim is jc.cond_p:
            total += 1 + max(work(b.jaxpr.eqns) for b in p["branches"])
        elif prim is jc.jit_p or "call_jaxpr" in p:
            inner = p["jaxpr"] if prim is jc.jit_p else p["call_jaxpr"]
            total += work(getattr(inner, "jaxpr", inner).eqns)
        else:
            total += 1
    return total


def _worth_compiling(eqns: Sequence[Any], runs: int) -> bool | None:
    """True: compile at once; False: compile when hot (see ``HOT_LAUNCH``); None: never."""
    w = work(eqns)
    if w >= MIN_WORK or w * runs >= MIN_WORK_PER_LAUNCH:
        return True
    return False if w >= HOT_MIN_WORK else None


def find_segments(jaxpr: Any, has_own_rule: Callable[[Any], bool],
                  runs: int = 1) -> list[tuple[int, int, bool]]:
    """The ``[start, stop)`` equation ranges of ``jaxpr`` worth compiling, and whether
    each is hot only: maximal runs of fusible equations whose ``work`` is at least
    ``MIN_WORK``, or at least ``MIN_WORK_PER_LAUNCH`` over the ``runs`` of ``jaxpr`` in
    one launch (compiled at once), else at least ``HOT_MIN_WORK`` (hot)."""
    found: list[tuple[int, int, bool]] = []
    start = None
    eqns = jaxpr.eqns
    for i, eqn in enumerate([*eqns, None]):
        ok = eqn is not None and fusible(eqn, has_own_rule)
        if ok and start is None:
            start = i
        elif not ok and start is not None:
            worth = _worth_compiling(eqns[start:i], runs)
            if worth is not None:
                found.append((start, i, not worth))
            start = None
    return found


def segment_io(jaxpr: Any, start: int, stop: int) -> tuple[list[Any], list[Any]]:
    """(inputs, live outputs) of ``jaxpr.eqns[start:stop]``, in first-use order."""
    eqns = jaxpr.eqns
    defined: set[Any] = set()
    inputs: list[Any] = []
    seen: set[Any] = set()
    for eqn in eqns[start:stop]:
        for a in eqn.invars:
            if isinstance(a, jc.Literal) or a in defined or a in seen:
                continue
            seen.add(a)
            inputs.append(a)
        defined.update(eqn.outvars)
    later = {a for eqn in eqns[stop:] for a in eqn.invars if not isinstance(a, jc.Literal)}
    later.update(a for a in jaxpr.outvars if not isinstance(a, jc.Literal))
    outputs = [v for eqn in eqns[start:stop] for v in eqn.outvars if v in later]
    return inputs, outputs
