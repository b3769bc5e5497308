"""Rules for ref loads, stores, swaps and ``run_scoped`` allocations."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval import memory
from palladium.interpret.eval.access_path import PlanCache, ResolvedAccess, operand_key
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.refs import MemRef, RefView, split_transformed
from palladium.interpret.eval.registry import Rule, rule, rule_compiler


# Every ref access has one rule, a rule compiler: per equation, the access is resolved
# once per structure of its operands (``access_path``) into a ``ResolvedAccess`` (the
# access and the simulator's plan of its region), so that a step pays one dict lookup and
# neither the simulator nor the race detector parses the region again. Operands without a
# structure (an array-valued index: a gather) resolve to a plan for that call alone.
def _resolve(tree: Any, ev: KernelContext, ref: MemRef, invals: list[Any], start: int,
             stop: int | None = None) -> ResolvedAccess:
    """``ref``'s access through the transforms ``tree`` makes of ``invals[start:stop]``,
    resolved."""
    acc = memory.access_of(ref, tree.unflatten(invals[start:stop]))
    return ResolvedAccess(acc, ev.sim.plan(ref.buffer, acc.region))


@rule_compiler(jc.get_p)
def _get(eqn: Equation, used: frozenset[Any]) -> Rule:
    cache: PlanCache[ResolvedAccess] = PlanCache()
    tree = eqn.params["tree"]
    out_dtype = eqn.outvars[0].aval.dtype

    entries = cache.entries

    def run(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        ref = invals[0]
        if type(ref) is not MemRef or ref.buffer.space.per_device:
            ref = memory.checked(ev, ref, eqn, "read")  # (raises where it must)
        key = operand_key(invals)
        # (every load of a kernel: the cache's hit looked up here, not in a call)
        hit = None if key is None else entries.get(key)
        acc, plan = hit or cache.get(key, _resolve, tree, ev, ref, invals, 1)
        if acc.post or ev.tracks_values:
            data = memory.read_access(ev, ref, acc, eqn, plan)
        else:  # (``read_access`` with nothing to apply or note: a scalar's load)
            data = ev.sim.read(ref.buffer, plan, core=ev.core, site=ev.site(eqn))
        return [data if data.dtype is out_dtype else data.astype(out_dtype, copy=False)]

    return run


@rule_compiler(jc.swap_p)
def _swap(eqn: Equation, used: frozenset[Any]) -> Rule:
    cache: PlanCache[ResolvedAccess] = PlanCache()
    tree = eqn.params["tree"]
    old_used = eqn.outvars[0] in used  # most stores discard it: see ``memory.swap``

    def run(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        ref = memory.checked(ev, invals[0], eqn, "swap")
        acc, plan = cache.get(operand_key(invals, skip=1), _resolve, tree, ev, ref, invals, 2)
        return [memory.swap(ev, ref, acc, plan, invals[1], eqn, old_used=old_used)]

    return run


@rule_compiler(jc.addupdate_p)
def _addupdate(eqn: Equation, used: frozenset[Any]) -> Rule:
    cache: PlanCache[ResolvedAccess] = PlanCache()
    tree = eqn.params["tree"]

    def run(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        ref = memory.checked(ev, invals[0], eqn, "read")
        acc, plan = cache.get(operand_key(invals, skip=1), _resolve, tree, ev, ref, invals, 2)
        old = memory.read_access(ev, ref, acc, eqn, plan)
        memory.write(ev, ref, acc, plan, (old + invals[1]).astype(old.dtype), eqn)
        return []

    return run


# pltpu.load / pltpu.store: the operands are the ref (with the leaves of its transforms,
# as jax's ``TransformedRef`` flattens: the ref first), the indexers' leaves, then the
# mask and fill (load) or the value and mask (store), each present or None in the tree;
# only the first ``n`` operands are part of the access.
def masked_access_parts(eqn: Equation) -> tuple[Any, int, bool, bool]:
    """(the operands' tree, ``n``, whether the third and fourth parts are given)."""
    args_tree = eqn.params["args_tree"]
    children: list[Any] = jax.tree_util.treedef_children(args_tree)
    ref_tree, transforms_tree, third, fourth = children
    return (args_tree, ref_tree.num_leaves + transforms_tree.num_leaves,
            third.num_leaves > 0, fourth.num_leaves > 0)


def _resolve_masked(args_tree: Any, ev: KernelContext, ref: MemRef,
                    invals: list[Any]) -> ResolvedAccess:
    value, transforms = args_tree.unflatten(invals)[:2]
    acc = memory.access_of(ref, (*split_transformed(value)[1], *transforms))
    return ResolvedAccess(acc, ev.sim.plan(ref.buffer, acc.region))


def _base(value: Any) -> Any:
    return value.ref if type(value) is RefView else value


@rule_compiler(jc.load_p)
def _load(eqn: Equation, used: frozenset[Any]) -> Rule:
    cache: PlanCache[ResolvedAccess] = PlanCache()
    args_tree, n, masked, other_given = masked_access_parts(eqn)
    aval = eqn.outvars[0].aval

    def run(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        ref = memory.checked(ev, _base(invals[0]), eqn, "load")
        acc, plan = cache.get(operand_key(invals, stop=n), _resolve_masked, args_tree, ev,
                              ref, invals)
        if not masked:
            data = memory.read_access(ev, ref, acc, eqn, plan)
            return [np.asarray(data, dtype=aval.dtype)]
        mask = invals[n]
        data = memory.read_masked(ev, ref, acc, plan, mask, eqn)
        fill = invals[n + 1] if other_given else ev.memory.fill_value(aval.dtype)
        return [np.asarray(np.where(mask, data, fill), dtype=aval.dtype)]

    return run


@rule_compiler(jc.masked_swap_p)
def _masked_swap(eqn: Equation, used: frozenset[Any]) -> Rule:
    cache: PlanCache[ResolvedAccess] = PlanCache()
    args_tree, n, _, masked = masked_access_parts(eqn)
    old_used = eqn.outvars[0] in used  # see ``memory.swap``

    def run(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        ref = memory.checked(ev, _base(invals[0]), eqn, "swap")
        acc, plan = cache.get(operand_key(invals, stop=n), _resolve_masked, args_tree, ev,
                              ref, invals)
        mask = invals[n + 1] if masked else None
        return [memory.swap(ev, ref, acc, plan, invals[n], eqn, mask=mask, old_used=old_used)]

    return run


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
