"""Which values of a kernel body can change the walk of the kernel, and which cannot.

``predict`` (``InterpretParams(skip_unused_integer_ops=True)``) needs the walk of a
kernel (its grid, DMAs, semaphores, branches, loop trip counts, indices and the
equations it evaluates), never its results. Floating-point arithmetic is skipped already
(``skip_floating_point_ops``); this module finds the integer and boolean arrays that
need not be computed either: an ``int8`` dot accumulated into an output block, a causal
mask built from ``iota``s for a ``jnp.where``.

A value *steers* the walk when it reaches, through any chain of equations: a ref
access's indices, a DMA's or semaphore's operands, a ``cond``'s branch index, a
``while``'s test, an operand of an equation with a rule of its own (a plugin's, an
MXU's) or with effects (``debug_print``), or a store into SMEM (scalar memory: index
maps and later scalar reads may read it back). A loop's carry is followed to a fixed
point. What a kernel stores into VMEM or HBM is read back only by a load (or a DMA into
SMEM); where such a load's value steers the walk, or a DMA touches SMEM, memory may
carry a steering value and the analysis gives up (every value is computed).

:func:`unused_values` answers the results of the pure equations that steer nothing;
the evaluator returns zeros for an integer array equation whose results are all among
them (``eval/program._compute_rule``). Memoised per jaxpr.
"""

from __future__ import annotations

import weakref
from typing import Any

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.jaxprs import nested_jaxprs
from palladium.interpret.eval.primitive_groups import (
    DMA_PRIMITIVES,
    INDEXED_ACCESSES,
    NESTED_CALLS,
    REF_ACCESSES,
)
from palladium.interpret.eval.registry import RULES
from palladium.interpret.state.process_state import STATE

__all__ = ["unused_values"]

_MEMO: weakref.WeakKeyDictionary[Any, Any] = STATE.keep(
    "unused_values", weakref.WeakKeyDictionary(), owner=__name__,
    holds="a kernel body's values that steer nothing (or None), kept weakly by the jaxpr")

#: Memory spaces whose contents nothing reads back to steer the walk unless a load of
#: them steers it (which makes the analysis give up); every other space (SMEM, or one
#: not known) is scalar memory: a store there steers.
_ARRAY_SPACES = frozenset({"default", "vmem", "any", "hbm"})
_CALLS = frozenset(NESTED_CALLS)


class _GiveUp(Exception):
    """Memory may carry a steering value, or an equation is not understood."""


def _space(atom: Any) -> str | None:
    space = getattr(getattr(atom, "aval", None), "memory_space", None)
    return None if space is None else str(space).lower()


def _is_ref(atom: Any) -> bool:
    return hasattr(getattr(atom, "aval", None), "inner_aval")


def _has_own_rule(prim: Any) -> bool:
    return (RULES.compiler(prim) is not None or RULES.get(prim) is not None
            or str(prim) in RULES.by_name)


