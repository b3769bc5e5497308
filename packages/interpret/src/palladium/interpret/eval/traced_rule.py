"""Interpreter rules given as JAX implementations (``register_interpret_rule``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.context import Equation, KernelContext, Value


def traced_rule(primitive: Any, impl: Callable[..., Any]) -> Callable[[Any, Any, list[Any]], list[Any]]:
    """A rule that traces ``impl`` once per equation and evaluates the traced jaxpr."""
    traced: dict[int, tuple[Any, Any]] = {}

    def rule(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        hit = traced.get(id(eqn))
        if hit is None or hit[0] is not eqn:
            params = dict(eqn.params)

            def flat(*args: Any) -> list[Any]:
                out = impl(*args, **params)
                return list(out) if primitive.multiple_results else [out]

            closed = jc.trace_to_closed_jaxpr(
                flat, [v.aval for v in eqn.invars], f"palladium rule for {primitive}"
            )
            hit = (eqn, closed)
            traced[id(eqn)] = hit
        return ev.eval_closed(hit[1], invals)

    return rule
