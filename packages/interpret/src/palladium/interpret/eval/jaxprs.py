"""The jaxprs nested in an equation: one walker for every pass that looks inside loops,
conds, calls and kernels' bodies (segments, their race log, the kernel checks, fidelity)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from palladium.interpret import _jax_compat as jc

__all__ = ["any_equation", "evaluate", "jaxprs_in", "nested_jaxprs"]


def jaxprs_in(value: Any) -> list[Any]:
    """The (open) jaxprs held by an equation parameter's ``value``: a closed or open
    jaxpr, or a tuple or list of them at any depth; none for anything else."""
    if isinstance(value, jc.ClosedJaxpr):
        return [value.jaxpr]
    if isinstance(value, jc.Jaxpr):
        return [value]
    if isinstance(value, tuple | list):
        return [j for v in value for j in jaxprs_in(v)]
    return []


def nested_jaxprs(eqn: Any) -> list[Any]:
    """Every (open) jaxpr in ``eqn``'s parameters, in parameter order."""
    return [j for value in eqn.params.values() for j in jaxprs_in(value)]


def any_equation(jaxpr: Any, test: Callable[[Any], bool]) -> bool:
    """Whether ``test`` holds for an equation of ``jaxpr`` (closed or open) at any depth."""
    return any(test(eqn) or any(any_equation(j, test) for j in nested_jaxprs(eqn))
               for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns)


def evaluate(jaxpr: Any, consts: Any, args: Any,
             equation: Callable[[Any, list[Any]], list[Any]]) -> list[Any]:
    """Walk ``jaxpr`` (closed or open) in order: ``equation(eqn, operand values)`` gives
    each equation's results; the jaxpr's results. The one walk of the passes that trace
    a jaxpr with values of their own (compiled segments, compiled launches)."""
    if isinstance(jaxpr, jc.ClosedJaxpr):
        consts = [*jaxpr.consts, *consts]
        jaxpr = jaxpr.jaxpr
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))

    def read(atom: Any) -> Any:
        return atom.val if isinstance(atom, jc.Literal) else env[atom]

    for eqn in jaxpr.eqns:
        env.update(zip(eqn.outvars, equation(eqn, [read(a) for a in eqn.invars])))
    return [read(a) for a in jaxpr.outvars]
