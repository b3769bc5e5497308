"""Rules for control flow and calls: evaluated in Python, bodies by the same evaluator."""

from __future__ import annotations

from typing import Any

import jax.extend.core.primitives as jex_prims
import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.registry import rule


@rule(jc.cond_p)
def _cond(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    index, *args = invals
    branches = eqn.params["branches"]
    i = min(max(int(np.asarray(index)), 0), len(branches) - 1)  # lax.cond clamps
    return ev.eval_closed(branches[i], args)


@rule(jc.while_p)
def _while(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cond_consts, body_consts, carry = invals[:nc], invals[nc : nc + nb], invals[nc + nb :]
    cond_jaxpr, body_jaxpr = p["cond_jaxpr"], p["body_jaxpr"]
    tick, site = ev.sim.tick, ev.site(eqn)
    while bool(np.asarray(ev.eval_closed(cond_jaxpr, [*cond_consts, *carry])[0])):
        tick(site)  # the watchdog sees a loop that never ends
        carry = ev.eval_closed(body_jaxpr, [*body_consts, *carry])
    return carry


@rule(jc.scan_p)
def _scan(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    p = eqn.params
    n_consts, n_carry, length = p["num_consts"], p["num_carry"], p["length"]
    consts, carry, xs = invals[:n_consts], invals[n_consts : n_consts + n_carry], invals[n_consts + n_carry :]
    body = p["jaxpr"]
    y_avals = [v.aval for v in eqn.outvars[n_carry:]]
    ys: list[list[Any]] = [[] for _ in y_avals]
    steps = range(length - 1, -1, -1) if p["reverse"] else range(length)
    for i in steps:
        out = ev.eval_closed(body, [*consts, *carry, *(np.asarray(x)[i] for x in xs)])
        carry = out[:n_carry]
        for acc, y in zip(ys, out[n_carry:]):
            acc.append(y)
    if p["reverse"]:
        for acc in ys:
            acc.reverse()
    stacked = [
        np.stack([np.asarray(y, dtype=aval.dtype) for y in acc])
        if acc
        else np.zeros(aval.shape, aval.dtype)
        for acc, aval in zip(ys, y_avals)
    ]
    return [*carry, *stacked]


@rule(jc.jit_p)
def _jit(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    return ev.eval_closed(eqn.params["jaxpr"], invals)


@rule(jc.custom_jvp_call_p, jc.custom_vjp_call_p, jex_prims.closed_call_p)
def _call_jaxpr(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    return ev.eval_closed(eqn.params["call_jaxpr"], invals)


@rule(jex_prims.remat_p)
def _remat(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    return ev.eval_jaxpr(eqn.params["jaxpr"], [], invals)
