"""A kernel-body segment as one pure function for XLA: its refs become arrays.

:func:`segment_function` turns a run of equations (pure array code, ``ref[...]`` loads
and stores, and loops, conditionals and calls made of the same) into a function of the
segment's input values and the contents of the refs it touches, returning the
segment's live results, the refs' new contents and one flag: every ref access was
within its buffer, and every ``while`` loop ended within ``WHILE_LIMIT`` iterations.
``jax.jit`` compiles it (``segments.py``). A false flag means the results are not
used: the segment runs again equation by equation, and that path reports the
out-of-bounds access or runs the loop under the watchdog exactly as it always did.

Which equations may be in a segment is :func:`fusible`: one rule per kind of equation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval import chip_arithmetic
from palladium.interpret.eval.jaxprs import evaluate, nested_jaxprs
from palladium.interpret.eval.primitive_groups import CALLS, INDEXED_ACCESSES, call_body

__all__ = ["WHILE_LIMIT", "fusible", "is_ref", "segment_function"]

#: Iterations a compiled ``while`` loop may run before the segment gives up and runs
#: equation by equation (where the watchdog sees a loop that never ends).
WHILE_LIMIT = 1 << 20



def is_ref(atom: Any) -> bool:
    return isinstance(getattr(atom, "aval", None), jc.AbstractRef)


def _plain_indexer(eqn: Any, n_lead: int) -> bool:
    """Whether an access's transforms are one ``NDIndexer`` of unit-stride slices of
    static size and scalar indices (what ``dynamic_slice`` expresses)."""
    transforms = eqn.params["tree"].unflatten(eqn.invars[n_lead:])
    if len(transforms) > 1 or any(not isinstance(t, jc.NDIndexer) for t in transforms):
        return False
    for t in transforms:
        for i in t.indices:
            if isinstance(i, jc.Slice):
                if i.stride != 1 or not isinstance(i.size, int | np.integer):
                    return False
            elif getattr(getattr(i, "aval", None), "shape", None) != () and not isinstance(
                    i, int | np.integer):
                return False
    return True


def fusible(eqn: Any, has_own_rule: Callable[[Any], bool]) -> bool:
    """Whether ``eqn`` can run inside a compiled segment. ``has_own_rule(primitive)``:
    the interpreter evaluates that primitive itself (DMAs, semaphores, program ids, ...),
    so it must stay outside."""
    prim = eqn.primitive
    if prim in INDEXED_ACCESSES:
        return (not is_ref(eqn.outvars[0]) and
                _plain_indexer(eqn, INDEXED_ACCESSES[prim]))
    if prim is jc.while_p and any(e.primitive in INDEXED_ACCESSES for e in eqn.params["cond_jaxpr"].jaxpr.eqns):
        return False  # a loop test that reads a ref: its bounds are checked one by one
    if prim in (jc.scan_p, jc.while_p, jc.cond_p, *CALLS):
        return all(fusible(e, has_own_rule) for j in nested_jaxprs(eqn) for e in j.eqns)
    if has_own_rule(prim) or eqn.effects:
        return False
    return not any(is_ref(a) for a in (*eqn.invars, *eqn.outvars))


class _Tracking:
    """Which refs' masks of initialised elements a state carries (``at``: ref handle ->
    position in ``values``) and the swaps whose old value something reads."""

    def __init__(self, at: dict[int, int], old_read: set[Any]) -> None:
        self.at = at
        self.old_read = old_read


class _State:
    """The refs' contents (traced), the all-accesses-in-bounds flag and, for the race
    detector, the log of every access's start indices (None: no log). ``track``: per
    tracked ref, where in ``values`` (after the contents) its mask of initialised
    elements is (``uninitialized_reads="on_use"``: a store sets its region's, a read of
    an element not set clears ``ok``); None: nothing tracked."""

    def __init__(self, values: list[Any], ok: Any, log: list[Any] | None = None,
                 track: _Tracking | None = None) -> None:
        self.values = values
        self.ok = ok
        self.log = log
        self.track = track


def _window(state: _State, handle: int, transforms: Sequence[Any]) -> tuple[list[Any], list[int], list[int]]:
    """(starts, sizes, dropped dimensions) of an access; checks its bounds."""
    shape = state.values[handle].shape
    if not transforms:
        if state.log is not None:
            state.log.append(jnp.zeros((len(shape),), jnp.int32))
        return [0] * len(shape), list(shape), []
    starts, sizes, dropped = [], [], []
    for d, (i, n) in enumerate(zip(transforms[0].indices, shape)):
        if isinstance(i, jc.Slice):
            start, size = i.start, int(i.size)
        else:
            start, size = i, 1
            dropped.append(d)
        start = jnp.asarray(start, jnp.int32)
        state.ok = state.ok & (start >= 0) & (start <= n - size)
        starts.append(start)
        sizes.append(size)
    if state.log is not None:
        state.log.append(jnp.stack(starts) if starts else jnp.zeros((0,), jnp.int32))
    return starts, sizes, dropped


def _get(state: _State, handle: int, transforms: Sequence[Any]) -> Any:
    starts, sizes, dropped = _window(state, handle, transforms)
    at = None if state.track is None else state.track.at.get(handle)
    if at is not None:  # a read of an element nothing initialised: not here
        state.ok = state.ok & jnp.all(lax.dynamic_slice(state.values[at], starts, sizes))
    value = lax.dynamic_slice(state.values[handle], starts, sizes)
    return value.reshape([s for d, s in enumerate(sizes) if d not in dropped])


def _put(state: _State, handle: int, transforms: Sequence[Any], value: Any, add: bool,
         old_used: bool = True) -> Any:
    starts, sizes, dropped = _window(state, handle, transforms)
    array = state.values[handle]
    old = lax.dynamic_slice(array, starts, sizes)
    new = jnp.broadcast_to(jnp.asarray(value, array.dtype),
                           [s for d, s in enumerate(sizes) if d not in dropped]).reshape(sizes)
    if add:
        new = (old + new).astype(array.dtype)
    state.values[handle] = lax.dynamic_update_slice(array, new, starts)
    at = None if state.track is None else state.track.at.get(handle)
    if at is not None:
        if add or old_used:  # the old contents are read
            state.ok = state.ok & jnp.all(lax.dynamic_slice(state.values[at], starts, sizes))
        mask = state.values[at]
        state.values[at] = (jnp.bool_(True) if mask.ndim == 0 else  # (a ref stored whole)
                            lax.dynamic_update_slice(mask, jnp.ones(sizes, bool), starts))
    return old.reshape([s for d, s in enumerate(sizes) if d not in dropped])


def _read(env: dict[Any, Any], atom: Any) -> Any:
    return atom.val if isinstance(atom, jc.Literal) else env[atom]


def _run(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], state: _State) -> list[Any]:
    """Evaluate ``jaxpr`` (refs given as handles: ints into ``state.values``)."""
    return evaluate(jaxpr, consts, args, lambda eqn, invals: _eqn(eqn, invals, state))


def _eqn(eqn: Any, invals: list[Any], state: _State) -> list[Any]:
    prim, p = eqn.primitive, eqn.params
    if prim is jc.get_p:
        value = _get(state, invals[0], p["tree"].unflatten(invals[1:]))
        return [value.astype(eqn.outvars[0].aval.dtype)]
    if prim is jc.swap_p or prim is jc.addupdate_p:
        ref, val, *idx = invals
        old = _put(state, ref, p["tree"].unflatten(idx), val, prim is jc.addupdate_p,
                   state.track is not None and eqn.outvars[0] in state.track.old_read)
        return [old] if prim is jc.swap_p else []
    if prim is jc.scan_p:
        return _scan(eqn, invals, state)
    if prim is jc.while_p:
        return _while(eqn, invals, state)
    if prim is jc.cond_p:
        return _cond(eqn, invals, state)
    if prim in CALLS:
        return _run(call_body(eqn), [], invals, state)
    return chip_arithmetic.bind(prim, invals, prim.get_bind_params(p))


def _scan(eqn: Any, invals: list[Any], state: _State) -> list[Any]:
    p = eqn.params
    nc, ncarry = p["num_consts"], p["num_carry"]
    consts, carry, xs = invals[:nc], invals[nc: nc + ncarry], invals[nc + ncarry:]

    def body(c: Any, x: Any) -> Any:
        carry, values, ok = c
        inner = _State(list(values), ok, None if state.log is None else [], state.track)
        out = _run(p["jaxpr"], [], [*consts, *carry, *x], inner)
        return (out[:ncarry], inner.values, inner.ok), (out[ncarry:], inner.log or [])

    (carry, values, ok), (ys, log) = lax.scan(body, (list(carry), state.values, state.ok), list(xs),
                                       length=p["length"], reverse=p["reverse"])
    state.values, state.ok = list(values), ok
    if state.log is not None:
        state.log.extend(log)  # one array per access, stacked over the iterations
    return [*carry, *ys]


def _while(eqn: Any, invals: list[Any], state: _State) -> list[Any]:
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = invals[:nc], invals[nc: nc + nb], invals[nc + nb:]

    def test(values: Any, carry: Any) -> Any:
        return _run(p["cond_jaxpr"], [], [*cconsts, *carry],
                    _State(list(values), ok=True, track=state.track))[0]

    def keep_going(c: Any) -> Any:
        n, carry, values, _ = c
        return test(values, carry) & (n < WHILE_LIMIT)

    def body(c: Any) -> Any:
        n, carry, values, ok = c
        inner = _State(list(values), ok, track=state.track)
        carry = _run(p["body_jaxpr"], [], [*bconsts, *carry], inner)
        return n + 1, carry, inner.values, inner.ok

    _, carry, values, ok = lax.while_loop(
        keep_going, body, (jnp.int32(0), list(carry), state.values, state.ok))
    state.values = list(values)
    state.ok = ok & ~test(values, carry)  # stopped by the limit: not finished
    return list(carry)


def _cond(eqn: Any, invals: list[Any], state: _State) -> list[Any]:
    index, *args = invals
    branches = eqn.params["branches"]
    refs = [i for i, a in enumerate(eqn.invars[1:]) if is_ref(a)]
    plain = [a for i, a in enumerate(args) if i not in refs]

    def branch(jaxpr: Any) -> Callable[..., Any]:
        def run(operands: Any) -> Any:
            values, ok, plain = operands
            it = iter(plain)
            full = [args[i] if i in refs else next(it) for i in range(len(args))]
            inner = _State(list(values), ok, track=state.track)
            out = _run(jaxpr, [], full, inner)
            return out, inner.values, inner.ok
        return run

    index = jnp.clip(jnp.asarray(index, jnp.int32), 0, len(branches) - 1)
    out, values, ok = lax.switch(index, [branch(b) for b in branches],
                                 (state.values, state.ok, plain))
    state.values, state.ok = list(values), ok
    return list(out)


class _Everything:
    def __contains__(self, item: Any) -> bool:
        return True


_ALL: Any = _Everything()


def segment_function(eqns: Sequence[Any], inputs: Sequence[Any], refs: Sequence[Any],
                     outputs: Sequence[Any], written: Sequence[int],
                     log: bool = False, tracked: dict[int, str] | None = None,
                     used: set[Any] | None = None) -> Callable[..., Any]:
    """The segment as ``f(*input_values, *ref_contents) -> (outputs, new contents of the
    refs ``written`` (by position in ``refs``), ok)``; with ``log``, a fourth result: the
    start indices of every access, in the order of :func:`access_log_plan`. With
    ``tracked`` (ref position -> ``"read"``: the segment reads it, ``"written"``: it only
    writes it, ``"whole"``: it only writes all of it), the tracked refs' masks of
    initialised elements: ``f`` takes those of the refs it reads after the contents (the
    others start empty; a ref written whole has one flag for a mask) and returns, last,
    those of the tracked refs ``written`` (in that order); a read of an element no mask holds makes ``ok`` false
    (the segment runs equation by equation, where values carry shadows); ``used``: the
    variables something reads (a swap whose old value is not among them reads nothing)."""
    handles = {r: i for i, r in enumerate(refs)}
    n = len(refs)
    order = sorted(tracked or {})

    def f(*args: Any) -> Any:
        values, contents = args[: len(inputs)], args[len(inputs): len(inputs) + n]
        given = iter(args[len(inputs) + n:])
        env: dict[Any, Any] = dict(zip(inputs, values))
        env.update(handles)
        masks = [next(given) if tracked[i] == "read" else jnp.bool_(False)
                 if tracked[i] == "whole" else jnp.zeros(contents[i].shape, bool)
                 for i in order] if tracked else []
        state = _State([*contents, *masks], jnp.bool_(True), [] if log else None,
                       _Tracking({i: n + k for k, i in enumerate(order)},
                                 set(used) if used is not None else _ALL)
                       if tracked else None)
        for eqn in eqns:
            outs = _eqn(eqn, [_read(env, a) for a in eqn.invars], state)
            for v, o in zip(eqn.outvars, outs):
                env[v] = o
        result: tuple[Any, ...] = (
            [_read(env, a) for a in outputs], [state.values[i] for i in written], state.ok)
        if log:
            result = (*result, state.log)
        if tracked:
            where = {i: n + k for k, i in enumerate(order)}
            result = (*result, [state.values[where[i]] for i in written if i in where])
        return result

    return f
