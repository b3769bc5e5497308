"""Interpreter rules given by other packages: traced JAX implementations, and evaluations.

Two forms (the protocol is specified in ``palladium.interpret.rule_plugins``):

* a *JAX implementation* (``register_interpret_rule(p, impl)``): traced once per equation
  with its input types, the traced jaxpr evaluated in place of the equation
  (:func:`traced_rule`);
* an *evaluation* (``register_interpret_rule(p, fn, form="evaluate")``): ``fn`` is called
  with the equation's operands and parameters and declares a jaxpr and its arguments,
  some of them refs with transforms (jax's ``TransformedRef`` around an operand); the
  evaluator runs that jaxpr with its own rules (:func:`evaluation_rule`). A ref with
  transforms stays one value while it flows through control flow, calls and
  ``run_scoped``; the rules that read or write through a ref resolve its transforms in
  front of their own (:func:`ref_view_rule` for loads, stores and ``addupdate``; DMAs,
  masked loads/stores and semaphores compose them through ``refs.split_transformed``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import KernelError
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.refs import split_transformed

__all__ = ["EVALUATE", "TRACE", "VIEW_PRIMITIVES", "evaluation_rule", "ref_view_rule",
           "traced_rule"]

#: The two forms of a plugin rule (``register_interpret_rule(..., form=...)``).
TRACE = "trace"
EVALUATE = "evaluate"


def traced_rule(primitive: Any, impl: Callable[..., Any]) -> Callable[[Any, Any, list[Any]], list[Any]]:
    """A rule that traces ``impl`` once per equation and evaluates the traced jaxpr."""
    traced: dict[int, tuple[Any, Any]] = {}

    def rule(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        hit = traced.get(id(eqn))
        if hit is None or hit[0] is not eqn:
            params = dict(eqn.params)

            def flat(*args: Any) -> list[Any]:
                out = impl(*args, **params)
                return list(out) if primitive.multiple_results else [out]

            closed = jc.trace_to_closed_jaxpr(
                flat, [v.aval for v in eqn.invars], f"palladium rule for {primitive}"
            )
            hit = (eqn, closed)
            traced[id(eqn)] = hit
        return ev.eval_closed(hit[1], invals)

    return rule


# -- evaluations -------------------------------------------------------------------------
def as_view(value: Any) -> Any:
    """``value``, a ref with nested transforms flattened into one ``TransformedRef``
    (a plugin may wrap an operand that is itself a ref with transforms)."""
    if type(value) is not jc.TransformedRef:
        return value
    ref, transforms = split_transformed(value)
    return jc.TransformedRef(ref, transforms)


def evaluation_rule(primitive: Any, fn: Callable[..., Any]) -> Callable[[Any, Any, list[Any]], list[Any]]:
    """A rule that asks ``fn`` what to evaluate and evaluates it with the evaluator's rules."""

    def rule(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        declared = fn(*invals, **eqn.params)
        closed, args = _checked_declaration(primitive, declared, ev, eqn)
        outs = ev.eval_with_ref_views(closed, [as_view(a) for a in args])
        if len(outs) != len(eqn.outvars):
            raise KernelError(
                f"the interpreter rule (form 'evaluate') of primitive '{primitive}' declared "
                f"a jaxpr with {len(outs)} results for an equation with "
                f"{len(eqn.outvars)} ({ev.site(eqn)})")
        return outs

    return rule


def _checked_declaration(primitive: Any, declared: Any, ev: KernelContext,
                         eqn: Equation) -> tuple[Any, Sequence[Any]]:
    ok = isinstance(declared, tuple | list) and len(declared) == 2
    closed, args = declared if ok else (None, None)
    if isinstance(closed, jc.Jaxpr) and not closed.constvars:
        closed = jc.ClosedJaxpr(closed, ())
    if not ok or not isinstance(closed, jc.ClosedJaxpr) or not isinstance(args, tuple | list):
        raise KernelError(
            f"the interpreter rule (form 'evaluate') of primitive '{primitive}' returned "
            f"{type(declared).__name__}, not (ClosedJaxpr, arguments) ({ev.site(eqn)})")
    if len(args) != len(closed.jaxpr.invars):
        raise KernelError(
            f"the interpreter rule (form 'evaluate') of primitive '{primitive}' declared "
            f"{len(args)} arguments for a jaxpr of {len(closed.jaxpr.invars)} inputs "
            f"({ev.site(eqn)})")
    return closed, args


# -- loads and stores through a ref with transforms (programs of evaluations) ------------
#: Primitives whose rule takes the ref as its first operand and its own transforms as
#: the ``tree`` parameter (the leaves after the ref and, for stores, the value).
VIEW_PRIMITIVES: dict[Any, int] = {jc.get_p: 1, jc.swap_p: 2, jc.addupdate_p: 2}


def ref_view_rule(eqn: Any, plain: Any, resolve: Callable[[Any], Any]) -> Any:
    """``plain`` (the rule of a load or store equation), or, when its ref is a ref with
    transforms, the rule of the same equation with those transforms composed in front
    of its own: ``resolve(eqn')`` of the rewritten equation, made once per structure of
    the ref's transforms, so the compiled access caches serve as for any other ref.

    The ref's transforms are concrete (numpy index values), which jax's pytrees keep as
    static data: a structure per value of them (a buffer slot), at most ``_VIEWS_LIMIT``
    kept per equation. The equation's own index operands stay operands."""
    head = VIEW_PRIMITIVES[eqn.primitive]
    theirs = jax.tree_util.treedef_children(eqn.params["tree"])
    made: dict[Any, tuple[Any, Any]] = {}

    def rule(ev: KernelContext, eqn_: Equation, invals: list[Value]) -> list[Value]:
        ref = invals[0]
        if type(ref) is not jc.TransformedRef:
            return plain(ev, eqn_, invals)  # type: ignore[no-any-return]
        base, own = split_transformed(ref)
        leaves, own_tree = jax.tree.flatten(own)
        hit = made.get(own_tree)
        if hit is None:
            composed = jax.tree_util.treedef_tuple(
                [*jax.tree_util.treedef_children(own_tree), *theirs])
            rewritten = eqn.replace(params={**eqn.params, "tree": composed})
            if len(made) >= _VIEWS_LIMIT:
                made.clear()
            hit = made[own_tree] = (rewritten, resolve(rewritten))
        rewritten, specialised = hit
        return specialised(ev, rewritten, [base, *invals[1:head], *leaves, *invals[head:]])  # type: ignore[no-any-return]

    return rule


_VIEWS_LIMIT = 256
