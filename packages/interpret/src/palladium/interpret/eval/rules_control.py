"""Rules for control flow and calls: evaluated in Python, bodies by the same evaluator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.extend.core.primitives as jex_prims
import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.float_steering import is_float_steered_loop
from palladium.interpret.eval.primitive_groups import CALLS
from palladium.interpret.eval.registry import Rule, rule, rule_compiler
from palladium.interpret.eval.segments import WHILE_GUESS


def _passthrough(branch: Any) -> list[tuple[bool, Any]] | None:
    """A branch without equations as its results read from its operands: per result
    (True, operand index) or (False, literal value); None for a branch with equations."""
    jaxpr = branch.jaxpr
    if jaxpr.eqns or jaxpr.constvars:
        return None
    where = {v: i for i, v in enumerate(jaxpr.invars)}
    out: list[tuple[bool, Any]] = []
    for v in jaxpr.outvars:
        if isinstance(v, jc.Literal):
            out.append((False, np.asarray(v.val, dtype=getattr(v.aval, "dtype", None))))
        elif v in where:
            out.append((True, where[v]))
        else:
            return None
    return out


@rule_compiler(jc.cond_p)
def _cond(eqn: Equation, used: frozenset[Any]) -> Rule:
    branches = eqn.params["branches"]
    last = len(branches) - 1
    # A branch that computes nothing (a ``pl.when`` not taken: most grid steps of a
    # kernel that initialises or finalises at its first or last step) is answered
    # without running an empty program.
    direct = [_passthrough(b) for b in branches]

    def run(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        index, *args = invals
        i = min(max(int(index), 0), last)  # lax.cond clamps
        results = direct[i]
        if results is not None:
            return [args[x] if operand else x for operand, x in results]
        return ev.eval_closed(branches[i], args)

    return run


def run_while(ev: KernelContext, eqn: Equation, invals: list[Value],
              check: Callable[[Value], None] | None = None) -> list[Value]:
    """A ``while`` loop, each value of its condition first handed to ``check`` (the
    shadow rules report a shadowed one)."""
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cond_consts, body_consts, carry = invals[:nc], invals[nc : nc + nb], invals[nc + nb :]
    cond_jaxpr, body_jaxpr = p["cond_jaxpr"], p["body_jaxpr"]
    tick, site = ev.sim.tick, ev.site(eqn)
    # Without float arithmetic a test that reads floats sees placeholders: the loop runs
    # WHILE_GUESS iterations (``predict`` says the prediction is uncertain there).
    limit = (WHILE_GUESS if ev.skip_floating_point_ops and is_float_steered_loop(eqn)
             else None)
    n = 0
    while limit is None or n < limit:
        pred = ev.eval_closed(cond_jaxpr, [*cond_consts, *carry])[0]
        if check is not None:
            check(pred)
        if not bool(np.asarray(pred)):
            break
        tick(site)  # the watchdog sees a loop that never ends
        carry = ev.eval_closed(body_jaxpr, [*body_consts, *carry])
        n += 1
    return carry


def run_scan(ev: KernelContext, eqn: Equation, invals: list[Value],
             index: Callable[[Value, int], Value] = lambda x, i: np.asarray(x)[i],
             stack: Callable[[list[Value], Any], Value] | None = None) -> list[Value]:
    """A ``scan``: ``index(x, i)`` slices an x, ``stack(ys, aval)`` stacks a y's values
    (the shadow rules keep the shadows of both)."""
    p = eqn.params
    n_consts, n_carry, length = p["num_consts"], p["num_carry"], p["length"]
    consts, carry, xs = invals[:n_consts], invals[n_consts : n_consts + n_carry], invals[n_consts + n_carry :]
    body = p["jaxpr"]
    y_avals = [v.aval for v in eqn.outvars[n_carry:]]
    ys: list[list[Any]] = [[] for _ in y_avals]
    steps = range(length - 1, -1, -1) if p["reverse"] else range(length)
    for i in steps:
        out = ev.eval_closed(body, [*consts, *carry, *(index(x, i) for x in xs)])
        carry = out[:n_carry]
        for acc, y in zip(ys, out[n_carry:]):
            acc.append(y)
    if p["reverse"]:
        for acc in ys:
            acc.reverse()
    stacked = [
        np.zeros(aval.shape, aval.dtype) if not acc
        else stack(acc, aval) if stack is not None
        else np.stack([np.asarray(y, dtype=aval.dtype) for y in acc])
        for acc, aval in zip(ys, y_avals)
    ]
    return [*carry, *stacked]


rule(jc.while_p)(run_while)
rule(jc.scan_p)(run_scan)



@rule(jc.jit_p)
def _jit(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    return ev.eval_closed(eqn.params["jaxpr"], invals)


@rule(*(p for p in CALLS if p is not jc.jit_p))
def _call_jaxpr(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    return ev.eval_closed(eqn.params["call_jaxpr"], invals)


# A call's body is evaluated on the call's operands and nothing else: ``program.py``
# inlines it into the calling program (the parameter naming the ClosedJaxpr), unless a
# plugin registered another rule for the primitive.
_jit.inlined_body = "jaxpr"  # type: ignore[attr-defined]
_call_jaxpr.inlined_body = "call_jaxpr"  # type: ignore[attr-defined]


@rule(jex_prims.remat_p)
def _remat(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    return ev.eval_jaxpr(eqn.params["jaxpr"], [], invals)
