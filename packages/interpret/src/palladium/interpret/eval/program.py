"""Program compilation: a jaxpr -> a flat list of steps, each with its rule resolved.

Done once per jaxpr (``ProgramCache``, by identity and rule-table version) and kept
apart from evaluation (``evaluator.py``), which only runs the steps. A rule is resolved
in order: a registered rule compiler, the interpreter's own rule, the numpy fast path
(``palladium.interpret.numpy_rules``), and finally ``primitive.bind`` on the CPU backend.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import threading
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.compiled.segment_function import is_ref
from palladium.interpret.errors import UnsupportedPrimitiveError
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.jaxprs import nested_jaxprs
from palladium.interpret.eval.primitive_groups import INDEXED_ACCESSES
from palladium.interpret.eval.refs import MemRef, RefView, SemaphoreRef
from palladium.interpret.eval.registry import RULES, Rule, rule_by_name
from palladium.interpret.eval.rules_unsupported import UNSUPPORTED, refusal
from palladium.interpret.eval.segments import Segment, find_segments, segment_io
from palladium.interpret.eval.shadow_rules import PASS_THROUGH, SHADOW_RULES
from palladium.interpret.eval.traced_rule import ref_view_rule
from palladium.interpret.numpy_rules import (
    DETERMINISTIC_RULES,
    FLUSHING,
    NUMPY_RULES,
    PREFLUSHED_RULES,
    PRESERVING,
    has_subnormal_f32,
)
from palladium.interpret.numpy_rules.fast_paths import fast_path
from palladium.interpret.numpy_rules.scalars import scalar_rule
from palladium.shared_memory import is_float_dtype

__all__ = ["Program", "ProgramCache", "Step", "compile_jaxpr", "resolve_rule", "used_vars"]

_F32 = np.dtype(np.float32)


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """One equation, ready to run: its rule and where its operands live in the env."""

    rule: Rule
    eqn: Any
    in_slots: tuple[int, ...]
    out_slots: tuple[int, ...]
    segment: bool = False  # a compiled segment: its equations are observed one by one
    # A call inlined into the program (``_inlined_body``): the call's equation, shown to an
    # observer of every equation as before, run by nothing (its body's steps follow).
    observe_only: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Program:
    """A jaxpr compiled for evaluation.

    Every variable and literal has a slot in a flat list (the env); literals are stored
    in ``template`` once, so running the program is: copy the template, store the
    arguments, then per step gather the operands by slot, call the pre-resolved rule and
    store the results. No dict lookups, no per-equation dispatch.
    """

    jaxpr: Any
    steps: tuple[Step, ...]
    template: tuple[Any, ...]
    const_slots: tuple[int, ...]
    in_slots: tuple[int, ...]
    out_slots: tuple[int, ...]
    version: int
    #: The steps the evaluator's loop runs (those not ``observe_only``), each as one tuple
    #: it unpacks instead of reading a Step's attributes (every equation of every core
    #: runs through it): (rule, equation, operands, the one operand's slot, the one
    #: result's slot, the result slots), where the operands are an
    #: ``operator.itemgetter`` of two or more slots (or a function of none) and the one
    #: operand's / result's slot is None unless there is exactly one: the operand list
    #: built in C, not by a list comprehension (a function call before Python 3.12).
    #: 0.38 -> 0.14 us per step of the loop.
    fast: tuple[tuple[Any, Any, Any, int | None, int | None, tuple[int, ...]], ...] = (
        dataclasses.field(init=False, repr=False, compare=False))
    #: Per step of ``fast``: its rule when values carry shadows (``value_shadows``;
    #: a compiled segment's own, which runs its equations one by one on shadows), or
    #: None (the plain rule, or the propagation of its operands' shadows).
    shadow_rules: tuple[Any, ...] = dataclasses.field(init=False, repr=False, compare=False)
    #: Every step (``observe_only`` too) as the loop under an observer of every equation
    #: runs it: ``fast``'s tuple and whether the observer is told of the equation (not
    #: of a segment's: its equations are told one by one); an ``observe_only`` step's
    #: results are stored by ``zip`` (its rule returns none).
    observed: tuple[tuple[Any, Any, Any, int | None, int | None, tuple[int, ...], bool],
                    ...] = dataclasses.field(init=False, repr=False, compare=False)
    #: Whether every step is one plain equation nesting no jaxpr (no segment, loop,
    #: branch or call): under the timeline its equations may be told as one run
    #: (``CoreEvaluator.run_program``), ``eqns``, after they ran.
    flat: bool = dataclasses.field(init=False, repr=False, compare=False)
    eqns: tuple[Any, ...] = dataclasses.field(init=False, repr=False, compare=False)
    #: Its variants for launches that skip steps (``skipped_steps.skipping``), by settings
    variants: dict[Any, Any] = dataclasses.field(init=False, repr=False, compare=False,
                                                 default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fast", tuple(
            (st.rule, st.eqn,
             operator.itemgetter(*ins) if len(ins) > 1 else None if ins else _no_operands,
             ins[0] if len(ins) == 1 else None,
             outs[0] if len(outs) == 1 else None, outs)
            for st in self.steps if not st.observe_only
            for ins, outs in [(st.in_slots, st.out_slots)]))
        object.__setattr__(self, "observed", tuple(
            (st.rule, st.eqn,
             operator.itemgetter(*ins) if len(ins) > 1 else None if ins else _no_operands,
             ins[0] if len(ins) == 1 else None,
             outs[0] if len(outs) == 1 and not st.observe_only else None, outs,
             not st.segment)
            for st in self.steps
            for ins, outs in [(st.in_slots, st.out_slots)]))
        object.__setattr__(self, "eqns", tuple(st.eqn for st in self.steps
                                               if not st.observe_only))
        object.__setattr__(self, "flat", all(
            not st.observe_only and not st.segment and not nested_jaxprs(st.eqn)
            for st in self.steps))
        object.__setattr__(self, "shadow_rules", tuple(
            PASS_THROUGH if st.segment else SHADOW_RULES.get(st.eqn.primitive)
            for st in self.steps if not st.observe_only))


def _no_operands(env: list[Any]) -> tuple[()]:
    return ()


def _literal_value(atom: Any) -> Any:
    aval = atom.aval
    return np.asarray(atom.val, dtype=aval.dtype) if hasattr(aval, "dtype") else atom.val


def _is_float(aval: Any) -> bool:
    dtype = getattr(aval, "dtype", None)
    try:
        # jax's test (jnp.issubdtype(dtype, jnp.floating)): bfloat16 and float8 count
        return dtype is not None and is_float_dtype(np.dtype(dtype))
    except TypeError:
        return False


def _bind(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    prim = eqn.primitive
    if any(isinstance(x, MemRef | SemaphoreRef | RefView | jc.TransformedRef) for x in invals):
        raise UnsupportedPrimitiveError(
            f"primitive '{prim}' takes a ref and the interpreter has no rule for it; "
            f"register one with palladium.interpret.register_interpret_rule "
            f"({ev.site(eqn)})"
        )
    bind_params = prim.get_bind_params(eqn.params)
    try:
        out = prim.bind(*invals, **bind_params)
    except NotImplementedError as e:
        if str(prim) in UNSUPPORTED:
            raise refusal(str(prim), ev.site(eqn)) from e
        raise UnsupportedPrimitiveError(
            f"primitive '{prim}' cannot be evaluated on CPU ({e}); register an "
            f"interpreter rule with palladium.interpret.register_interpret_rule "
            f"({ev.site(eqn)})"
        ) from e
    return [np.asarray(o) for o in out] if prim.multiple_results else [np.asarray(out)]


def _skipped(ev: KernelContext, eqn: Equation, float_outs: bool) -> bool:
    """Whether ``eqn`` is not computed: a floating-point result under
    ``skip_floating_point_ops``, or integer ones that steer nothing under
    ``skip_unused_integer_ops`` (``steering_values.py``)."""
    if float_outs:
        return ev.skip_floating_point_ops
    unused = ev.unused_values
    return unused is not None and bool(eqn.outvars) and all(v in unused for v in eqn.outvars)


def _compute_rule(eqn: Any, operands_flushed: bool = False) -> Rule:
    """The rule of one compute equation: numpy fast path, else ``bind``.

    ``operands_flushed``: every f32 operand is known to hold no subnormals, so the
    numpy rule's variant that skips flushing them (``PREFLUSHED_RULES``) serves.
    """
    prim = eqn.primitive
    np_rule = (PREFLUSHED_RULES.get(prim) if operands_flushed else None) or NUMPY_RULES.get(prim)
    ordered_rule = DETERMINISTIC_RULES.get(prim)  # InterpretParams(deterministic_dot=True)
    multiple = prim.multiple_results
    params = dict(eqn.params)
    float_outs = bool(eqn.outvars) and all(_is_float(v.aval) for v in eqn.outvars)
    skipped: list[list[Value]] = []  # the skipped results, made once (read-only)

    def skipped_results() -> list[Value]:
        # read-only zero-stride arrays: no memory to fill per skipped operation
        if not skipped:
            skipped.append([np.broadcast_to(
                np.array(np.inf if float_outs else 0, v.aval.dtype), v.aval.shape)
                for v in eqn.outvars])
        return skipped[0]

    def rule(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        if _skipped(ev, eqn, float_outs):
            return list(skipped_results())
        if ordered_rule is not None and ev.deterministic_dot:
            out = ordered_rule(*invals, **params)
            if out is not NotImplemented:
                return list(out) if multiple else [out]
        if np_rule is not None:
            out = np_rule(*invals, **params)
            if out is not NotImplemented:
                return list(out) if multiple else [out]
        return _bind(ev, eqn, invals)

    # (what ``skipped_steps`` reads: whether and what this rule returns when skipped)
    rule.float_outs, rule.skipped_results = float_outs, skipped_results  # type: ignore[attr-defined]
    fast = fast_path(eqn, operands_flushed) if np_rule is not None else None
    if fast is None:
        return scalar_rule(eqn, rule) or rule

    def fast_rule(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        # (what ``rule`` decides before its numpy rule stays with ``rule``)
        if not (_skipped(ev, eqn, float_outs)
                or (ordered_rule is not None and ev.deterministic_dot)):
            out = fast(invals)
            if out is not None:
                return out
        return rule(ev, eqn, invals)

    fast_rule.float_outs, fast_rule.skipped_results = float_outs, skipped_results  # type: ignore[attr-defined]
    return scalar_rule(eqn, rule) or fast_rule


def resolve_rule(
    eqn: Any, used: frozenset[Any] = frozenset(), operands_flushed: bool = False
) -> Rule:
    """The rule for one equation: a specialised one from a registered rule compiler,
    else the primitive's rule, else numpy fast path then bind. ``used``: the variables
    some later equation (or the jaxpr's result) reads; ``operands_flushed``: every f32
    operand is known to hold no subnormals (see ``_flushed_outputs``)."""
    compiler = RULES.compiler(eqn.primitive)
    if compiler is not None:
        return compiler(eqn, used)
    own = RULES.get(eqn.primitive)
    if own is None and RULES.by_name:
        own = rule_by_name(eqn.primitive)
    return own if own is not None else _compute_rule(eqn, operands_flushed)


def _dtype(atom: Any) -> Any:
    return getattr(atom.aval, "dtype", None)


def _flushed_outputs(eqn: Any, operands_flushed: bool) -> bool:
    """Whether the f32 results of ``eqn`` are known to hold no subnormals: results of a
    flushing numpy rule that surely runs (all operands f32, no ``accuracy``), or of a
    rule that only moves values of operands that hold none."""
    prim = eqn.primitive
    if RULES.compiler(prim) is not None or RULES.get(prim) is not None:
        return False  # a registered rule owns this primitive: nothing is known of it
    if prim in FLUSHING:
        return (eqn.params.get("accuracy") is None
                and all(_dtype(a) == _F32 for a in eqn.invars))
    return prim in PRESERVING and operands_flushed


def is_flushed_value(value: Any, dtype: Any = None) -> bool:
    """Whether a constant (of ``dtype``: a Python scalar's is its variable's) holds no
    f32 subnormal."""
    value = np.asarray(value, dtype)
    return value.dtype != _F32 or not has_subnormal_f32(value)


def _observed_only(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    return []  # never run: see ``Step.observe_only``


def _inlined_body(eqn: Any, segments: bool) -> Any:
    """The ClosedJaxpr of a call whose body is inlined into the calling program, or
    None: the call's rule is the built-in one that evaluates its body on its operands
    (``rules_control.py``), and, in a program with compiled segments, the body has no
    segment of its own (inlined, its equations would run one by one instead)."""
    if RULES.compiler(eqn.primitive) is not None:
        return None
    param = getattr(RULES.get(eqn.primitive), "inlined_body", None)
    body = eqn.params.get(param) if param is not None else None
    if body is None or not isinstance(body, jc.ClosedJaxpr):
        return None
    if segments and find_segments(body.jaxpr, _has_own_rule):
        return None
    return body


def used_vars(jaxpr: Any) -> frozenset[Any]:
    """The variables of ``jaxpr`` that an equation or the result reads."""
    used = {a for eqn in jaxpr.eqns for a in eqn.invars if not isinstance(a, jc.Literal)}
    used.update(a for a in jaxpr.outvars if not isinstance(a, jc.Literal))
    return frozenset(used)


def _has_own_rule(prim: Any) -> bool:
    """Whether the interpreter runs ``prim`` by a rule of its own (registered for it or by
    its name): never fused into a compiled segment, which would run its XLA lowering."""
    return (RULES.compiler(prim) is not None or RULES.get(prim) is not None
            or str(prim) in RULES.by_name)


def _segment_step(jaxpr: Any, start: int, stop: int, races_ok: bool, hot: bool,
                  slot_of: Any, fresh: Any) -> Step:
    """The one step that runs ``jaxpr.eqns[start:stop]`` as a compiled segment."""
    inputs, outputs = segment_io(jaxpr, start, stop)
    eqns = jaxpr.eqns[start:stop]
    inputs = [*(v for v in inputs if not is_ref(v)), *(v for v in inputs if is_ref(v))]
    sub = jc.sub_jaxpr(inputs, outputs, eqns, "palladium compiled segment")
    seg = Segment(eqns, inputs, outputs, compile_jaxpr(sub, segments=False), races_ok, hot)
    ins = tuple(slot_of(a) for a in seg.inputs)
    return Step(seg, eqns[0], ins, tuple(fresh(v) for v in outputs), segment=True)


def compile_jaxpr(jaxpr: Any, *, segments: bool = True, races_ok: bool = False,
                  runs: int = 1, ref_views: bool = False) -> Program:
    """Compile ``jaxpr``; with ``segments``, its runs of pure array code become compiled
    segments (``segments.py``; ``races_ok``: the kernel uses no DMA or semaphore;
    ``runs``: how often a launch runs ``jaxpr``, known for the kernel body).
    ``ref_views``: a ref may come with transforms (a plugin's evaluation, see
    ``traced_rule.py``): loads and stores compose them, and no segment is made (a
    segment takes whole buffers only)."""
    segments = segments and not ref_views
    slots: dict[Any, int] = {}
    template: list[Any] = []

    def slot_of(atom: Any) -> int:
        if isinstance(atom, jc.Literal):
            template.append(_literal_value(atom))
            return len(template) - 1
        s = slots.get(atom)
        if s is None:
            s = slots[atom] = len(template)
            template.append(None)
        return s

    def fresh(var: Any) -> int:
        # Every definition gets its own slot (dropped outputs included).
        template.append(None)
        s = slots[var] = len(template) - 1
        return s

    const_slots = tuple(fresh(v) for v in jaxpr.constvars)
    in_slots = tuple(fresh(v) for v in jaxpr.invars)
    used = used_vars(jaxpr)
    # Variables whose f32 value is known to hold no subnormals (the numpy rules' flush
    # of them would rewrite nothing): their consumers skip that flush.
    flushed: set[Any] = set()

    def is_flushed(atom: Any) -> bool:
        if _dtype(atom) != _F32:
            return True  # only f32 operands are concerned
        if isinstance(atom, jc.Literal):
            return is_flushed_value(atom.val, _F32)
        return atom in flushed

    def mark_flushed(var: Any, known: bool) -> None:
        if known and _dtype(var) == _F32:
            flushed.add(var)
        else:
            flushed.discard(var)  # (a body inlined twice: its variables are mapped again)

    steps: list[Step] = []

    def emit(eqn: Any, used: frozenset[Any]) -> None:
        body = _inlined_body(eqn, segments)
        if body is not None:  # a call: its body's steps, on the call's operands
            steps.append(Step(_observed_only, eqn, (), (), observe_only=True))
            inner = body.jaxpr
            for v, c in zip(inner.constvars, body.consts):
                template.append(c)
                slots[v] = len(template) - 1
                mark_flushed(v, is_flushed_value(c, _dtype(v)))
            for v, a in zip(inner.invars, eqn.invars):
                slots[v] = slot_of(a)
                mark_flushed(v, is_flushed(a))
            inner_used = used | used_vars(inner)
            for e in inner.eqns:
                emit(e, inner_used)
            for v, r in zip(eqn.outvars, inner.outvars):
                slots[v] = slot_of(r)
                mark_flushed(v, is_flushed(r))
            return
        ins = tuple(slot_of(a) for a in eqn.invars)
        outs = tuple(fresh(v) for v in eqn.outvars)
        operands_flushed = all(is_flushed(a) for a in eqn.invars)
        known = _flushed_outputs(eqn, operands_flushed)
        for v in eqn.outvars:
            mark_flushed(v, known)
        step_rule = resolve_rule(eqn, used, operands_flushed)
        if ref_views and eqn.primitive in INDEXED_ACCESSES:
            step_rule = ref_view_rule(eqn, step_rule, functools.partial(resolve_rule, used=used))
        steps.append(Step(step_rule, eqn, ins, outs))

    starts = ({start: (stop, hot) for start, stop, hot in find_segments(jaxpr, _has_own_rule, runs)}
              if segments else {})
    skip_to = 0
    for i, eqn in enumerate(jaxpr.eqns):
        if i < skip_to:
            continue
        if i in starts:
            skip_to, hot = starts[i]
            steps.append(_segment_step(jaxpr, i, skip_to, races_ok, hot, slot_of, fresh))
            continue
        emit(eqn, used)
    out_slots = tuple(slot_of(a) for a in jaxpr.outvars)
    return Program(jaxpr, tuple(steps), tuple(template), const_slots, in_slots, out_slots,
                   RULES.version)


class ProgramCache:
    """Compiled programs of one kernel's jaxprs, by what a program depends on: the jaxpr
    (by identity) and whether its refs may come with transforms (``ref_views``)."""

    def __init__(self, *, races_ok: bool = False, body: Any = None, grid_points: int = 1) -> None:
        self._programs: dict[tuple[int, bool], Program] = {}
        self._races_ok = races_ok  # the kernel starts no DMA: see segments.py
        # The kernel body runs once per grid point: its segments' work counts that often.
        self._body, self._grid_points = body, max(int(grid_points), 1)
        self._lock = threading.Lock()

    @property
    def races_ok(self) -> bool:
        """Whether the kernel starts no DMA and uses no semaphore."""
        return self._races_ok

    def get(self, jaxpr: Any, ref_views: bool = False) -> Program:
        key = (id(jaxpr), ref_views)
        prog = self._programs.get(key)
        if prog is None or prog.jaxpr is not jaxpr or prog.version != RULES.version:
            runs = self._grid_points if jaxpr is self._body else 1
            prog = compile_jaxpr(jaxpr, races_ok=self._races_ok, runs=runs,
                                 ref_views=ref_views)
            with self._lock:
                self._programs[key] = prog
        return prog
