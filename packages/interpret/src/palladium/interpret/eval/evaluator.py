"""The eager jaxpr evaluator one simulated core runs.

Each equation is dispatched through, in order: the interpreter's own rules (memory,
DMA, semaphores, control flow, grid queries, ...), the numpy fast paths
(``palladium.interpret.numpy_rules.NUMPY_RULES``), and finally ``primitive.bind`` on
the CPU backend. Values are numpy arrays (ml_dtypes for bf16), numpy scalars, and the
ref objects of ``refs.py``.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import UnsupportedPrimitiveError
from palladium.interpret.eval.refs import MemRef, SemaphoreRef
from palladium.interpret.eval.registry import RULES, Rule
from palladium.interpret.site import Site

try:
    from palladium.interpret.numpy_rules import NUMPY_RULES
except ImportError:  # the numpy fast paths land separately; bind covers everything meanwhile
    NUMPY_RULES = {}


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    rule: Rule
    eqn: Any
    inputs: tuple[Any, ...]  # a Var, or a _Const holding a literal's value
    outvars: tuple[Any, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class _Const:
    value: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Program:
    """A jaxpr pre-processed for evaluation: each equation's rule resolved once."""

    jaxpr: Any
    steps: tuple[Step, ...]
    outputs: tuple[Any, ...]
    version: int


def _literal(atom: Any) -> _Const:
    aval = atom.aval
    return _Const(np.asarray(atom.val, dtype=aval.dtype) if hasattr(aval, "dtype") else atom.val)


def _is_float(aval: Any) -> bool:
    dtype = getattr(aval, "dtype", None)
    try:
        return dtype is not None and np.issubdtype(np.dtype(dtype), np.floating)
    except TypeError:
        return False


def _compute_rule(prim: Any) -> Rule:
    np_rule = NUMPY_RULES.get(prim)
    multiple = prim.multiple_results

    def rule(ev: CoreEvaluator, eqn: Any, invals: list[Any]) -> list[Any]:
        if ev.launch.params.skip_floating_point_ops and eqn.outvars and all(
            _is_float(v.aval) for v in eqn.outvars
        ):
            return [np.full(v.aval.shape, np.inf, v.aval.dtype) for v in eqn.outvars]
        if np_rule is not None:
            out = np_rule(*invals, **eqn.params)
            if out is not NotImplemented:
                return list(out) if multiple else [out]
        if any(isinstance(x, MemRef | SemaphoreRef) for x in invals):
            raise UnsupportedPrimitiveError(
                f"primitive '{prim}' takes a ref and the interpreter has no rule for it; "
                f"register one with palladium.interpret.register_interpret_rule "
                f"({ev.site(eqn)})"
            )
        bind_params = prim.get_bind_params(eqn.params)
        try:
            out = prim.bind(*invals, **bind_params)
        except NotImplementedError as e:
            raise UnsupportedPrimitiveError(
                f"primitive '{prim}' cannot be evaluated on CPU ({e}); register an "
                f"interpreter rule with palladium.interpret.register_interpret_rule "
                f"({ev.site(eqn)})"
            ) from e
        return [np.asarray(o) for o in out] if multiple else [np.asarray(out)]

    return rule


def resolve_rule(prim: Any) -> Rule:
    """The rule for ``prim``: ours, else numpy fast path then bind."""
    own = RULES.get(prim)
    return own if own is not None else _compute_rule(prim)


def compile_jaxpr(jaxpr: Any) -> Program:
    steps = []
    for eqn in jaxpr.eqns:
        inputs = tuple(_literal(a) if isinstance(a, jc.Literal) else a for a in eqn.invars)
        steps.append(Step(resolve_rule(eqn.primitive), eqn, inputs, tuple(eqn.outvars)))
    outputs = tuple(_literal(a) if isinstance(a, jc.Literal) else a for a in jaxpr.outvars)
    return Program(jaxpr, tuple(steps), outputs, RULES.version)


class ProgramCache:
    """Compiled programs of one kernel's jaxprs, by jaxpr identity."""

    def __init__(self) -> None:
        self._programs: dict[int, Program] = {}
        self._lock = threading.Lock()

    def get(self, jaxpr: Any) -> Program:
        prog = self._programs.get(id(jaxpr))
        if prog is None or prog.jaxpr is not jaxpr or prog.version != RULES.version:
            prog = compile_jaxpr(jaxpr)
            with self._lock:
                self._programs[id(jaxpr)] = prog
        return prog


@dataclasses.dataclass(eq=False)
class CoreEvaluator:
    """Evaluates jaxprs as one simulated core: its id, grid point and PRNG state."""

    launch: Any  # launch.Launch
    core: tuple[int, int]
    grid_point: tuple[int, ...] | None = None
    prng: np.random.Generator | None = None

    def eval_jaxpr(self, jaxpr: Any, consts: list[Any], args: list[Any]) -> list[Any]:
        if isinstance(jaxpr, jc.ClosedJaxpr):
            consts = list(jaxpr.consts) + list(consts)
            jaxpr = jaxpr.jaxpr
        prog = self.launch.programs.get(jaxpr)
        env: dict[Any, Any] = {}
        for v, x in zip(jaxpr.constvars, consts):
            env[v] = x
        for v, x in zip(jaxpr.invars, args):
            env[v] = x
        for step in prog.steps:
            invals = [a.value if isinstance(a, _Const) else env[a] for a in step.inputs]
            outs = step.rule(self, step.eqn, invals)
            for v, o in zip(step.outvars, outs):
                env[v] = o
        return [a.value if isinstance(a, _Const) else env[a] for a in prog.outputs]

    def eval_closed(self, closed: Any, args: list[Any]) -> list[Any]:
        """Evaluate a ClosedJaxpr (consts bound) on ``args``."""
        return self.eval_jaxpr(closed, [], args)

    def site(self, eqn: Any = None, what: str | None = None) -> Site:
        return Site(
            kernel=self.launch.kernel_name,
            core=self.core,
            grid_point=self.grid_point,
            source_info=None if eqn is None else eqn.source_info,
            what=what,
        )