class _Analysis:
    def __init__(self) -> None:
        self.steers: set[Any] = set()  # variables whose value steers the walk
        self.pure: set[Any] = set()  # results of pure equations (the candidates)

    def mark(self, atoms: Any) -> None:
        self.steers.update(a for a in atoms if not isinstance(a, jc.Literal))

    def walk(self, jaxpr: Any, outs: list[bool]) -> list[bool]:
        """Which of ``jaxpr``'s inputs steer, given which of its results do."""
        jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
        self.mark(v for v, s in zip(jaxpr.outvars, outs) if s)
        for eqn in reversed(jaxpr.eqns):
            self.equation(eqn)
        return [v in self.steers for v in jaxpr.invars]

    def equation(self, eqn: Any) -> None:
        prim, ins = eqn.primitive, eqn.invars
        outs = [v in self.steers for v in eqn.outvars]
        if prim is jc.while_p:
            self.mark(a for a, s in zip(ins, self._while(eqn, outs)) if s)
        elif prim is jc.scan_p:
            self.mark(a for a, s in zip(ins, self._scan(eqn, outs)) if s)
        elif prim is jc.cond_p:
            self.mark(ins[:1])
            for branch in eqn.params["branches"]:
                self.mark(a for a, s in zip(ins[1:], self.walk(branch, outs)) if s)
        elif prim in _CALLS or prim is jc.run_scoped_p:
            inner = nested_jaxprs(eqn)
            if len(inner) != 1:
                raise _GiveUp
            got = self.walk(inner[0], outs)
            if prim is jc.run_scoped_p:
                self.mark(ins)  # (its operands, if any: the scoped refs' own)
            elif len(got) == len(ins):
                self.mark(a for a, s in zip(ins, got) if s)
            else:
                raise _GiveUp
        elif nested_jaxprs(eqn):
            raise _GiveUp  # a container not known here
        elif prim in REF_ACCESSES:
            self._access(eqn, outs)
        elif eqn.effects or _has_own_rule(prim):
            # DMAs, semaphores, the MXU's state, plugins' rules, prints: all they take
            if prim in DMA_PRIMITIVES and any(_is_ref(a) and _space(a) not in _ARRAY_SPACES
                                              and "sem" not in str(_space(a)) for a in ins):
                raise _GiveUp  # data moved into (or out of) scalar memory
            self.mark(ins)
        else:
            self.pure.update(eqn.outvars)
            if any(outs):
                self.mark(ins)

    def _access(self, eqn: Any, outs: list[bool]) -> None:
        prim, ins = eqn.primitive, eqn.invars
        ref = ins[0]
        array_space = _space(ref) in _ARRAY_SPACES
        if any(outs) and not _space(ref) == "smem":
            raise _GiveUp  # a value read from array memory steers: memory may carry one
        before = INDEXED_ACCESSES.get(prim)
        if before is None:  # (load_p, masked_swap_p: every operand, conservatively)
            self.mark(ins[1:])
            return
        self.mark(ins[before:])  # the indexers
        if before == 2 and not array_space:
            self.mark(ins[1:2])  # a value stored into scalar memory

    def _while(self, eqn: Any, outs: list[bool]) -> list[bool]:
        p = eqn.params
        nc, nb = p["cond_nconsts"], p["body_nconsts"]
        carry = list(outs)
        while True:
            cond_in = self.walk(p["cond_jaxpr"], [True])
            carry = [a or b for a, b in zip(carry, cond_in[nc:])]
            body_in = self.walk(p["body_jaxpr"], carry)
            new = [a or b for a, b in zip(carry, body_in[nb:])]
            if new == carry:
                return [*cond_in[:nc], *body_in[:nb], *carry]
            carry = new

    def _scan(self, eqn: Any, outs: list[bool]) -> list[bool]:
        p = eqn.params
        nconsts, ncarry = p["num_consts"], p["num_carry"]
        carry, ys = list(outs[:ncarry]), list(outs[ncarry:])
        while True:
            body_in = self.walk(p["jaxpr"], [*carry, *ys])
            new = [a or b for a, b in zip(carry, body_in[nconsts:nconsts + ncarry])]
            if new == carry:
                return [*body_in[:nconsts], *carry, *body_in[nconsts + ncarry:]]
            carry = new


def unused_values(jaxpr: Any) -> frozenset[Any] | None:
    """The variables of the kernel body ``jaxpr`` (at any depth) that are results of pure
    equations and steer nothing (see the module docstring), or None where memory may
    carry a steering value (every value is then computed)."""
    key = getattr(jaxpr, "jaxpr", jaxpr)
    if key in _MEMO:
        return _MEMO[key]
    a = _Analysis()
    try:
        a.walk(key, [False] * len(key.outvars))
        found: frozenset[Any] | None = frozenset(a.pure - a.steers)
    except _GiveUp:
        found = None
    _MEMO[key] = found
    return found
