"""Interpreter rules given by other packages: traced JAX implementations, and evaluations.

Two forms (the protocol is specified in ``palladium.interpret.rule_plugins``):

* a *JAX implementation* (``register_interpret_rule(p, impl)``): traced once per equation
  with its input types, the traced jaxpr evaluated in place of the equation
  (:func:`traced_rule`);
* an *evaluation* (``register_interpret_rule(p, fn, form="evaluate")``): ``fn`` is called
  once per equation, with the equation's variables for its operands, and declares a
  jaxpr and its arguments, some of them refs with transforms (jax's ``TransformedRef``
  around an operand); the declaration becomes a recipe over operand positions, and
  each run the evaluator runs that jaxpr with its own rules on the operands' values
  (:func:`evaluation_rule`). A ref with transforms is a ``refs.RefView`` (base ref,
  index values, structure) and stays one value while it flows through control flow,
  calls and ``run_scoped``; the rules that read or write through a ref resolve its
  transforms in front of their own (:func:`ref_view_rule` for loads, stores and
  ``addupdate``, with the compiled access caches; DMAs, masked loads/stores and
  semaphores through ``refs.split_transformed``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import KernelError
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.primitive_groups import INDEXED_ACCESSES
from palladium.interpret.eval.refs import RefView, split_transformed

__all__ = ["EVALUATE", "TRACE", "evaluation_rule", "ref_view_rule",
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
# A declaration, made once per equation: ``fn`` is called with the equation's input
# variables standing for its operands, and each argument it declares becomes a recipe
# over the operand positions (an operand, a view of one, or a constant).
_OPERAND, _VIEW, _CONSTANT = 0, 1, 2


def evaluation_rule(primitive: Any, fn: Callable[..., Any]) -> Callable[[Any, Any, list[Any]], list[Any]]:
    """A rule that evaluates what ``fn`` declares, with the evaluator's own rules."""
    declared: dict[int, tuple[Any, Any, list[Any], Any]] = {}

    def rule(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        hit = declared.get(id(eqn))
        if hit is None or hit[0] is not eqn:
            closed, recipe, grid = _declaration(primitive, fn, ev, eqn)
            hit = declared[id(eqn)] = (eqn, closed, recipe, grid)
        _, closed, recipe, grid = hit
        if grid is not None:
            grid = tuple(tuple(int(invals[i]) if k == _OPERAND else int(i) for k, i in part)
                         for part in grid)
        args = []
        for kind, what, leaves, tree in recipe:
            if kind == _OPERAND:
                args.append(invals[what])
            elif kind == _VIEW:
                args.append(RefView(invals[what], tuple(
                    invals[i] if k == _OPERAND else i for k, i in leaves), tree))
            else:
                args.append(what)
        return ev.eval_with_ref_views(closed, args, grid)  # type: ignore[no-any-return]

    return rule


def _declaration(primitive: Any, fn: Callable[..., Any], ev: KernelContext,
                 eqn: Equation) -> tuple[Any, list[Any], Any]:
    def refuse(why: str) -> KernelError:
        return KernelError(f"the interpreter rule (form 'evaluate') of primitive "
                           f"'{primitive}' {why} ({ev.site(eqn)})")

    declared = fn(*eqn.invars, **eqn.params)
    ok = isinstance(declared, tuple | list) and len(declared) in (2, 3)
    closed, args, grid = (*declared, None)[:3] if ok else (None, None, None)
    if isinstance(closed, jc.Jaxpr) and not closed.constvars:
        closed = jc.ClosedJaxpr(closed, ())
    if not ok or not isinstance(closed, jc.ClosedJaxpr) or not isinstance(args, tuple | list):
        raise refuse(f"returned {type(declared).__name__}, not (ClosedJaxpr, arguments) or "
                     "(ClosedJaxpr, arguments, (grid indices, grid sizes))")
    if len(args) != len(closed.jaxpr.invars):
        raise refuse(f"declared {len(args)} arguments for a jaxpr of "
                     f"{len(closed.jaxpr.invars)} inputs")
    if len(closed.jaxpr.outvars) != len(eqn.outvars):
        raise refuse(f"declared a jaxpr with {len(closed.jaxpr.outvars)} results for an "
                     f"equation with {len(eqn.outvars)}")
    position: dict[int, int] = {}
    for i, v in enumerate(eqn.invars):
        position.setdefault(id(v), i)

    def leaf(x: Any) -> tuple[int, Any]:
        i = position.get(id(x))
        return (_CONSTANT, x) if i is None else (_OPERAND, i)

    recipe: list[tuple[int, Any, Any, Any]] = []
    for n, arg in enumerate(args):
        if isinstance(arg, jc.TransformedRef):
            base, transforms = split_transformed(arg)
            if id(base) not in position:
                raise refuse(f"declared argument {n}, a ref with transforms around "
                             f"{base!r}, which is not an operand of the equation")
            flat, tree = jax.tree.flatten(transforms)
            recipe.append((_VIEW, position[id(base)], [leaf(x) for x in flat], tree))
        else:
            kind, what = leaf(arg)
            recipe.append((kind, what, None, None))
    if grid is not None:
        if not (isinstance(grid, tuple | list) and len(grid) == 2
                and len(grid[0]) == len(grid[1])):
            raise refuse(f"declared the grid {grid!r}, not (indices, sizes) of one length")
        grid = tuple(tuple(leaf(x) for x in part) for part in grid)
    return closed, recipe, grid


# -- loads and stores through a ref with transforms (programs of evaluations) ------------
#: Primitives whose rule takes the ref as its first operand and its own transforms as
#: the ``tree`` parameter: ``primitive_groups.INDEXED_ACCESSES``.


def ref_view_rule(eqn: Any, plain: Any, resolve: Callable[[Any], Any]) -> Any:
    """``plain`` (the rule of a load or store equation), or, when its ref is a ref with
    transforms, the rule of the same equation with those transforms composed in front
    of its own: ``resolve(eqn')`` of the rewritten equation, made once per structure of
    the ref's transforms, so the compiled access caches serve as for any other ref.

    The ref's transforms are concrete (numpy index values), which jax's pytrees keep as
    static data: a structure per value of them (a buffer slot), at most ``_VIEWS_LIMIT``
    kept per equation. The equation's own index operands stay operands."""
    head = INDEXED_ACCESSES[eqn.primitive]
    theirs = jax.tree_util.treedef_children(eqn.params["tree"])
    made: dict[int, tuple[Any, Any, Any]] = {}

    def rule(ev: KernelContext, eqn_: Equation, invals: list[Value]) -> list[Value]:
        ref = invals[0]
        if type(ref) is not RefView:
            return plain(ev, eqn_, invals)  # type: ignore[no-any-return]
        own_tree = ref.tree
        hit = made.get(id(own_tree))
        if hit is None or hit[0] is not own_tree:
            composed = jax.tree_util.treedef_tuple(
                [*jax.tree_util.treedef_children(own_tree), *theirs])
            rewritten = eqn.replace(params={**eqn.params, "tree": composed})
            if len(made) >= _VIEWS_LIMIT:
                made.clear()
            hit = made[id(own_tree)] = (own_tree, rewritten, resolve(rewritten))
        _, rewritten, specialised = hit
        return specialised(ev, rewritten, [ref.ref, *invals[1:head], *ref.leaves,  # type: ignore[no-any-return]
                                           *invals[head:]])

    return rule


_VIEWS_LIMIT = 256
