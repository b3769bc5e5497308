"""Interpreter rules for the ``emit_pipeline`` primitives (entry point for interpreters).

``palladium-pipeline`` declares :func:`interpret_rules` in the entry-point group
``palladium.interpret_rules``; an interpreter that knows the group (palladium.interpret)
registers the returned rules without importing this package by name. The protocol
(``palladium.interpret.rule_plugins``) knows two forms, and this package uses both:

* ``palladium_emit_pipeline``: a JAX implementation, traced by the interpreter: the
  regular (inlined) emitter, the same code the Mosaic lowering and the discharge rule
  use (:func:`palladium.pipeline.primitive.expand`);
* ``palladium_pipeline_body``: an *evaluation* (``("evaluate", fn)``): the body jaxpr on
  the block refs, each a buffer slot -- a base ref with transforms (``ref.at[slot]``,
  jax's ``TransformedRef``). :func:`pipeline_body_evaluation` only declares it, once per
  equation (its operands are the equation's variables then); the interpreter evaluates
  the jaxpr with its own rules (loads, stores and DMAs through the transforms, its
  control flow, race detection, error sites).

Nothing here imports an interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline.primitive import (
    emit_pipeline_p,
    expand,
    pipeline_body_p,
    unflatten_refs,
)

#: The form of a rule the interpreter evaluates rather than traces (the protocol's tag).
EVALUATE = "evaluate"


def interpret_rules() -> dict[Any, Callable[..., Any] | tuple[str, Callable[..., Any]]]:
    """``{primitive: rule}`` of the pipeline's primitives, for interpreters (the entry
    point adds jax's own: :func:`palladium.pipeline.jax_primitive.interpret_rules`)."""
    return {emit_pipeline_p: expand, pipeline_body_p: (EVALUATE, pipeline_body_evaluation)}


def pipeline_body_evaluation(*operands: Any, jaxpr: Any, num_consts: int, num_scalars: int,
                             refs_tree: Any, grid: tuple[int | None, ...] | None = None,
                             ) -> tuple[Any, ...]:
    """What one step of the pipeline body evaluates: the body jaxpr on its constants,
    the step's scalars and the block refs (buffer slots: base refs with transforms).

    With ``grid`` (jax's ``emit_pipeline`` primitive: its sizes, None where dynamic),
    the step's scalars are the step indices then the dynamic sizes, and the body's
    ``pl.program_id`` / ``pl.num_programs`` answer them (the declaration's grid)."""
    head = num_consts + num_scalars
    refs = unflatten_refs(refs_tree, operands[head:])
    closed, args = jc.ClosedJaxpr(jaxpr, ()), [*operands[:head], *refs]
    if grid is None:
        return closed, args
    scalars = operands[num_consts:head]
    dynamic = iter(scalars[len(grid):])
    sizes = tuple(next(dynamic) if g is None else g for g in grid)
    return closed, args, (tuple(scalars[:len(grid)]), sizes)
