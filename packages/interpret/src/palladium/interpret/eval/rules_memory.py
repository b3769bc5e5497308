"""Rules for ref loads, stores, swaps and ``run_scoped`` allocations."""

from __future__ import annotations

from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval import memory
from palladium.interpret.eval.refs import split_transformed
from palladium.interpret.eval.registry import rule


@rule(jc.get_p)
def _get(ev: Any, eqn: Any, invals: list[Any]) -> list[Any]:
    transforms = eqn.params["tree"].unflatten(invals[1:])
    out = memory.read(ev, invals[0], transforms, eqn)
    return [out.astype(eqn.outvars[0].aval.dtype, copy=False)]


@rule(jc.swap_p)
def _swap(ev: Any, eqn: Any, invals: list[Any]) -> list[Any]:
    ref, val, *idx = invals
    transforms = eqn.params["tree"].unflatten(idx)
    return [memory.swap(ev, ref, transforms, val, eqn)]


@rule(jc.addupdate_p)
def _addupdate(ev: Any, eqn: Any, invals: list[Any]) -> list[Any]:
    ref, val, *idx = invals
    transforms = eqn.params["tree"].unflatten(idx)
    old = memory.read(ev, ref, transforms, eqn)
    memory.write(ev, ref, transforms, (old + val).astype(old.dtype), eqn)
    return []


@rule(jc.load_p)
def _load(ev: Any, eqn: Any, invals: list[Any]) -> list[Any]:
    ref, transforms, mask, other = eqn.params["args_tree"].unflatten(invals)
    ref, ref_transforms = split_transformed(ref)
    transforms = (*ref_transforms, *transforms)
    aval = eqn.outvars[0].aval
    data = memory.read(ev, ref, transforms, eqn, "load")
    if mask is not None:
        fill = other if other is not None else ev.launch.fill_value(aval.dtype)
        data = np.where(mask, data, fill)
    return [np.asarray(data, dtype=aval.dtype)]


@rule(jc.masked_swap_p)
def _masked_swap(ev: Any, eqn: Any, invals: list[Any]) -> list[Any]:
    ref, transforms, val, mask = eqn.params["args_tree"].unflatten(invals)
    ref, ref_transforms = split_transformed(ref)
    transforms = (*ref_transforms, *transforms)
    return [memory.swap(ev, ref, transforms, val, eqn, mask=mask)]


@rule(jc.run_scoped_p)
def _run_scoped(ev: Any, eqn: Any, invals: list[Any]) -> list[Any]:
    jaxpr = eqn.params["jaxpr"]
    names = _scoped_names(jaxpr)
    allocations = [
        ev.launch.allocate_scoped(ev, var.aval, names[i], eqn) for i, var in enumerate(jaxpr.invars)
    ]
    outs = ev.eval_jaxpr(jaxpr, invals, allocations)
    for a in reversed(allocations):
        ev.launch.free_scoped(ev, a, eqn)
    return outs


def _scoped_names(jaxpr: Any) -> list[str]:
    n = len(jaxpr.invars)
    names = getattr(jaxpr.debug_info, "arg_names", None) if jaxpr.debug_info else None
    out = []
    for i in range(n):
        name = names[i] if names is not None and i < len(names) else None
        out.append(name if name else f"run_scoped[{i}]")
    return out
