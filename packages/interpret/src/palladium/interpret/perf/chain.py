"""A core's compute chunk as the recorder costs it: the dataflow chain of its equations
(``Chunk``) and a memoised run of equations that started one (``Run``); see
``recorder.TimelineRecorder._on_chain``."""

from __future__ import annotations

import dataclasses
from typing import Any

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.jaxprs import nested_jaxprs
from palladium.interpret.eval.primitive_groups import (
    CALLS,
    DMA_PRIMITIVES,
    REF_ACCESSES,
    call_body,
)
from palladium.interpret.perf.model import ChipModel

__all__ = ["Chunk", "Run", "chain_operands", "conditional_cost", "straight_body"]


@dataclasses.dataclass
class Chunk:
    """The dataflow chain of one core's current compute chunk (``_on_chain``)."""

    #: when each value (by variable; a ref's last store by ("ref", var)) is ready:
    #: its first vreg and all of it
    ready: dict[Any, tuple[float, float]] = dataclasses.field(default_factory=dict)
    end: float = 0.0  # the chain's end
    #: the equations seen (a repeat starts a loop's next iteration) and the first
    #: repeated one
    seen: set[int] = dataclasses.field(default_factory=set)
    anchor: int | None = None
    #: when the current loop iteration began (a loop body is one basic block on the
    #: chip: an iteration's loads cannot start before the last one's last op issued),
    #: and when the chunk's last op issued
    start: float = 0.0
    issued: float = 0.0
    mxu_free: float = 0.0  # when the MXU takes its next dot
    #: when the current basic block began (the last conditional's end) and each unit's
    #: busy time since then: a conditional waits for both its block's chain and its
    #: busiest unit
    base: float = 0.0
    busy: dict[str, float] = dataclasses.field(default_factory=dict)
    #: the values holding a lane reduction's result in every lane (spreading them over
    #: the lanes is free)
    replicated: set[Any] = dataclasses.field(default_factory=set)
    #: a predicated conditional just placed (``conditional_cost``): its DMA branch's
    #: equation ids and what it costs untaken, until the next equation says whether
    #: the branch was taken
    predicated: tuple[frozenset[int], float] | None = None
    #: the values too big for the vector registers (``Cost.spills``): in VMEM whole
    spilled: set[Any] = dataclasses.field(default_factory=set)

    def copy(self) -> Chunk:
        return dataclasses.replace(self, ready=dict(self.ready), seen=set(self.seen),
                                   replicated=set(self.replicated), busy=dict(self.busy),
                                   spilled=set(self.spilled))

    def _issued_all(self) -> float:
        """When everything placed has issued, the block's busiest unit's work included."""
        return max(self.start, self.issued,
                   self.base + max(self.busy.values(), default=0.0))

    def block_end(self, seconds: float) -> None:
        """End the current basic block: what follows issues after everything before it
        did, and ``seconds`` later (a conditional)."""
        at = self._issued_all() + seconds
        self.start = self.issued = self.base = at
        self.busy = {}
        self.end = max(self.end, at)

    def settled_end(self) -> float:
        """The chain's end, a predicated conditional placed last counted untaken (read
        only: the chunk may be a memo's)."""
        if self.predicated is None:
            return self.end
        return max(self.end, self._issued_all() + self.predicated[1])

    def place(self, op: Any, cost: Any, plan: tuple[Any, ...], xlu_latency: float) -> None:
        """One equation's place on the dataflow (``recorder.TimelineRecorder._on_chain``
        says how), its operands' keys ``plan`` (``chain_operands``)."""
        ready, chain = self.ready, self.end
        start = self.start
        first = whole = start
        need = start  # a dot's right operand (its weights): all of it before the first part
        refs, values, written = plan
        for r in refs:
            # a ref: ready when its last store on this chunk's chain is (a loop that
            # carries its state in VMEM waits on it; loads of inputs do not)
            f, w = ready.get(r, (start, start))
            first, whole = max(first, f), max(whole, w)
        mxu = cost.unit == "mxu"
        spread = cost.spread
        for i, v in values:
            f, w = ready.get(v, (chain, chain))
            if spread and i in spread and v not in self.replicated:
                # its one lane spread over the lanes by the cross-lane unit
                f, w = f + xlu_latency, w + xlu_latency
            if mxu and i > 0:
                need = max(need, w)
            elif mxu and v in self.spilled:
                # a left operand in VMEM whole (too big for the registers) does not
                # stream into the MXU as its rows are made: the dot waits for all of it
                # (r3 on a v5e: a (256, 256) f32 p @ v of the flash step)
                f = w
            first, whole = max(first, f), max(whole, w)
        if mxu:
            # the left operand's row blocks stream through the MXU, each out one
            # latency after it went in: a dependent dot starts on the first block;
            # independent dots queue for the MXU
            part = cost.seconds / cost.parts
            lag = max(cost.latency - cost.seconds, 0.0)
            go = max(first, need, self.mxu_free)
            issued = go
            self.mxu_free = max(go + cost.seconds, whole + part)
            f = go + part + lag
            out = (f, max(f + cost.seconds - part, whole + part + lag))
        else:
            replicated = self.replicated
            if cost.lanes or (not cost.spread and not refs and values
                              and all(v in replicated for _, v in values)):
                replicated.update(op.outvars)  # a lane reduction's value in every lane
            f = first + cost.latency
            out = (f, max(whole + cost.latency, f + cost.seconds))
            issued = max(whole, first + cost.seconds)  # its last vreg's issue
        for v in op.outvars:
            ready[v] = out
        if cost.spills:
            self.spilled.update(op.outvars)
        if written is not None:
            ready[written] = out
        self.end = max(chain, out[1])
        if issued > self.issued:
            self.issued = issued
        if cost.unit:  # (the block's units; after a conditional, from its end on)
            b = self.busy[cost.unit] = self.busy.get(cost.unit, 0.0) + cost.seconds
            if self.base and self.base + b > self.end:
                self.end = self.base + b


