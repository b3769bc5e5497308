"""The registry of the approximation's rules (what the TPU compiler rejects after jax's
Mosaic lowering accepted a kernel) and the walk that applies them.

As the evaluator's rule table: one small function per rule, registered for the
primitives it looks at (:func:`rule`) or for the whole kernel (:func:`kernel_rule`),
each returning what the compiler would say, or None. The rules are in
``approx_rules`` (values: dtypes per operation, reshapes, the MXU, the grid) and
``approx_access`` (ref accesses: strides, alignment, offsets); their facts per chip are
``palladium.interpret.chip.CompilerFacts``. :func:`first_violation` walks the kernel's
equations (nested jaxprs included) and returns the first message; the lowering check
raises it as ``TpuLoweringError`` at the equation's kernel line.

Every rule is conservative: it rejects only what the compiler rejected on that chip in
``benchmarks/compiler_agreement.py``'s corpus; when unsure, it accepts. Chips without
measured facts get no rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.chip import CompilerFacts, chip_record
from palladium.interpret.eval.jaxprs import jaxprs_in
from palladium.interpret.kernel.prepared_kernel import PreparedKernel

__all__ = ["KernelRule", "Rule", "Site", "Violation", "dtype_name", "first_violation",
           "kernel_rule", "rank", "rule"]


@dataclasses.dataclass(frozen=True)
class Site:
    """One equation as a rule sees it: the chip, its facts, and the equations that
    produced its operands (followed into nested ``jit`` jaxprs)."""

    eqn: Any
    chip: str
    facts: CompilerFacts
    producers: dict[Any, Any]

    def producer(self, var: Any) -> Any | None:
        """The equation that computed ``var``, when the walk saw it."""
        return self.producers.get(var) if isinstance(var, jc.Var) else None


@dataclasses.dataclass(frozen=True)
class Violation:
    """The first rule a kernel breaks: the equation (None for a kernel-wide rule), what
    the compiler says, and the rule's name."""

    eqn: Any | None
    message: str
    rule: str


Rule = Callable[[Site], "str | None"]
KernelRule = Callable[[PreparedKernel, str, CompilerFacts], "str | None"]

_RULES: dict[str, list[Rule]] = {}
_KERNEL_RULES: list[KernelRule] = []


def rule(*primitives: str) -> Callable[[Rule], Rule]:
    """Register a rule for the equations of these primitives (by name)."""

    def register(fn: Rule) -> Rule:
        for name in primitives:
            _RULES.setdefault(name, []).append(fn)
        return fn

    return register


def kernel_rule(fn: KernelRule) -> KernelRule:
    """Register a rule over the whole kernel (its grid, operands, compiler params)."""
    _KERNEL_RULES.append(fn)
    return fn


def first_violation(kernel: PreparedKernel, chip: str) -> Violation | None:
    """The first rule ``kernel`` breaks on ``chip``, or None."""
    facts = chip_record(chip).compiler
    if facts is None:
        return None
    for krule in _KERNEL_RULES:
        message = krule(kernel, chip, facts)
        if message is not None:
            return Violation(None, message, krule.__name__)
    producers: dict[Any, Any] = {}
    for eqn in _walk(kernel.jaxpr, producers):
        for fn in _RULES.get(eqn.primitive.name, ()):
            message = fn(Site(eqn, chip, facts, producers))
            if message is not None:
                return Violation(eqn, message, fn.__name__)
    return None


def _walk(jaxpr: Any, producers: dict[Any, Any]) -> Iterator[Any]:
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            producers[var] = eqn
        inner = eqn.params.get("jaxpr")
        if eqn.primitive is jc.jit_p and inner is not None:
            # A jit's operands are its jaxpr's inputs: follow them in (jnp.where is one).
            body = inner.jaxpr if isinstance(inner, jc.ClosedJaxpr) else inner
            for outer, var in zip(eqn.invars, body.invars):
                if isinstance(outer, jc.Var) and outer in producers:
                    producers[var] = producers[outer]
        yield eqn
        for value in eqn.params.values():
            for sub in jaxprs_in(value):
                yield from _walk(sub, producers)


def dtype_name(var: Any) -> str | None:
    """The numpy name of ``var``'s element type (None for refs, semaphores, tokens)."""
    try:
        return np.dtype(var.aval.dtype).name
    except (AttributeError, TypeError):
        return None


def rank(var: Any) -> int:
    """``var``'s rank (0 for scalars)."""
    return len(getattr(var.aval, "shape", ()))
