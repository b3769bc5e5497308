"""Interpreter rules brought by other distributions through an entry point.

A distribution that brings its own primitives (palladium-pipeline's ``emit_pipeline``
primitive path, for one) declares, in its ``pyproject.toml``::

    [project.entry-points."palladium.interpret_rules"]
    my_package = "my_package.module:interpret_rules"

where ``interpret_rules()`` returns ``{primitive: rule}`` (a key may also be a primitive's
name, for a primitive the provider cannot import: it is registered for the primitive of
that name when the interpreter first meets one); each rule is registered with
:func:`palladium.interpret.register_interpret_rule`. The providing package never
imports palladium.interpret, and palladium.interpret never imports it by name: a rule
is plain Python and jax objects, in one of two forms.

**A JAX implementation** -- a callable ``impl(*operands, **params)`` (or
``("trace", impl)``) written with ordinary jax and Pallas operations. The interpreter
traces it once per equation with the equation's input types (refs stay refs) and
evaluates the traced jaxpr in place of the equation; it returns the primitive's result
(a list when ``primitive.multiple_results``)::

    {double_p: lambda x: x * 2}

**An evaluation** -- ``("evaluate", fn)``. ``fn(*operands, **params)`` *declares* what
an equation of the primitive evaluates; it is called once per equation, with the
equation's input variables (jax ``Var``/``Literal`` objects) standing for the operands,
which it places without looking into them. It returns ``(closed_jaxpr, args)``: a
``jax.extend.core.ClosedJaxpr`` (an open ``Jaxpr`` without constvars is accepted too)
whose results are the equation's, and one argument per input of it. An argument is an
operand; a ref with transforms around an operand, ``TransformedRef(operand,
transforms)`` as jax's ``ref.at[...]``, ``ref.bitcast``, ``ref.reshape`` make them
(indexers, bitcasts, reshapes, transposes), where an index of a transform may be an
operand too (a buffer slot); or a constant. Each time the equation runs, the
interpreter puts the operands' values in those places and evaluates the jaxpr with its
own rules -- loads, stores and DMAs through the transforms, its control flow, race
detection and error sites (an error names the jaxpr equation's source line). Nothing
is traced and no transform object is built per run, so a primitive that runs a jaxpr
it carries (a pipeline body over a buffer slot) costs what the jaxpr's equations cost.
A declaration may have a third element, ``(indices, sizes)`` (operands or ints, one
per grid axis): within the jaxpr, ``pl.program_id`` and ``pl.num_programs`` answer
that grid, also inside its control flow (jax's ``emit_pipeline`` primitive's body sees
its pipeline's grid so)::

    # body_p was bound as body_p.bind(*consts, *leaves, jaxpr=..., num_consts=...,
    # refs_tree=tree) with leaves, tree = jax.tree.flatten(block_refs): block refs with
    # transforms (``buffer.at[slot]``) flattened into the base refs and the index values;
    # the rule unflattens the equation's variables for those into the same refs.
    def run_body(*operands, jaxpr, num_consts, refs_tree):
        refs = jax.tree.leaves(refs_tree.unflatten(operands[num_consts:]),
                               is_leaf=lambda x: isinstance(x, TransformedRef))
        return jax.extend.core.ClosedJaxpr(jaxpr, ()), [*operands[:num_consts], *refs]

    {body_p: ("evaluate", run_body)}

When: every entry point of the group is loaded once, when ``palladium.interpret`` is
imported (after the built-in rules, so a plugin may override one). A plugin installed
later in the same process is picked up by calling :func:`load_entry_point_rules`.

A broken entry point (it fails to import, raises, or returns something that is not a
mapping of primitives to callables) does not break the interpreter: it is skipped with
an :class:`InterpretRuleWarning` naming the entry point and the distribution.
"""

from __future__ import annotations

import importlib.metadata
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from palladium.interpret.eval.registry import (
    register_interpret_rule,
    register_interpret_rule_by_name,
)

#: The entry-point group palladium.interpret loads rules from.
ENTRY_POINT_GROUP = "palladium.interpret_rules"


class InterpretRuleWarning(UserWarning):
    """An interpreter-rule entry point could not be loaded (it was skipped)."""


def _describe(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    dist_name = getattr(dist, "name", None) if dist is not None else None
    where = f" (distribution {dist_name!r})" if dist_name else ""
    return f"entry point {ep.name!r} = {ep.value!r} of group {ENTRY_POINT_GROUP!r}{where}"


def rule_form(rule: Any) -> tuple[str, Callable[..., Any]] | None:
    """``(form, callable)`` of a plugin's rule (a callable, ``("trace", impl)`` or
    ``("evaluate", fn)``), or None if it is none of these."""
    if callable(rule):
        return "trace", rule
    if (isinstance(rule, tuple) and len(rule) == 2 and rule[0] in ("trace", "evaluate")
            and callable(rule[1])):
        return rule[0], rule[1]
    return None


def _rules_of(ep: Any) -> dict[Any, tuple[str, Callable[..., Any]]]:
    provider = ep.load()
    rules = provider()
    if not isinstance(rules, Mapping):
        raise TypeError(f"it returned {type(rules).__name__}, not a mapping of primitives to rules")
    out = {}
    for primitive, rule in rules.items():
        form = rule_form(rule)
        if not (hasattr(primitive, "bind") or isinstance(primitive, str)) or form is None:
            raise TypeError(f"it maps {primitive!r} to {rule!r}: expected primitive (or "
                            "primitive name) -> callable, ('trace', callable) or "
                            "('evaluate', callable)")
        out[primitive] = form
    return out


def load_entry_point_rules(entry_points: Iterable[Any] | None = None) -> list[str]:
    """Register the rules of every ``palladium.interpret_rules`` entry point.

    Returns the names of the entry points loaded. A broken one is skipped with an
    :class:`InterpretRuleWarning`. ``entry_points`` defaults to the installed ones.
    """
    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    loaded = []
    for ep in entry_points:
        try:
            rules = _rules_of(ep)
        except Exception as e:  # noqa: BLE001 - a plugin must not break the interpreter
            warnings.warn(
                f"palladium.interpret: skipped {_describe(ep)}: {type(e).__name__}: {e}",
                InterpretRuleWarning,
                stacklevel=2,
            )
            continue
        for primitive, (form, impl) in rules.items():
            if isinstance(primitive, str):
                register_interpret_rule_by_name(primitive, impl, form=form)
            else:
                register_interpret_rule(primitive, impl, form=form)
        loaded.append(ep.name)
    return loaded
