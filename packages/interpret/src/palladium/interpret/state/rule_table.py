"""The table of interpreter rules (primitive -> rule), one instance per process
(``process_state.STATE.rules``); ``registry`` has the decorators that fill it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (the rules' types: the evaluator's, a layer above)
    from palladium.interpret.eval.context import Equation, KernelContext, Value

__all__ = ["Rule", "RuleCompiler", "RuleRegistry", "RuleSnapshot"]

# rule(context, eqn, invals) -> list of output values (the context is all a rule sees)
Rule = Callable[["KernelContext", "Equation", list["Value"]], list["Value"]]
# compiler(eqn, used variables) -> a rule specialised to that one equation
RuleCompiler = Callable[["Equation", frozenset[Any]], Rule]


class RuleRegistry:
    """Primitive -> rule. ``version`` changes whenever a rule is (re)registered.

    A primitive has a rule in one of two forms: a plain rule, or a *rule compiler*,
    which the evaluator calls once per equation (when it compiles the jaxpr) to get the
    rule of that equation: static operands resolved, a per-equation cache (the ref
    accesses, ``primitive_groups.ACCESS_PRIMITIVES``). Registering a plain rule for a
    primitive replaces its compiler (a plugin's rule for a built-in primitive); the
    built-in table never holds both for one primitive (tested).
    """

    def __init__(self) -> None:
        self._rules: dict[Any, Rule] = {}
        self._compilers: dict[Any, RuleCompiler] = {}
        # Primitives taught by register_interpret_rule (not jax's): the lowering check
        # cannot tell whether a TPU build registers a Mosaic rule for them.
        self.external: set[Any] = set()
        self._lock = threading.Lock()
        self.version = 0
        # Primitive name -> (form, rule as a plugin gives it: "trace" and a JAX
        # implementation, or "evaluate" and what to evaluate), for primitives a plugin
        # may not import (jax's own emit_pipeline): registered for the primitive of that
        # name when an equation of it is first compiled (see
        # ``register_interpret_rule_by_name``).
        self.by_name: dict[str, tuple[str, Any]] = {}

    def register(self, primitive: Any, rule: Rule) -> None:
        with self._lock:
            self._rules[primitive] = rule
            self._compilers.pop(primitive, None)
            self.version += 1

    def register_compiler(self, primitive: Any, compiler: RuleCompiler) -> None:
        """``compiler`` makes the rule of each equation of ``primitive`` (its one rule:
        register no plain rule for it beside)."""
        with self._lock:
            self._compilers[primitive] = compiler
            self.version += 1

    def get(self, primitive: Any) -> Rule | None:
        return self._rules.get(primitive)

    def compiler(self, primitive: Any) -> RuleCompiler | None:
        return self._compilers.get(primitive)

    def __contains__(self, primitive: Any) -> bool:
        return primitive in self._rules

    def snapshot(self) -> RuleSnapshot:
        """The table as it is now (``restore`` puts it back)."""
        with self._lock:
            return RuleSnapshot(dict(self._rules), dict(self._compilers),
                                frozenset(self.external))

    def restore(self, snap: RuleSnapshot) -> None:
        """Put back the table of ``snap``; programs compiled since re-compile (the
        version changes)."""
        with self._lock:
            self._rules = dict(snap.rules)
            self._compilers = dict(snap.compilers)
            self.external = set(snap.external)
            self.version += 1


class RuleSnapshot:
    """A copy of a :class:`RuleRegistry`'s table."""

    __slots__ = ("compilers", "external", "rules")

    def __init__(self, rules: dict[Any, Rule], compilers: dict[Any, RuleCompiler],
                 external: frozenset[Any]) -> None:
        self.rules = rules
        self.compilers = compilers
        self.external = external
