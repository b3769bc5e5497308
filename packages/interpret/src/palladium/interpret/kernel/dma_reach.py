"""Which of a kernel's refs a DMA can reach: the others are private to their core.

A VMEM or SMEM buffer belongs to one core. The only agents besides that core that can
touch it are DMAs (the grid loop's block copies are the core's own, in program order),
and a DMA names its source and destination refs in a ``dma_start`` (a remote DMA lands
in the buffer at the same position on another core, named by the same equation of the
same kernel body). So a VMEM/SMEM buffer that no DMA equation of the kernel names is
accessed by its core alone: its accesses cannot race, and the race detector need not
hear of them (``Simulation.allocate(private=True)``). Paged attention's scalar-prefetch
page table, its softmax scratch and its flags are ~63% of its accesses.

:func:`ref_reach` finds the named refs, following refs into the jaxprs of the
control flow and calls that pass them on. Where it cannot follow a ref (an equation with
a nested jaxpr of a kind it does not know, an equation that makes a ref), it gives up and
every buffer stays shared: the analysis may only ever err on the side of watching.

It also finds the refs something may write (a DMA's destination, a store). An input
nothing writes and no output aliases is read-only for the whole launch (its HBM buffer
is ``Simulation.allocate(read_only=True)``): reads cannot race with reads, so the
detector need not hear of them either (paged attention's DMAs read its pages from two
such inputs).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.jaxprs import jaxprs_in
from palladium.interpret.eval.primitive_groups import DMA_PRIMITIVES, NESTED_CALLS, REF_ACCESSES

__all__ = ["RefReach", "private_positions", "read_only_positions", "ref_reach"]


# The ref accesses that write (the access table's stores and accumulations).
_STORES = frozenset(p for p, access in REF_ACCESSES.items() if any(access.writes))
# Equations whose nested jaxprs take the equation's operands one for one.
_CALLS = frozenset((jc.scan_p, *NESTED_CALLS))


class RefReach(NamedTuple):
    """The ref variables of a kernel jaxpr (any depth) a DMA names (``named``), and those
    something may write (``written``: a DMA's destination, a store)."""

    named: frozenset[Any]
    written: frozenset[Any]


class _Unknown(Exception):
    """A ref the analysis cannot follow."""


def _is_ref(v: Any) -> bool:
    return isinstance(getattr(v, "aval", None), jc.AbstractRef)


def _aliases(eqn: Any) -> list[tuple[Any, list[Any], list[Any]]]:
    """(nested jaxpr, its vars, the equation's operands they stand for) for each nested
    jaxpr of ``eqn``; raises ``_Unknown`` where refs go into a jaxpr it cannot map."""
    prim, p, ins = eqn.primitive, eqn.params, list(eqn.invars)
    if prim is jc.cond_p:
        return [(b.jaxpr, b.jaxpr.invars, ins[1:]) for b in p["branches"]]
    if prim is jc.while_p:
        nc, nb = p["cond_nconsts"], p["body_nconsts"]
        body, cond = p["body_jaxpr"].jaxpr, p["cond_jaxpr"].jaxpr
        return [(body, body.invars, ins[nc:]), (cond, cond.invars, ins[:nc] + ins[nc + nb:])]
    if prim is jc.run_scoped_p:
        inner = p["jaxpr"]
        return [(inner, inner.constvars, ins)]
    inners = [j for v in p.values() for j in jaxprs_in(v)]
    if not inners:
        return []
    if prim in _CALLS and all(len(j.invars) == len(ins) for j in inners):
        return [(j, j.invars, ins) for j in inners]
    if any(_is_ref(v) for v in ins):
        raise _Unknown(prim)
    # No ref goes in: its jaxprs can only name refs they allocate themselves.
    return [(j, [], []) for j in inners]


def _dma_destination(eqn: Any) -> list[Any]:
    """The destination ref of a ``dma_start`` (every ref operand if it cannot tell)."""
    try:
        dst = jc.dma_operands(eqn.params["tree"], list(eqn.invars))[1]
    except Exception:  # noqa: BLE001 - another operand layout: assume every ref
        return [v for v in eqn.invars if _is_ref(v)]
    return [getattr(dst, "ref", dst)]


def _walk(jaxpr: Any, named: set[Any], written: set[Any]) -> None:
    """Add the refs of ``jaxpr`` (and of its nested jaxprs) a DMA names to ``named``,
    those a DMA or a store may write to ``written``."""
    for eqn in jaxpr.eqns:
        prim = eqn.primitive
        if any(_is_ref(v) for v in eqn.outvars):
            raise _Unknown(prim)
        if prim in DMA_PRIMITIVES:
            named.update(v for v in eqn.invars if _is_ref(v))
            if prim is jc.dma_start_p:
                written.update(_dma_destination(eqn))
            continue
        if prim in _STORES:
            written.add(eqn.invars[0])
            continue
        for inner, inner_vars, outer in _aliases(eqn):
            if len(inner_vars) != len(outer):
                raise _Unknown(prim)
            if any(_is_ref(v) for v in getattr(inner, "constvars", ())) and \
                    inner_vars is not inner.constvars:
                raise _Unknown(prim)  # a ref closed over, not passed
            _walk(inner, named, written)
            for i, o in zip(inner_vars, outer):
                if _is_ref(o):
                    if i in named:
                        named.add(o)
                    if i in written:
                        written.add(o)


def ref_reach(jaxpr: Any) -> RefReach | None:
    """Which refs of ``jaxpr`` (at any depth: run_scoped allocations too) a DMA may read
    or write, and which anything may write; None when the analysis cannot tell (then
    assume all)."""
    named: set[Any] = set()
    written: set[Any] = set()
    try:
        _walk(getattr(jaxpr, "jaxpr", jaxpr), named, written)
    except _Unknown:
        return None
    return RefReach(frozenset(named), frozenset(written))


def _positions_outside(jaxpr: Any, refs: frozenset[Any]) -> frozenset[int]:
    invars = getattr(jaxpr, "jaxpr", jaxpr).invars
    return frozenset(i for i, v in enumerate(invars) if v not in refs)


def private_positions(jaxpr: Any, reach: RefReach | None) -> frozenset[int]:
    """The kernel operand positions (of ``jaxpr.invars``) no DMA reaches."""
    return frozenset() if reach is None else _positions_outside(jaxpr, reach.named)


def read_only_positions(jaxpr: Any, reach: RefReach | None) -> frozenset[int]:
    """The kernel operand positions nothing in the kernel writes (no DMA into them, no
    store): an input there is only read during the launch, unless an output aliases it."""
    return frozenset() if reach is None else _positions_outside(jaxpr, reach.written)
