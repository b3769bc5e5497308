"""The jaxprs nested in an equation: one walker for every pass that looks inside loops,
conds, calls and kernels' bodies (segments, their race log, the kernel checks, fidelity)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from palladium.interpret import _jax_compat as jc

__all__ = ["any_equation", "jaxprs_in", "nested_jaxprs"]


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
