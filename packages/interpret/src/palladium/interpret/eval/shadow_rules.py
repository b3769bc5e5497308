"""The evaluator's loop when values carry shadows of uninitialised memory
(``uninitialized_reads="on_use"``, ``value_shadows.py``), and the rules that have
something to decide: a ``cond`` on a shadowed index, a ``while`` whose condition is
shadowed, ``scan`` (its ys keep their shadows), and the ref accesses (a shadowed index is
reported; a read notes the shadow of what it returns, a store keeps the shadow of what
it writes, through ``memory.py``). Every other primitive propagates the shadows of its
operands (``shadow_propagation.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.primitive_groups import NESTED_CALLS, REF_ACCESSES
from palladium.interpret.eval.rules_control import run_scan, run_while
from palladium.interpret.eval.rules_memory import masked_access_parts
from palladium.interpret.eval.shadow_propagation import propagate
from palladium.interpret.eval.value_shadows import (
    Tainted,
    first_tainted,
    full_shadow,
    plain,
    report_use,
    tainted,
)

__all__ = ["PASS_THROUGH", "SHADOW_RULES", "run_shadowed"]


ShadowRule = Callable[[KernelContext, Any, Equation, list[Value]], list[Value]]
SHADOW_RULES: dict[Any, ShadowRule] = {}


def run_shadowed(ev: KernelContext, prog: Any, env: list[Any], observers: Any) -> list[Value]:
    """Run ``prog``'s steps on ``env`` (its arguments stored) with shadows: the
    evaluator's loop when values track initialisation."""
    if observers is None:
        for (rule, eqn, operands, one, out, outs), special in zip(prog.fast, prog.shadow_rules):
            ops = [env[one]] if one is not None else list(operands(env))
            if special is not None:
                results = special(ev, rule, eqn, ops)
            else:
                for x in ops:
                    if x.__class__ is Tainted:
                        results = propagate(ev, rule, eqn, ops)
                        break
                else:
                    results = rule(ev, eqn, ops)
            if out is not None:
                env[out] = results[0]
            else:
                for s, o in zip(outs, results):
                    env[s] = o
        return [env[i] for i in prog.out_slots]
    core, compute = ev.core, observers.compute
    for step in prog.steps:
        if not step.segment:
            compute(core, step.eqn)
        if step.observe_only:
            continue
        ops = [env[i] for i in step.in_slots]
        special = _passthrough if step.segment else SHADOW_RULES.get(step.eqn.primitive)
        if special is not None:
            results = special(ev, step.rule, step.eqn, ops)
        elif first_tainted(ops) is not None:
            results = propagate(ev, step.rule, step.eqn, ops)
        else:
            results = step.rule(ev, step.eqn, ops)
        for s, o in zip(step.out_slots, results):
            env[s] = o
    return [env[i] for i in prog.out_slots]


# -- rules with something to decide -------------------------------------------------------

def _shadow_rule(*prims: Any) -> Callable[[ShadowRule], ShadowRule]:
    def register(fn: ShadowRule) -> ShadowRule:
        for p in prims:
            if p is not None:
                SHADOW_RULES[p] = fn
        return fn
    return register


@_shadow_rule(jc.cond_p)
def _cond(ev: KernelContext, rule: Any, eqn: Equation, ops: list[Value]) -> list[Value]:
    if ops[0].__class__ is Tainted:
        raise report_use(ev, eqn, ops[0], "a branch (lax.cond / pl.when)")
    return rule(ev, eqn, ops)  # type: ignore[no-any-return]


@_shadow_rule(jc.while_p)
def _while(ev: KernelContext, rule: Any, eqn: Equation, ops: list[Value]) -> list[Value]:
    def check(pred: Value) -> None:
        if pred.__class__ is Tainted:
            raise report_use(ev, eqn, pred, "a loop's condition (lax.while_loop / "
                                            "lax.fori_loop bound)")
    return run_while(ev, eqn, ops, check)


@_shadow_rule(jc.scan_p)
def _scan(ev: KernelContext, rule: Any, eqn: Equation, ops: list[Value]) -> list[Value]:
    # (the plain rule's own stacking would drop the shadows of its xs and ys)
    return run_scan(ev, eqn, ops, _index, _stack)


