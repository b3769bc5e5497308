"""Rules for ref loads, stores, swaps and ``run_scoped`` allocations."""

from __future__ import annotations

from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval import memory
from palladium.interpret.eval.access_path import PlanCache, ResolvedAccess, operand_key
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.refs import MemRef, split_transformed
from palladium.interpret.eval.registry import rule, rule_compiler


@rule(jc.get_p)
def _get(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    transforms = eqn.params["tree"].unflatten(invals[1:])
    out = memory.read(ev, invals[0], transforms, eqn)
    return [out.astype(eqn.outvars[0].aval.dtype, copy=False)]


@rule(jc.swap_p)
def _swap(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    ref, val, *idx = invals
    transforms = eqn.params["tree"].unflatten(idx)
    return [memory.swap(ev, ref, transforms, val, eqn)]


@rule(jc.addupdate_p)
def _addupdate(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    ref, val, *idx = invals
    transforms = eqn.params["tree"].unflatten(idx)
    old = memory.read(ev, ref, transforms, eqn)
    memory.write(ev, ref, transforms, (old + val).astype(old.dtype), eqn)
    return []


# --- specialised get/swap: the common loads and stores of a kernel body -----------------
# Resolved once per structure of the operands (``access_path``): a step pays one dict
# lookup, and neither the simulator nor the race detector parses the region again.
def _lookup(cache: PlanCache[ResolvedAccess], tree: Any, ev: KernelContext, ref: MemRef,
            invals: list[Any]) -> ResolvedAccess | None:
    """The resolved access of ``ref`` indexed by ``invals[1:]`` (``invals[0]`` stands for
    the ref, the rest are its index operands), or None for the generic path."""
    key = operand_key([ref, *invals[1:]])
    if key is None:
        return None
    return cache.get(key, _resolve, tree, ev, ref, invals)


def _resolve(tree: Any, ev: KernelContext, ref: MemRef, invals: list[Any]) -> ResolvedAccess:
    acc = memory.access_of(ref, tree.unflatten(invals[1:]))
    return ResolvedAccess(acc, ev.sim.plan(ref.buffer, acc.region))


@rule_compiler(jc.get_p)
def _compile_get(eqn: Equation, used: frozenset[Any]) -> Any:
    cache: PlanCache[ResolvedAccess] = PlanCache()
    tree = eqn.params["tree"]
    out_dtype = eqn.outvars[0].aval.dtype

    def run(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        ref = memory.checked_ref(ev, invals[0], eqn, "read")
        hit = _lookup(cache, tree, ev, ref, invals)
        if hit is None:
            return _get(ev, eqn, invals)
        data = memory.read_access(ev, ref, hit.access, eqn, hit.plan)
        return [data.astype(out_dtype, copy=False)]

    return run


@rule_compiler(jc.swap_p)
def _compile_swap(eqn: Equation, used: frozenset[Any]) -> Any:
    cache: PlanCache[ResolvedAccess] = PlanCache()
    tree = eqn.params["tree"]
    # Most stores discard the old value (`ref[...] = x`): then a plain write does the
    # same (same race-detector event, same checks for a region of stored data only:
    # ``plan.full``) without copying the old contents out.
    old_used = eqn.outvars[0] in used

    def run(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        ref, val, *idx = invals
        checked = memory.checked_ref(ev, ref, eqn, "swap")
        hit = _lookup(cache, tree, ev, checked, [ref, *idx])
        if hit is None or hit.access.post:
            return _swap(ev, eqn, invals)
        acc, plan = hit
        buf = checked.buffer
        value = np.broadcast_to(np.asarray(val, dtype=buf.dtype), acc.region_shape)
        sim = ev.sim
        if plan.full and not old_used:
            sim.write(buf, plan, value, core=ev.core, site=ev.site(eqn))
            return [None]
        return [np.asarray(sim.swap(buf, plan, value, core=ev.core, site=ev.site(eqn)))]

    return run


@rule(jc.load_p)
def _load(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    ref, transforms, mask, other = eqn.params["args_tree"].unflatten(invals)
    ref, ref_transforms = split_transformed(ref)
    transforms = (*ref_transforms, *transforms)
    aval = eqn.outvars[0].aval
    if mask is None:
        data = memory.read(ev, ref, transforms, eqn, "load")
    else:
        data = memory.read_masked(ev, ref, transforms, mask, eqn)
        fill = other if other is not None else ev.memory.fill_value(aval.dtype)
        data = np.where(mask, data, fill)
    return [np.asarray(data, dtype=aval.dtype)]


@rule(jc.masked_swap_p)
def _masked_swap(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    ref, transforms, val, mask = eqn.params["args_tree"].unflatten(invals)
    ref, ref_transforms = split_transformed(ref)
    transforms = (*ref_transforms, *transforms)
    return [memory.swap(ev, ref, transforms, val, eqn, mask=mask)]


@rule(jc.run_scoped_p)
def _run_scoped(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    jaxpr = eqn.params["jaxpr"]
    names = _scoped_names(jaxpr)
    allocations = [
        ev.memory.allocate_scoped(ev.core, var.aval, names[i], lambda: ev.site(eqn), var=var)
        for i, var in enumerate(jaxpr.invars)
    ]
    outs = ev.eval_jaxpr(jaxpr, invals, allocations)
    for a in reversed(allocations):
        ev.memory.free_scoped(ev.core, a, lambda: ev.site(eqn))
    return outs


def _scoped_names(jaxpr: Any) -> list[str]:
    n = len(jaxpr.invars)
    names = getattr(jaxpr.debug_info, "arg_names", None) if jaxpr.debug_info else None
    out = []
    for i in range(n):
        name = names[i] if names is not None and i < len(names) else None
        out.append(name if name else f"run_scoped[{i}]")
    return out
