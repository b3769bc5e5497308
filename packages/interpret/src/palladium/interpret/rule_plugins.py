"""Interpreter rules brought by other distributions through an entry point.

A distribution that brings its own primitives (palladium-pipeline's ``emit_pipeline``
primitive path, for one) declares, in its ``pyproject.toml``::

    [project.entry-points."palladium.interpret_rules"]
    my_package = "my_package.module:interpret_rules"

where ``interpret_rules()`` returns ``{primitive: impl}`` (a key may also be a primitive's
name, for a primitive the provider cannot import: it is registered for the primitive of
that name when the interpreter first meets one); each ``impl`` is registered
with :func:`palladium.interpret.register_interpret_rule` (a JAX implementation traced
with the equation's input types and evaluated in place). The providing package never
imports palladium.interpret, and palladium.interpret never imports it by name.

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


def _rules_of(ep: Any) -> Mapping[Any, Callable[..., Any]]:
    provider = ep.load()
    rules = provider()
    if not isinstance(rules, Mapping):
        raise TypeError(f"it returned {type(rules).__name__}, not a mapping of primitives to rules")
    for primitive, impl in rules.items():
        if not (hasattr(primitive, "bind") or isinstance(primitive, str)) or not callable(impl):
            raise TypeError(f"it maps {primitive!r} to {impl!r}: expected primitive (or "
                            "primitive name) -> callable")
    return rules


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
        for primitive, impl in rules.items():
            if isinstance(primitive, str):
                register_interpret_rule_by_name(primitive, impl)
            else:
                register_interpret_rule(primitive, impl)
        loaded.append(ep.name)
    return loaded
