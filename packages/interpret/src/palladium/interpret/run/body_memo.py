"""Grid steps whose kernel body cannot do anything new, not walked again.

``predict`` runs a kernel with ``skip_floating_point_ops`` and ``keep_float_data=False``:
floating-point results are not computed and floating-point memory holds no data. A body
that then touches only floating-point memory (loads, stores, accumulations of float
refs), issues no DMA, semaphore, barrier or allocation and calls no rule a plugin
registered, does the same thing at every grid point with the same ``pl.program_id`` of
the axes it asks for: its branches and loop bounds, its indices (and so its
out-of-bounds checks), the equations it evaluates. The guide's matmul asks only for the
k axis: of 32,768 grid steps, 32 bodies differ.

:class:`BodyMemo` walks the first step of each such key, keeps the equations it evaluated
in order, and at every later step with the same key tells the observers (the timeline's
recorder) of the same equations instead of walking the body: the same events in the same
order, so the same prediction (``tests/perf/test_predict_speed.py`` compares it with the
full walk on a set of kernels).
"""

from __future__ import annotations

from typing import Any

from palladium.interpret.eval.jaxprs import nested_jaxprs
from palladium.interpret.eval.primitive_groups import INDEXED_ACCESSES, NESTED_CALLS
from palladium.interpret.eval.registry import RULES
from palladium.shared_memory import Observer, is_float_dtype

__all__ = ["BodyMemo", "memo_axes"]

#: Calls and control flow whose bodies are checked instead of the equation itself.
_CONTAINERS = frozenset({"cond", "while", "scan", "core_call", "custom_vjp_call_jaxpr",
                         *(str(p) for p in NESTED_CALLS)})
#: ref[...] reads and writes (their names: ``eval/primitive_groups``)
_REF_OPS = frozenset(str(p) for p in INDEXED_ACCESSES)
_GRID_QUERIES = frozenset({"program_id", "num_programs"})


def _float_ref(atom: Any) -> bool:
    aval = getattr(atom, "aval", None)
    dtype = getattr(getattr(aval, "inner_aval", aval), "dtype", None)
    try:
        return dtype is not None and is_float_dtype(dtype)
    except TypeError:
        return False


def _axes(jaxpr: Any, found: set[int]) -> bool:
    """Whether ``jaxpr`` may be memoised; adds the grid axes it asks ``program_id`` of."""
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        name = str(eqn.primitive)
        inner = nested_jaxprs(eqn)
        if name in _GRID_QUERIES:
            if name == "program_id":
                found.add(int(eqn.params["axis"]))
        elif name in _REF_OPS:
            if not _float_ref(eqn.invars[0]):
                return False  # integer memory: its values may steer the body
        elif inner:
            if name not in _CONTAINERS or not all(_axes(j, found) for j in inner):
                return False
        elif eqn.effects or RULES.get(eqn.primitive) is not None or \
                RULES.compiler(eqn.primitive) is not None or name in RULES.by_name:
            return False  # DMAs, semaphores, the MXU's state, plugins' rules...
    return True


def memo_axes(jaxpr: Any) -> tuple[int, ...] | None:
    """The grid axes whose ``program_id`` the body ``jaxpr`` reads, sorted, or None when
    its steps may differ otherwise (it is then walked at every step)."""
    found: set[int] = set()
    return tuple(sorted(found)) if _axes(jaxpr, found) else None


def memo_allowed(params: Any) -> bool:
    """Whether a launch with ``params`` computes nothing a skipped body would change:
    no floating-point values or data, no race detection, no uninitialised-value
    tracking."""
    return (bool(getattr(params, "skip_floating_point_ops", False))
            and not getattr(params, "keep_float_data", True)
            and not getattr(params, "detect_races", False)
            and getattr(params, "uninitialized_reads", "on_use") == "off")


class _Capture(Observer):
    """Keeps the equations ``core`` evaluates, in order."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.ops: list[Any] = []

    def compute(self, core: Any, op: Any) -> None:
        if core == self.core:
            self.ops.append(op)


class BodyMemo:
    """One core's kernel body for one launch: walked once per key of grid axes, told to
    the observers at the other steps (see the module docstring). ``walked`` and
    ``replayed`` count the steps of each kind."""

    def __init__(self, jaxpr: Any, params: Any) -> None:
        self.jaxpr = jaxpr
        self.axes = memo_axes(jaxpr) if memo_allowed(params) else None
        self._seen: dict[tuple[int, ...], tuple[Any, ...]] = {}
        self.walked = 0
        self.replayed = 0

    def run(self, ev: Any, point: tuple[int, ...], operands: list[Any], core: Any,
            observers: Any) -> None:
        """Run the body at grid point ``point`` (``ev``: the core's evaluator there)."""
        if self.axes is None:
            self.walked += 1
            ev.eval_jaxpr(self.jaxpr, [], operands)
            return
        key = tuple(point[a] for a in self.axes)
        ops = self._seen.get(key)
        if ops is not None:
            self.replayed += 1
            if observers is not None and ops:
                compute = observers.compute
                # (the timeline's recorder, the one listener: the run at once)
                run = getattr(getattr(compute, "__self__", None), "compute_run", None)
                if run is not None:
                    run(core, ops)
                    return
                for op in ops:
                    compute(core, op)
            return
        self.walked += 1
        if observers is None or not observers.wants("compute"):
            ev.eval_jaxpr(self.jaxpr, [], operands)
            self._seen[key] = ()
            return
        capture = _Capture(core)
        observers.add(capture)
        try:
            ev.eval_jaxpr(self.jaxpr, [], operands)
        finally:
            observers.remove(capture)
        self._seen[key] = tuple(capture.ops)