@dataclasses.dataclass(slots=True)
class Run:
    """A run of equations that started a chunk, costed once (``_costed``): the equations
    (held: the memo is keyed by their ids), the counts and chain it left, the chunk's
    seconds (None until pushed) and how often it was pushed again since its counts were
    last added (``_count_repeats``)."""

    ops: tuple[Any, ...]
    counts: Any
    chain: Chunk | None
    seconds: float | None = None
    repeats: int = 0


def straight_body(op: Any) -> Any | None:
    """The body of a call equation (``jnp.where``'s, a helper's under ``jax.jit``) as an
    open ``Jaxpr`` whose equations are straight-line array code and such calls (no ref
    access, no control flow), or None: the recorder places such a body's equations on
    the chunk's dataflow from the call's operands (the chip inlines a call; its
    equations, told after it, do not queue behind the chain's end)."""
    if op.primitive not in CALLS:
        return None
    body = call_body(op)
    jaxpr = getattr(body, "jaxpr", body)
    for eqn in jaxpr.eqns:
        if eqn.primitive in REF_ACCESSES or eqn.primitive in DMA_PRIMITIVES:
            return None
        if (any(hasattr(p, "eqns") or hasattr(p, "jaxpr") for p in eqn.params.values())
                and straight_body(eqn) is None):
            return None
    return jaxpr


def chain_operands(op: Any) -> tuple[tuple[Any, ...], tuple[Any, ...], Any]:
    """The keys ``Chunk.place`` reads for ``op``'s operands in ``ready``: its ref's (a ref
    access's first operand, ("ref", var)) and its array values' with their positions
    (scalars and literals are not on the chain: the scalar unit runs ahead), and the
    ref key it writes (or None)."""
    access = REF_ACCESSES.get(op.primitive)  # (its first operand: the ref)
    refs: list[Any] = []
    values: list[tuple[int, Any]] = []
    for i, v in enumerate(op.invars):
        if type(v).__name__ == "Literal" or not getattr(v.aval, "shape", (1,)):
            continue
        if access is not None and i == 0:
            refs.append(("ref", v))
        else:
            values.append((i, v))
    written = (("ref", op.invars[0]) if access is not None and True in access.writes
               and op.invars else None)
    return tuple(refs), tuple(values), written


def conditional_cost(op: Any, chip: ChipModel) -> tuple[float, frozenset[int] | None]:
    """What the conditional ``op`` (``pl.when``, ``lax.cond``) costs its core's chain
    (a branch: ``branch_seconds``) and, where a branch starts DMAs and is short enough
    for the compiler to predicate it (at most ``predicated_branch_equations``
    equations), the ids of that branch's equations (nested ones too): not taken, it
    costs the core its DMA starts' issue all the same (``predicated_seconds`` and
    ``predicated_dma_seconds`` each; round 19 on a v5e: a never-taken ``pl.when``
    around 1, 2 or 4 page DMAs costs a loop 19, 32 and 57 ns an iteration, around 8 or
    more 9 ns; round 18: jax's paged attention's first-block fetch at 4 pages a block,
    124 ns a block). Taken, it costs what a branch does (a DMA start's issue is not
    modelled elsewhere)."""
    limit = chip.predicated_branch_equations
    starts, ids = 0, set()
    if limit:
        for branch in op.params["branches"]:
            eqns = branch.jaxpr.eqns
            n = sum(e.primitive is jc.dma_start_p for e in eqns)
            if n and len(eqns) > limit:
                return chip.branch_seconds, None
            if n:
                starts += n
                ids.update(_equation_ids(branch.jaxpr))
    if not starts:
        return chip.branch_seconds, None
    return chip.predicated_seconds + starts * chip.predicated_dma_seconds, frozenset(ids)


def _equation_ids(jaxpr: Any) -> list[int]:
    """The ids of ``jaxpr``'s equations at any depth (``eval.jaxprs.nested_jaxprs``)."""
    out = []
    for eqn in jaxpr.eqns:
        out.append(id(eqn))
        for inner in nested_jaxprs(eqn):
            out.extend(_equation_ids(inner))
    return out
