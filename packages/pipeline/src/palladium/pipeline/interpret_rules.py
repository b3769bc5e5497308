"""Interpreter rules for the ``emit_pipeline`` primitives (entry point for interpreters).

``palladium-pipeline`` declares :func:`interpret_rules` in the entry-point group
``palladium.interpret_rules``; an interpreter that knows the group (palladium.interpret)
registers the returned implementations without importing this package by name. Each
implementation is a JAX function of the equation's operands (refs stay refs) and
parameters, which the interpreter traces and evaluates in place:

* ``palladium_emit_pipeline`` expands into the regular (inlined) emitter, the same code
  the Mosaic lowering and the discharge rule use;
* ``palladium_pipeline_body`` evaluates the body jaxpr on the block refs. A block ref is
  a buffer slot (a ref with transforms, ``ref.at[slot]``); binding the body's state
  primitives on such a ref directly is not possible, so each of them is re-bound on the
  base ref with the block's transforms composed in front of its own.

Nothing here imports an interpreter.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline.errors import PipelineNotImplementedError
from palladium.pipeline.primitive import (
    _expand,
    _unflatten_refs,
    emit_pipeline_p,
    pipeline_body_p,
)


def interpret_rules() -> dict[Any, Callable[..., Any]]:
    """``{primitive: JAX implementation}`` of the pipeline's primitives, for interpreters
    (the entry point adds jax's own: :func:`palladium.pipeline.jax_primitive.interpret_rules`)."""
    return {emit_pipeline_p: _expand, pipeline_body_p: run_pipeline_body}


def run_pipeline_body(*args: Any, jaxpr: Any, num_consts: int, num_scalars: int,
                      refs_tree: Any) -> list[Any]:
    """Evaluate one step of the pipeline body: the body jaxpr on the (transformed) block refs."""
    head = num_consts + num_scalars
    refs = _unflatten_refs(refs_tree, args[head:])
    eval_with_transformed_refs(jaxpr, [*args[:head], *refs])
    return []


def _base(ref: Any) -> tuple[Any, tuple[Any, ...]]:
    """``(base ref, all transforms)`` of a possibly nested transformed ref."""
    transforms: tuple[Any, ...] = ()
    while isinstance(ref, jc.TransformedRef):
        transforms = (*ref.transforms, *transforms)
        ref = ref.ref
    return ref, transforms


def _compose(ref: Any, transforms: Sequence[Any]) -> tuple[Any, list[Any], Any]:
    base, own = _base(ref)
    flat, tree = jax.tree.flatten((*own, *transforms))
    return base, flat, tree


def _get(eqn: Any, invals: list[Any]) -> list[Any]:
    ref, *idx = invals
    base, flat, tree = _compose(ref, eqn.params["tree"].unflatten(idx))
    return [jc.get_p.bind(base, *flat, **{**eqn.params, "tree": tree})]


def _update(eqn: Any, invals: list[Any]) -> list[Any]:
    ref, val, *idx = invals
    base, flat, tree = _compose(ref, eqn.params["tree"].unflatten(idx))
    out = eqn.primitive.bind(base, val, *flat, **{**eqn.params, "tree": tree})
    return list(out) if eqn.primitive.multiple_results else [out]


def _nested_pipeline(eqn: Any, invals: list[Any]) -> list[Any]:
    config = eqn.params["config"]
    parts = config.split(invals)
    refs = config.refs_tree.unflatten(parts["refs"])
    refs = jax.tree.map(_normalized, refs, is_leaf=lambda x: isinstance(x, jc.TransformedRef))
    leaves, tree = jc.ref_tree_flatten(*refs)
    head = len(invals) - config.num_ref_leaves
    new = dataclasses.replace(config, refs_tree=tree, num_ref_leaves=len(leaves))
    return list(emit_pipeline_p.bind(*invals[:head], *leaves, config=new))


def _normalized(ref: Any) -> Any:
    base, transforms = _base(ref)
    return jc.TransformedRef(base, transforms) if transforms else base


def _dma(eqn: Any, invals: list[Any]) -> list[Any]:
    operands = [_normalized(x) for x in jc.dma_unflatten(eqn.params["tree"], invals)]
    flat, tree = jc.dma_flatten(*operands)
    out = eqn.primitive.bind(*flat, **{**eqn.params, "tree": tree})
    return list(out) if eqn.primitive.multiple_results else [out]


def _run_scoped(eqn: Any, invals: list[Any]) -> list[Any]:
    """Re-traced with the outer (transformed) refs closed over, as ``pl.run_scoped`` does."""
    jaxpr = eqn.params["jaxpr"]

    def scoped(*allocations: Any) -> list[Any]:
        return eval_with_transformed_refs(jaxpr, [*invals, *allocations])

    with jc.mutable_array_checks(False):
        new, _, consts = jc.trace_to_jaxpr_dynamic(
            jc.wrap_init(scoped, debug_info=jaxpr.debug_info), [v.aval for v in jaxpr.invars])
    return list(jc.run_scoped_p.bind(*consts, **{**eqn.params, "jaxpr": new}))


def _closed(closed: Any, args: Sequence[Any]) -> list[Any]:
    return eval_with_transformed_refs(closed.jaxpr, [*closed.consts, *args])


# Control flow over a block ref: re-expressed with lax's own control flow, the branches
# and bodies closing over the (transformed) refs and evaluated by this evaluator.
def _cond(eqn: Any, invals: list[Any]) -> list[Any]:
    index, *ops = invals
    branches = [functools.partial(_closed, b, ops) for b in eqn.params["branches"]]
    return list(jax.lax.switch(index, branches))


def _while(eqn: Any, invals: list[Any]) -> list[Any]:
    p = eqn.params
    cond_consts = invals[:p["cond_nconsts"]]
    body_consts = invals[p["cond_nconsts"]:p["cond_nconsts"] + p["body_nconsts"]]
    carry = invals[p["cond_nconsts"] + p["body_nconsts"]:]
    return list(jax.lax.while_loop(
        lambda c: _closed(p["cond_jaxpr"], [*cond_consts, *c])[0],
        lambda c: _closed(p["body_jaxpr"], [*body_consts, *c]),
        carry))


def _scan(eqn: Any, invals: list[Any]) -> list[Any]:
    p = eqn.params
    consts = invals[:p["num_consts"]]
    carry = invals[p["num_consts"]:p["num_consts"] + p["num_carry"]]
    xs = invals[p["num_consts"] + p["num_carry"]:]

    def step(c, x):
        out = _closed(p["jaxpr"], [*consts, *c, *x])
        return out[:len(c)], out[len(c):]

    carry, ys = jax.lax.scan(step, carry, xs, length=p["length"], reverse=p["reverse"],
                             unroll=p["unroll"])
    return [*carry, *ys]


def _inline_call(eqn: Any, invals: list[Any]) -> list[Any]:
    jaxpr = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    return _closed(jaxpr, invals)


# Primitives that may see a block ref (a ref with transforms) as an operand.
_TRANSFORMED_REF_RULES: dict[Any, Callable[[Any, list[Any]], list[Any]]] = {
    jc.get_p: _get,
    jc.swap_p: _update,
    jc.addupdate_p: _update,
    emit_pipeline_p: _nested_pipeline,
    jc.dma_start_p: _dma,
    jc.dma_wait_p: _dma,
    jc.run_scoped_p: _run_scoped,
    jc.cond_p: _cond,
    jc.while_p: _while,
    jc.scan_p: _scan,
    jc.jit_p: _inline_call,
    jc.closed_call_p: _inline_call,
}


def eval_with_transformed_refs(jaxpr: Any, args: Sequence[Any]) -> list[Any]:
    """Evaluate ``jaxpr`` on ``args`` (its constvars' values, then its invars'), some of
    which may be transformed refs.

    Equations without a transformed operand are bound as they are (like
    ``jax.core.eval_jaxpr``, under the equation's source info, so that errors and race
    reports still name the user's line); loads, stores and DMAs of a transformed ref and
    nested pipelines over one are re-bound on its base ref; control flow and
    ``run_scoped`` over one are re-traced with the refs closed over. Any other primitive applied
    to a block ref raises :class:`PipelineNotImplementedError` naming the primitive.
    """
    env: dict[Any, Any] = dict(zip([*jaxpr.constvars, *jaxpr.invars], args, strict=True))

    def read(atom: Any) -> Any:
        return atom.val if isinstance(atom, jc.Literal) else env[atom]

    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        with jc.equation_context(eqn):
            if any(isinstance(x, jc.TransformedRef) for x in invals):
                rule = _TRANSFORMED_REF_RULES.get(eqn.primitive)
                if rule is None:
                    raise PipelineNotImplementedError(
                        f"emit_pipeline primitive under an interpreter: {eqn.primitive} on a"
                        " pipeline block ref is not supported; use use_primitive=False")
                outs = rule(eqn, invals)
            else:
                outs = jc.bind_equation(eqn, invals)
        for var, val in zip(eqn.outvars, outs, strict=True):
            if not isinstance(var, jc.DropVar):
                env[var] = val
    return [read(v) for v in jaxpr.outvars]
