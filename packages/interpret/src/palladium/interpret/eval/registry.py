"""The table of interpreter rules: one function per primitive, registered by decorator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from palladium.interpret import _jax_compat as jc
from palladium.interpret.state.process_state import STATE
from palladium.interpret.state.rule_table import Rule, RuleCompiler, RuleRegistry

__all__ = ["RULES", "Rule", "RuleCompiler", "RuleRegistry", "register_interpret_rule", "rule",
           "rule_compiler"]

# The process's rule table (built-in rules register here at import).
RULES = STATE.rules


def rule(*primitives: Any) -> Callable[[Rule], Rule]:
    """Decorator: register the function as the interpreter rule of ``primitives``."""

    def decorator(fn: Rule) -> Rule:
        for p in primitives:
            if p is not None:
                RULES.register(p, fn)
        return fn

    return decorator


def rule_compiler(*primitives: Any) -> Callable[[RuleCompiler], RuleCompiler]:
    """Decorator: register the function as the rule compiler of ``primitives``."""

    def decorator(fn: RuleCompiler) -> RuleCompiler:
        for p in primitives:
            if p is not None:
                RULES.register_compiler(p, fn)
        return fn

    return decorator


def register_interpret_rule_by_name(name: str, impl: Callable[..., Any],
                                    form: str = "trace") -> None:
    """:func:`register_interpret_rule` for the primitive named ``name``, done when the
    interpreter first meets an equation of it: for a primitive its provider cannot import
    (palladium-pipeline's rule for jax's own ``emit_pipeline``, whose module palladium
    does not import). A rule registered for the primitive itself wins."""
    _check_form(form)
    RULES.by_name[name] = (form, impl)
    RULES.version += 1


def rule_by_name(primitive: Any) -> Rule | None:
    """The rule registered by name for ``primitive`` (registered for it now), or None."""
    entry = RULES.by_name.get(str(primitive))
    if entry is None:
        return None
    form, impl = entry
    register_interpret_rule(primitive, impl, form=form)
    return RULES.get(primitive)


_FORMS = ("trace", "evaluate")


def _check_form(form: str) -> None:
    if form not in _FORMS:
        raise ValueError(f"form={form!r}: an interpreter rule is given as 'trace' (a JAX "
                         "implementation) or 'evaluate' (what to evaluate)")


def register_interpret_rule(primitive: jc.Primitive, impl: Callable[..., Any], *,
                            form: str = "trace") -> None:
    """Teach the interpreter a primitive it does not know (e.g. one with a Mosaic lowering).

    ``form="trace"`` (the default): ``impl(*args, **params)`` is a JAX implementation of
    the primitive written with ordinary jax and Pallas operations (ref reads/writes,
    DMAs, semaphores, ...): the interpreter traces it once per (params, input types)
    with the equation's input types and evaluates the traced jaxpr in place of the
    equation. ``args`` are the equation's operands (refs stay refs); ``params`` are its
    parameters. It returns the primitive's result (a list when
    ``primitive.multiple_results``).

    ``form="evaluate"``: ``impl(*operands, **params)`` declares what an equation of the
    primitive evaluates; it is called once per equation with the equation's variables
    standing for the operands and returns ``(closed_jaxpr, args)``: each run, the
    interpreter evaluates ``closed_jaxpr`` on ``args`` (the operands' values in their
    places) with its own rules, and its results are the equation's. An argument is an
    operand, or a ref with transforms around one (jax's ``TransformedRef(operand,
    transforms)``, e.g. ``ref.at[slot]``; the transforms' indices may be operands too).
    See :mod:`palladium.interpret.rule_plugins` for the protocol.

    Example::

        double_p = jax.extend.core.Primitive("double")
        register_interpret_rule(double_p, lambda x: x * 2)
    """
    from palladium.interpret.eval.traced_rule import evaluation_rule, traced_rule

    _check_form(form)
    make = evaluation_rule if form == "evaluate" else traced_rule
    RULES.register(primitive, make(primitive, impl))
    RULES.external.add(primitive)
