"""Which control decisions of a kernel depend on floating-point values.

``InterpretParams(skip_floating_point_ops=True)`` (what ``predict`` runs under) computes no
float arithmetic: a float result is a placeholder (``inf``) and refs may hold no real
data. A ``while`` whose test reads floats (``while jnp.max(v) > 1``) then loops until
the watchdog, and a ``pl.when(x[0, 0] > 0.5)`` around DMAs takes whichever branch the
placeholder picks: the walk of the kernel is not the kernel's (issue 42, item 7).

:func:`float_steered` finds such decisions statically: every float value is taken as
unknown, and so is anything computed from one (a comparison, a conversion to an index);
a ``cond`` whose branch index, or a ``while`` whose test, is unknown is steered by
floats. A loop's carry is followed to a fixed point. Memoised per jaxpr.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.jaxprs import nested_jaxprs
from palladium.interpret.state.process_state import STATE

__all__ = ["SteeredDecision", "float_steered", "is_float_steered_loop"]

SteeredDecision = tuple[str, str]  # (what: "a while loop's test" / "a conditional", "file.py:line")

_MEMO: weakref.WeakKeyDictionary[Any, tuple[SteeredDecision, ...]] = STATE.keep(
    "float_steered_decisions", weakref.WeakKeyDictionary(), owner=__name__,
    holds="a jaxpr's float-steered decisions, kept weakly by the jaxpr")
# (per while equation's cond jaxpr: equations cannot be weakly referred to)
_LOOPS: weakref.WeakKeyDictionary[Any, bool] = STATE.keep(
    "float_steered_loops", weakref.WeakKeyDictionary(), owner=__name__,
    holds="whether a while loop's test is float-steered, kept weakly by its jaxpr")


def _is_float(atom: Any) -> bool:
    """Whether ``atom`` is a float value (a ref is not a value: what is read through it
    is, by its own type)."""
    aval = getattr(atom, "aval", None)
    if aval is None or hasattr(aval, "inner_aval"):
        return False
    try:
        return np.issubdtype(np.dtype(aval.dtype), np.inexact)
    except TypeError:  # (a semaphore's or another extended dtype)
        return False


def _line(eqn: Any) -> str:
    frame = jc.user_frame(eqn.source_info)
    return "?" if frame is None else f"{os.path.basename(frame[0])}:{frame[1]}"


def _inner(j: Any) -> Any:
    return getattr(j, "jaxpr", j)


def _walk(jaxpr: Any, unknown_in: list[bool], found: list[SteeredDecision]) -> list[bool]:
    """Which of ``jaxpr``'s results are unknown, given which inputs are; the float-steered
    decisions met go to ``found``."""
    jaxpr = _inner(jaxpr)
    unknown: set[Any] = {v for v, u in zip(jaxpr.invars, unknown_in) if u or _is_float(v)}
    unknown |= {v for v in jaxpr.constvars if _is_float(v)}

    def is_unknown(a: Any) -> bool:
        return not isinstance(a, jc.Literal) and (a in unknown or _is_float(a))

    for eqn in jaxpr.eqns:
        ins = [is_unknown(a) for a in eqn.invars]
        prim = eqn.primitive
        if prim is jc.while_p:
            outs, _ = _while(eqn, ins, found)
        elif prim is jc.cond_p:
            if ins[0]:
                found.append(("a conditional (pl.when, lax.cond)", _line(eqn)))
            outs = [False] * len(eqn.outvars)
            for branch in eqn.params["branches"]:
                got = _walk(branch, ins[1:], found)
                outs = [a or b or ins[0] for a, b in zip(outs, got)]
        else:
            inner = nested_jaxprs(eqn)
            if len(inner) == 1 and len(_inner(inner[0]).invars) == len(eqn.invars):
                outs = _walk(inner[0], ins, found)  # a call (jit, custom_jvp, ...)
            else:
                for j in inner:  # (a scan or other: its decisions, conservatively)
                    _walk(j, [True] * len(_inner(j).invars), found)
                outs = [any(ins) or bool(inner)] * len(eqn.outvars)
        unknown |= {v for v, u in zip(eqn.outvars, outs) if u or _is_float(v)}
    return [is_unknown(v) for v in jaxpr.outvars]


def _while(eqn: Any, ins: list[bool], found: list[SteeredDecision]) -> tuple[list[bool], bool]:
    """The loop's results' unknown-ness, and whether its test is steered by floats."""
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = ins[:nc], ins[nc:nc + nb], list(ins[nc + nb:])
    while True:  # the carry's unknown-ness to a fixed point
        new = _walk(p["body_jaxpr"], [*bconsts, *carry], [])
        merged = [a or b for a, b in zip(carry, new)]
        if merged == carry:
            break
        carry = merged
    _walk(p["body_jaxpr"], [*bconsts, *carry], found)
    test = _walk(p["cond_jaxpr"], [*cconsts, *carry], found)
    steered = bool(test and test[0])
    if steered:
        found.append(("a while loop's test", _line(eqn)))
    return carry, steered


def float_steered(jaxpr: Any) -> tuple[SteeredDecision, ...]:
    """The decisions of ``jaxpr`` (a kernel body; refs and integer operands known) that
    depend on floating-point values, in program order, without repeats."""
    key = _inner(jaxpr)
    hit = _MEMO.get(key)
    if hit is None:
        found: list[SteeredDecision] = []
        _walk(key, [False] * len(key.invars), found)
        hit = _MEMO[key] = tuple(dict.fromkeys(found))
    return hit


def is_float_steered_loop(eqn: Any) -> bool:
    """Whether the ``while`` equation ``eqn``'s test depends on floating-point values
    (its operands' floats, or floats its body computes)."""
    key = _inner(eqn.params["cond_jaxpr"])
    hit = _LOOPS.get(key)
    if hit is None:
        _, hit = _while(eqn, [_is_float(a) for a in eqn.invars], [])
        _LOOPS[key] = hit
    return hit
