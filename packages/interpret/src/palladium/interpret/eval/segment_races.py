"""The race detector's view of a compiled segment: its ref accesses, replayed in order.

With ``detect_races`` on, a kernel that starts DMAs or uses semaphores has agents other
than its core (DMAs in flight, other cores, other devices) that may touch a buffer the
core computes on, so every ref access must reach the race detector. A compiled segment
(``segments.py``) then also returns the start indices of every access it made (per loop
iteration, stacked), and :func:`replay` hands them to the detector after the segment
ran: the same events, for the same regions, at the same sites and in the same order as
the one-equation path gives them. No scheduling point lies inside a segment, so the
core's clock is the same for all of them. A segment with a ``cond`` or a ``while``
(whose accesses are not known to have happened) runs equation by equation instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.context import KernelContext
from palladium.interpret.eval.jaxprs import any_equation, nested_jaxprs
from palladium.interpret.eval.primitive_groups import (
    CALLS,
    INDEXED_ACCESSES,
    REF_ACCESSES,
    call_body,
)

__all__ = ["LoggedAccess", "LoggedLoop", "access_log_plan", "replay"]


@dataclasses.dataclass(frozen=True)
class LoggedAccess:
    """One ref access of the segment: its equation, its ref (position among the
    segment's refs), what the detector sees (False: a read, True: a write, in order),
    its position in the log, and its window's sizes and integer-indexed dimensions."""

    eqn: Any
    ref: int
    kinds: tuple[bool, ...]
    pos: int
    sizes: tuple[int, ...]
    dropped: frozenset[int]


@dataclasses.dataclass(frozen=True)
class LoggedLoop:
    """A ``scan`` whose body's accesses are logged once per iteration."""

    length: int
    reverse: bool
    body: tuple[Any, ...]


def _window(eqn: Any, shape: tuple[int, ...], n_lead: int) -> tuple[tuple[int, ...], frozenset[int]]:
    transforms = eqn.params["tree"].unflatten(eqn.invars[n_lead:])
    if not transforms:
        return tuple(shape), frozenset()
    sizes, dropped = [], set()
    for d, i in enumerate(transforms[0].indices):
        if isinstance(i, jc.Slice):
            sizes.append(int(i.size))
        else:
            sizes.append(1)
            dropped.add(d)
    return tuple(sizes), frozenset(dropped)


def access_log_plan(eqns: Sequence[Any], refs: Sequence[Any]) -> tuple[Any, ...] | None:
    """The accesses of ``eqns`` in the order a compiled segment logs them (and the
    one-equation path makes them); None if one lies inside a ``cond`` or ``while``."""
    counter = [0]

    def walk(eqns: Sequence[Any], where: dict[Any, int]) -> list[Any] | None:
        items: list[Any] = []
        for eqn in eqns:
            prim, p = eqn.primitive, eqn.params
            if prim in INDEXED_ACCESSES:
                ref = eqn.invars[0]
                sizes, dropped = _window(eqn, tuple(ref.aval.shape), INDEXED_ACCESSES[prim])
                writes = REF_ACCESSES[prim].writes
                items.append(LoggedAccess(eqn, where[ref], writes, counter[0], sizes, dropped))
                counter[0] += 1
                continue
            if prim is jc.scan_p:
                inner = p["jaxpr"].jaxpr
            elif prim in CALLS:
                inner = call_body(eqn).jaxpr
            elif prim is jc.cond_p or prim is jc.while_p:
                if _has_access(eqn):
                    return None
                continue
            else:
                continue
            inner_where = {v: where[o] for v, o in zip(inner.invars, eqn.invars)
                           if not isinstance(o, jc.Literal) and o in where}
            body = walk(inner.eqns, inner_where)
            if body is None:
                return None
            if prim is jc.scan_p:
                if body:
                    items.append(LoggedLoop(int(p["length"]), bool(p["reverse"]), tuple(body)))
            else:
                items.extend(body)
        return items

    plan = walk(eqns, {r: i for i, r in enumerate(refs)})
    return None if plan is None else tuple(plan)


def _has_access(eqn: Any) -> bool:
    return any(any_equation(j, lambda e: e.primitive in INDEXED_ACCESSES)
               for j in nested_jaxprs(eqn))


def replay(ev: KernelContext, plan: tuple[Any, ...], log: Sequence[Any],
           buffers: Sequence[Any]) -> None:
    """Tell the race detector of every access the segment made (``log``: its start
    indices, as the compiled segment returned them; ``buffers``: of its refs)."""
    sim, core = ev.sim, ev.core
    # the accesses of private and read-only buffers are not told: skipped before any work
    watched = [sim.watched(b) for b in buffers]
    if not any(watched):
        return
    starts = [np.asarray(x) for x in log]
    plans: dict[tuple[int, int, tuple[int, ...]], Any] = {}
    sites: dict[int, Any] = {}  # one site per access of the plan

    def walk(items: tuple[Any, ...], prefix: tuple[int, ...]) -> None:
        for item in items:
            if isinstance(item, LoggedLoop):
                order = range(item.length - 1, -1, -1) if item.reverse else range(item.length)
                for i in order:
                    walk(item.body, (*prefix, i))
                continue
            if not watched[item.ref]:
                continue
            at = tuple(int(s) for s in starts[item.pos][prefix])
            buf = buffers[item.ref]
            key = (buf.key, item.pos, at)
            region_plan = plans.get(key)
            if region_plan is None:
                region = tuple(s if d in item.dropped else slice(s, s + n)
                               for d, (s, n) in enumerate(zip(at, item.sizes)))
                region_plan = plans[key] = sim.plan(buf, region)
            site = sites.get(item.pos)
            if site is None:
                site = sites[item.pos] = ev.site(item.eqn)
            for write in item.kinds:
                sim.record_access(buf, region_plan, write=write, core=core, site=site)

    walk(plan, ())
