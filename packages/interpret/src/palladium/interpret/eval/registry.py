"""The table of interpreter rules: one function per primitive, registered by decorator."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.context import Equation, KernelContext, Value

# rule(context, eqn, invals) -> list of output values (the context is all a rule sees)
Rule = Callable[[KernelContext, Equation, list[Value]], list[Value]]
# compiler(eqn, used variables) -> a rule specialised to that one equation
RuleCompiler = Callable[[Equation, frozenset[Any]], Rule]


class RuleRegistry:
    """Primitive -> rule. ``version`` changes whenever a rule is (re)registered.

    A primitive may also have a *rule compiler*, which the evaluator calls once per
    equation (when it compiles the jaxpr) to get a rule specialised to that equation:
    static operands resolved, a per-equation cache. Registering a plain rule for the
    primitive later replaces its compiler.
    """

    def __init__(self) -> None:
        self._rules: dict[Any, Rule] = {}
        self._compilers: dict[Any, RuleCompiler] = {}
        # Primitives taught by register_interpret_rule (not jax's): the lowering check
        # cannot tell whether a TPU build registers a Mosaic rule for them.
        self.external: set[Any] = set()
        self._lock = threading.Lock()
        self.version = 0

    def register(self, primitive: Any, rule: Rule) -> None:
        with self._lock:
            self._rules[primitive] = rule
            self._compilers.pop(primitive, None)
            self.version += 1

    def register_compiler(self, primitive: Any, compiler: RuleCompiler) -> None:
        """Specialise ``primitive``'s equations with ``compiler`` (its rule stays the
        reference behaviour, registered alongside)."""
        with self._lock:
            self._compilers[primitive] = compiler
            self.version += 1

    def get(self, primitive: Any) -> Rule | None:
        return self._rules.get(primitive)

    def compiler(self, primitive: Any) -> RuleCompiler | None:
        return self._compilers.get(primitive)

    def __contains__(self, primitive: Any) -> bool:
        return primitive in self._rules


RULES = RuleRegistry()


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


def register_interpret_rule(primitive: jc.Primitive, impl: Callable[..., Any]) -> None:
    """Teach the interpreter a primitive it does not know (e.g. one with a Mosaic lowering).

    ``impl(*args, **params)`` is a JAX implementation of the primitive written with
    ordinary jax and Pallas operations (ref reads/writes, DMAs, semaphores, ...): the
    interpreter traces it once per (params, input types) with the equation's input
    types and evaluates the traced jaxpr in place of the equation. ``args`` are the
    equation's operands (refs stay refs); ``params`` are its parameters. It returns
    the primitive's result (a list when ``primitive.multiple_results``).

    Example::

        double_p = jax.extend.core.Primitive("double")
        register_interpret_rule(double_p, lambda x: x * 2)
    """
    from palladium.interpret.eval.traced_rule import traced_rule

    RULES.register(primitive, traced_rule(primitive, impl))
    RULES.external.add(primitive)