def _index(x: Any, i: int) -> Any:
    if x.__class__ is Tainted:
        return tainted(np.asarray(x.value)[i], np.broadcast_to(
            x.shadow, np.shape(x.value))[i], x.origin)
    return np.asarray(x)[i]


def _stack(ys: list[Value], aval: Any) -> Value:
    value = np.stack([np.asarray(plain(y), dtype=aval.dtype) for y in ys])
    first = first_tainted(ys)
    if first is None:
        return value
    return Tainted(value, np.stack([full_shadow(y) for y in ys]), first.origin)


def _passthrough(ev: KernelContext, rule: Any, eqn: Equation, ops: list[Value]) -> list[Value]:
    """Calls whose rule hands its operands to a body the same loop evaluates (and
    compiled segments, which run their equations so when an operand has a shadow)."""
    return rule(ev, eqn, ops)  # type: ignore[no-any-return]


PASS_THROUGH = _passthrough
_shadow_rule(jc.run_scoped_p, *NESTED_CALLS)(_passthrough)


# Ref accesses: ``memory.py`` notes the shadow of what a read returns
# (``ev.read_shadow``) and stores the shadow of what a store writes (``ev.store_shadow``).
def _access_roles(eqn: Equation) -> dict[int, str]:
    """The operands of a ref access that are data (not an address): by position, the
    stored value, a load's or store's mask, a load's fill."""
    prim = eqn.primitive
    if prim is jc.swap_p or prim is jc.addupdate_p:
        return {1: "value"}
    if prim is jc.load_p or prim is jc.masked_swap_p:
        _, n, third, fourth = masked_access_parts(eqn)
        roles: dict[int, str] = {}
        if prim is jc.load_p:
            if third:
                roles[n] = "mask"
            if fourth:
                roles[n + int(third)] = "other"
        else:
            roles[n] = "value"
            if fourth:
                roles[n + 1] = "mask"
        return roles
    return {}


def _access(ev: KernelContext, rule: Any, eqn: Equation, ops: list[Value]) -> list[Value]:
    store: Any = None
    extra: Any = None  # a load's mask / fill, or a store's mask, with a shadow
    if first_tainted(ops) is not None:
        roles = _access_roles(eqn)
        for i, x in enumerate(ops):
            if x.__class__ is not Tainted:
                continue
            role = roles.get(i)
            if role is None:
                raise report_use(ev, eqn, x, f"an index of a ref access ('{eqn.primitive}')")
            if role == "value":
                store = x
            else:
                extra = (role, x, i)
        ops = [plain(x) for x in ops]
    prim = eqn.primitive
    combine = prim is jc.addupdate_p
    if extra is not None and extra[0] == "mask" and prim is jc.masked_swap_p:
        # a store where the mask is uninitialised: those elements are unknown after it
        m = extra[1]
        mshadow = np.asarray(m.shadow)
        store = Tainted(plain(store) if store is not None else None,
                        mshadow if store is None else (store.shadow | mshadow), m.origin)
    ev.read_shadow = None
    ev.store_shadow = (None if store is None else store.shadow,
                       None if store is None else store.origin, combine) \
        if store is not None or combine else None
    try:
        results = rule(ev, eqn, ops)
    finally:
        ev.store_shadow = None
    noted, ev.read_shadow = ev.read_shadow, None
    if not results or results[0] is None:
        return results  # type: ignore[no-any-return]
    out = results[0]
    shadow: Any = None
    origin: Any = None
    if noted is not None:
        shadow, origin = noted
    if extra is not None and prim is jc.load_p:
        role, x, i = extra
        mask = np.asarray(ops[_mask_at(eqn)]) if "mask" in _access_roles(eqn).values() else None
        if role == "mask":
            add = np.broadcast_to(x.shadow, np.shape(out))
        else:  # the fill: where the mask is False (a fill is given with a mask only)
            assert mask is not None
            add = np.broadcast_to(x.shadow, np.shape(out)) & ~np.broadcast_to(
                mask, np.shape(out))
        shadow = add if shadow is None else np.broadcast_to(shadow, np.shape(out)) | add
        origin = origin or x.origin
    if shadow is None or prim is jc.addupdate_p:
        return results  # type: ignore[no-any-return]
    return [tainted(out, shadow, origin), *results[1:]]


def _mask_at(eqn: Equation) -> int:
    return next(i for i, r in _access_roles(eqn).items() if r == "mask")


_shadow_rule(*REF_ACCESSES)(_access)

