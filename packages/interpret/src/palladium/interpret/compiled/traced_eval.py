"""The one traced evaluator: a kernel body (or a run of its equations) as traced JAX
over a :class:`~palladium.interpret.compiled.traced_state.TracedState`, one rule per
primitive that touches the state, every other equation bound as XLA computes it
(``chip_arithmetic``; a few in a form XLA runs faster, the same values: ``xla_forms``).
A compiled segment (``segment_function.py``) is this evaluator over a run of equations
with no DMA table; a compiled launch (``launch_function.py``) over the whole body at
every grid point, with the DMA table and a grid.

Refs are ``Handle``/``SemHandle`` objects, static while tracing; loops and conditionals
carry the state (``TracedState.carry``). A primitive with no rule here that takes or
returns a ref, or anything not modelled (remote DMAs, semaphore signals, the MXU, prints,
a DMA where the state has no DMA table, a program id where it has no grid, ...), raises
``UnsupportedFeatureError`` while tracing: the equations then run simulated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from palladium.interpret import _jax_compat as jc
from palladium.interpret.compiled import index_math as im
from palladium.interpret.compiled import vector_width, xla_forms
from palladium.interpret.compiled.traced_state import (
    FLAG_BOUNDS,
    FLAG_BUDGET,
    FLAG_LOOP,
    Handle,
    SemHandle,
    TracedState,
    View,
    apply_indexers,
    read_view,
)
from palladium.interpret.errors import UnsupportedFeatureError
from palladium.interpret.eval import chip_arithmetic
from palladium.interpret.eval.jaxprs import any_equation, evaluate
from palladium.interpret.eval.primitive_groups import ACCESS_PRIMITIVES, CALLS, call_body
from palladium.interpret.eval.refs import split_chain, split_transformed, tpu_bitcast
from palladium.interpret.eval.registry import RULES as RULES_OWN
from palladium.interpret.eval.registry import rule_by_name

__all__ = ["CALLS", "RULES", "WHILE_LIMIT", "compile_traced", "run_equation", "run_jaxpr"]

#: Iterations a traced ``while`` loop may run before it raises ``FLAG_LOOP`` (the
#: equations then run simulated, where the watchdog sees a loop that never ends).
WHILE_LIMIT = 1 << 20


Rule = Callable[[Any, list[Any], TracedState], list[Any]]
RULES: dict[Any, Rule] = {}


def _rule(*prims: Any) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for p in prims:
            if p is not None:
                RULES[p] = fn
        return fn
    return register


def compile_traced(fn: Callable[..., Any], specs: Sequence[Any], wide: bool = False) -> Any:
    """``fn`` (a function of traced values built on this evaluator, taking ``specs``)
    compiled for this process's CPU as the chip computes (``chip_function``): the
    executable takes ``chip_arithmetic.NEGATIVE_ZERO`` first, then ``specs``. ``wide``:
    for the host's widest vectors where that keeps every bit (``vector_width.py``)."""
    zero = jax.ShapeDtypeStruct((), chip_arithmetic.NEGATIVE_ZERO.dtype)
    traced = jax.jit(chip_arithmetic.chip_function(fn)).trace(zero, *specs)
    wide = wide and vector_width.WIDE is not None and vector_width.lane_wise(traced.jaxpr)
    options = vector_width.WIDE if wide else None
    return traced.lower().compile(compiler_options=options)


def run_jaxpr(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], st: TracedState
              ) -> list[Any]:
    """Evaluate ``jaxpr`` on traced values and handles, updating ``st``."""
    return evaluate(jaxpr, consts, args, lambda eqn, invals: run_equation(eqn, invals, st))


def run_equation(eqn: Any, invals: list[Any], st: TracedState) -> list[Any]:
    """One equation's results on traced values and handles, updating ``st``."""
    rule = RULES.get(eqn.primitive)
    return rule(eqn, invals, st) if rule is not None else _bind(eqn, invals)


def _bind(eqn: Any, invals: list[Any]) -> list[Any]:
    """A pure equation, as XLA computes it. A primitive the simulator evaluates with a
    rule of its own (the MXU, PRNG, semaphores, ...) has no XLA meaning to trust."""
    prim = eqn.primitive
    if (RULES_OWN.get(prim) is not None or RULES_OWN.compiler(prim) is not None or eqn.effects
            or (RULES_OWN.by_name and rule_by_name(prim) is not None) or any(isinstance(x, Handle | SemHandle | jc.TransformedRef) for x in invals)):
        raise UnsupportedFeatureError(f"the traced evaluator has no rule for '{prim}'")
    form = xla_forms.FORMS.get(prim)  # (the same values, faster code: ``xla_forms``)
    if form is not None:
        return form(invals, prim.get_bind_params(eqn.params))
    return chip_arithmetic.bind(prim, invals, prim.get_bind_params(eqn.params))


# --- ref accesses ------------------------------------------------------------------------
def _access(value: Any, transforms: Sequence[Any], st: TracedState,
            reshaped: list[Any] | None = None) -> tuple[int, View]:
    """The buffer and region an access reaches. With ``reshaped`` (a read), the chain may
    reshape the ref: the region is the one before the first reshape (what the simulator
    reads and checks), and the transforms from the reshape on are appended to
    ``reshaped``, to apply to the value read."""
    ref, own = split_transformed(value)
    if not isinstance(ref, Handle):
        raise UnsupportedFeatureError("a compiled launch accesses buffers only")
    # as the simulator splits it (``eval.refs.split_chain``)
    cast, region, rest = split_chain([*own, *transforms], st.bufs[ref.buf].dtype)
    if (cast is not None or rest) and reshaped is None:
        raise UnsupportedFeatureError("a compiled launch writes or copies no "
                                      + ("bitcast ref" if cast is not None else
                                         "reshaped or bitcast ref"))
    if reshaped is not None:
        reshaped.extend([*([] if cast is None else [cast]), *rest])  # (the cast first)
    view, ok = apply_indexers(View.whole(st.bufs[ref.buf].shape), region)
    st.raise_flag(FLAG_BOUNDS, im.negate(ok))
    st.logged(view)
    return ref.buf, view


def _reshaped_value(value: Any, transforms: list[Any], st: TracedState) -> Any:
    """``value`` (a region read) through a reshaped or bitcast ref's further transforms
    (a dtype: an in-place cast to a type of the same width)."""
    for t in transforms:
        if isinstance(t, jc.ReshapeTransform):
            value = value.reshape(tuple(int(n) for n in t.shape))
            continue
        if isinstance(t, np.dtype | jc.BitcastTransform):
            value = tpu_bitcast(value, getattr(t, "dtype", t), lax.bitcast_convert_type)
            continue
        view, ok = apply_indexers(View.whole(value.shape), [t])
        st.raise_flag(FLAG_BOUNDS, im.negate(ok))
        value = read_view(value, view)
    return value


def _load(ref: Any, transforms: Sequence[Any], st: TracedState) -> Any:
    """A read through ``ref`` and ``transforms`` (a reshaped ref included), checked."""
    reshaped: list[Any] = []
    buf, view = _access(ref, transforms, st, reshaped)
    st.check_access(buf, view, write=False)
    return _reshaped_value(read_view(st.bufs[buf], view), reshaped, st)


def _update(ref: Any, transforms: Sequence[Any], st: TracedState,
            new: Callable[[Any], Any], reads: bool = True) -> Any:
    """Store ``new(old contents)`` through ``ref`` and ``transforms``, checked (``reads``:
    the old contents are used); the old contents."""
    buf, view = _access(ref, transforms, st)
    st.check_access(buf, view, write=True, reads=reads)
    old = read_view(st.bufs[buf], view)
    st.store(buf, view, new(old))
    return old


@_rule(jc.get_p)
def _get(eqn: Any, invals: list[Any], st: TracedState) -> list[Any]:
    value = _load(invals[0], eqn.params["tree"].unflatten(invals[1:]), st)
    return [value.astype(eqn.outvars[0].aval.dtype)]


@_rule(jc.swap_p, jc.addupdate_p)
def _put(eqn: Any, invals: list[Any], st: TracedState) -> list[Any]:
    ref, value, *idx = invals
    add = eqn.primitive is jc.addupdate_p
    old = _update(ref, eqn.params["tree"].unflatten(idx), st,
                  lambda old: (old + value).astype(old.dtype) if add else value,
                  add or st.old_read is None or eqn.outvars[0] in st.old_read)
    return [] if add else [old]


@_rule(jc.load_p, jc.masked_swap_p)
def _masked(eqn: Any, invals: list[Any], st: TracedState) -> list[Any]:
    """``pltpu.load``/``pltpu.store`` (``pl.load``/``pl.store``): an access with an
    optional mask. The region is checked whole (bounds and DMAs in flight), even where
    masked off: a masked-off element out of bounds raises a flag, and the simulator,
    which reads only the True elements, decides."""
    ref, transforms, third, fourth = eqn.params["args_tree"].unflatten(invals)
    if st.masks is not None:
        raise UnsupportedFeatureError("a masked access where masks of initialised elements are kept")
    if eqn.primitive is jc.load_p:
        mask, other = third, fourth
        if mask is not None and other is None:
            raise UnsupportedFeatureError("a masked load without a fill value")
        data = _load(ref, transforms, st)
        if mask is not None:
            data = jnp.where(mask, data, jnp.asarray(other, data.dtype))
        return [data.astype(eqn.outvars[0].aval.dtype)]
    value, mask = third, fourth
    return [_update(ref, transforms, st, lambda old: value if mask is None else
                    jnp.where(mask, jnp.asarray(value, old.dtype), old))]


# --- grid ---------------------------------------------------------------------------------
def _grid(st: TracedState) -> Any:
    if st.grid is None:
        raise UnsupportedFeatureError("a program id outside a traced grid")
    return st.grid


@_rule(jc.program_id_p)
def _program_id(eqn: Any, invals: list[Any], st: TracedState) -> list[Any]:
    return [jnp.asarray(_grid(st).ids[eqn.params["axis"]], jnp.int32)]


@_rule(jc.num_programs_p)
def _num_programs(eqn: Any, invals: list[Any], st: TracedState) -> list[Any]:
    return [jnp.int32(_grid(st).counts[eqn.params["axis"]])]


@_rule(jc.multiple_of_p)
def _multiple_of(eqn: Any, invals: list[Any], st: TracedState) -> list[Any]:
    return [invals[0]]


@_rule(jc.tpu_bitcast_p)
def _bitcast(eqn: Any, invals: list[Any], st: TracedState) -> list[Any]:
    return [tpu_bitcast(invals[0], eqn.outvars[0].aval.dtype, lax.bitcast_convert_type)]


# --- DMAs -----------------------------------------------------------------------------------
def _semaphore(value: Any, st: TracedState) -> Any:
    ref, transforms = split_transformed(value)
    if not isinstance(ref, SemHandle):
        raise UnsupportedFeatureError("a compiled launch takes semaphore arrays only")
    view, ok = apply_indexers(View.whole(ref.shape), transforms)
    st.raise_flag(FLAG_BOUNDS, im.negate(ok))
    if view.shape != ():
        raise UnsupportedFeatureError("a DMA on an array of semaphores")
    flat: Any = 0
    for start, n in zip(view.starts, ref.shape):
        flat = im.add(im.mul(flat, n), start)
    return im.traced_index(im.add(ref.base, flat))


def _dma_parts(eqn: Any, invals: list[Any], st: TracedState) -> tuple[Any, ...]:
    """(source, destination, semaphore, bytes, the DMA table) of a DMA."""
    if st.dma is None:
        raise UnsupportedFeatureError("a DMA where the traced state has no DMA table")
    src, dst, dst_sem, src_sem, device_id = jc.dma_operands(eqn.params["tree"], invals)
    if device_id is not None or src_sem is not None:
        raise UnsupportedFeatureError("a compiled launch runs no remote DMA")
    s = _access(src, (), st)
    d = _access(dst, (), st)
    if st.bufs[s[0]].dtype != st.bufs[d[0]].dtype or s[1].shape != d[1].shape:
        raise UnsupportedFeatureError("a DMA between views of other shapes or dtypes")
    nbytes = int(np.prod(s[1].shape, dtype=np.int64)) * np.dtype(st.bufs[s[0]].dtype).itemsize
    return s, d, _semaphore(dst_sem, st), nbytes, st.dma


@_rule(jc.dma_start_p)
def _dma_start(eqn: Any, invals: list[Any], st: TracedState) -> list[Any]:
    if eqn.params.get("add", False):
        raise UnsupportedFeatureError("a compiled launch runs no DMA that adds")
    (sbuf, sview), (dbuf, dview), sem, nbytes, table = _dma_parts(eqn, invals, st)
    table.start(st, (sbuf, sview), (dbuf, dview), sem, nbytes)
    st.store(dbuf, dview, read_view(st.bufs[sbuf], sview))
    return []


@_rule(jc.dma_wait_p)
def _dma_wait(eqn: Any, invals: list[Any], st: TracedState) -> list[Any]:
    _s, _d, sem, nbytes, table = _dma_parts(eqn, invals, st)
    table.wait(st, sem, nbytes)
    return []


# --- control flow ---------------------------------------------------------------------------
@_rule(*CALLS)
def _call(eqn: Any, invals: list[Any], st: TracedState) -> list[Any]:
    return run_jaxpr(call_body(eqn), [], invals, st)


def _split(values: Sequence[Any]) -> tuple[list[int], list[Any]]:
    """(positions of the handles, the traced values) of ``values``."""
    handles = [i for i, v in enumerate(values) if isinstance(v, Handle | SemHandle)]
    return handles, [v for i, v in enumerate(values) if i not in handles]


def _join(values: Sequence[Any], handles: list[int], traced: Sequence[Any]) -> list[Any]:
    it = iter(traced)
    return [values[i] if i in handles else next(it) for i in range(len(values))]


#: What a branch run unconditionally may not hold: control flow, DMA starts (``_predicable``).
_NOT_PREDICATED = (jc.cond_p, jc.while_p, jc.scan_p, jc.run_scoped_p, jc.dma_start_p)


def _predicable(branches: Sequence[Any], st: TracedState) -> bool:
    """Whether a conditional is a ``pl.when``-like one to run unconditionally: two
    branches, the first without equations, the second without control flow or DMA
    starts, in a state with a DMA table and no access log or masks (whose updates it
    does not condition). A DMA start, predicated, copies at every step, taken or not
    (paged attention's first-block prefetch, 8 pages: ~25% of its steady call)."""
    return (len(branches) == 2 and not branches[0].jaxpr.eqns and st.dma is not None
            and st.log is None and st.masks is None and st.pred is None
            and not any_equation(branches[1], lambda e: e.primitive in _NOT_PREDICATED))


def _predicated(branches: Sequence[Any], index: Any, args: list[Any], st: TracedState
                ) -> list[Any]:
    """A ``pl.when``-like conditional run unconditionally, its stores, DMA waits and flags
    conditioned on it: no ``lax.cond`` carrying buffers (XLA may copy them in and out)."""
    pred, table = jnp.clip(jnp.asarray(index, jnp.int32), 0, 1) == 1, st.dma
    assert table is not None  # (``_predicable``; no branch or loop inside replaces it)
    table.flush(st)
    before = table.arrays()
    st.pred = pred
    try:
        taken = run_jaxpr(branches[1], [], args, st)
        table.flush(st)
    finally:
        st.pred = None
    sems, rows, started = (a if a is b else jnp.where(pred, a, b)
                           for a, b in zip(table.arrays(), before))
    st.dma = table.of((sems, rows, started))
    skipped = run_jaxpr(branches[0], [], args, st)
    if any(isinstance(o, Handle | SemHandle) for o in (*taken, *skipped)):
        raise UnsupportedFeatureError("a conditional that returns a ref")
    return [jnp.where(pred, a, b) for a, b in zip(taken, skipped)]


@_rule(jc.cond_p)
def _cond(eqn: Any, invals: list[Any], st: TracedState) -> list[Any]:
    index, *args = invals
    if _predicable(eqn.params["branches"], st):
        return _predicated(eqn.params["branches"], index, args, st)
    handles, traced = _split(args)

    def branch(jaxpr: Any) -> Callable[..., Any]:
        def run(operands: Any) -> Any:
            carry, traced = operands
            inner = st.child(carry)
            out = run_jaxpr(jaxpr, [], _join(args, handles, traced), inner)
            if any(isinstance(o, Handle | SemHandle) for o in out):
                raise UnsupportedFeatureError("a conditional that returns a ref")
            return out, inner.carry()
        return run

    branches = eqn.params["branches"]
    index = jnp.clip(jnp.asarray(index, jnp.int32), 0, len(branches) - 1)
    out, carry = lax.switch(index, [branch(b) for b in branches], (st.carry(), traced))
    st.restore(carry)
    return list(out)


@_rule(jc.while_p)
def _while(eqn: Any, invals: list[Any], st: TracedState) -> list[Any]:
    """The loop's test runs as often as the simulator runs it (before the first iteration
    and after each): its value and the flags its reads raise (bounds, DMAs in flight) are
    carried, so a test that reads refs keeps its checks. A test that writes, or starts
    or waits for a DMA, is not modelled."""
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, init = invals[:nc], invals[nc: nc + nb], invals[nc + nb:]
    if any(isinstance(v, Handle | SemHandle) for v in init):
        raise UnsupportedFeatureError("a loop that carries a ref")
    if any_equation(p["cond_jaxpr"].jaxpr, lambda e: e.primitive in ACCESS_PRIMITIVES
                    and e.primitive is not jc.get_p):
        raise UnsupportedFeatureError("a loop whose test writes a ref or moves data")

    def test(state: TracedState, values: Any) -> Any:
        return run_jaxpr(p["cond_jaxpr"], [], [*cconsts, *values], state)[0]

    def keep_going(c: Any) -> Any:
        n, going, carry, _ = c
        more = going & (n < WHILE_LIMIT)
        loops = carry[-1]  # (``TracedState.carry``'s last: iterations so far, or None)
        return more if loops is None else more & (loops <= st.budget)

    def body(c: Any) -> Any:
        n, _, carry, values = c
        inner = st.child(carry)
        if inner.loops is not None:
            inner.loops = inner.loops + 1
        values = run_jaxpr(p["body_jaxpr"], [], [*bconsts, *values], inner)
        going = test(inner, values)  # (its reads' flags go into inner's)
        return n + 1, going, inner.carry(), values

    going = test(st, init)
    _, going, carry, values = lax.while_loop(
        keep_going, body, (jnp.int32(0), jnp.asarray(going, jnp.bool_), st.carry(), list(init)))
    st.restore(carry)
    if st.loops is not None:  # (stopped by the budget: the flags say nothing more)
        st.raise_flag(FLAG_BUDGET, st.loops > st.budget)
    st.raise_flag(FLAG_LOOP, going)  # stopped by the limit
    return list(values)


@_rule(jc.scan_p)
def _scan(eqn: Any, invals: list[Any], st: TracedState) -> list[Any]:
    p = eqn.params
    nc, ncarry = p["num_consts"], p["num_carry"]
    consts, init, xs = invals[:nc], invals[nc: nc + ncarry], invals[nc + ncarry:]
    if any(isinstance(v, Handle | SemHandle) for v in (*init, *xs)):
        raise UnsupportedFeatureError("a loop that carries a ref")

    def body(c: Any, x: Any) -> Any:
        carry, values = c
        inner = st.child(carry, log=True)
        out = run_jaxpr(p["jaxpr"], [], [*consts, *values, *x], inner)
        return (inner.carry(), out[:ncarry]), (out[ncarry:], inner.log or [])

    (carry, values), (ys, log) = lax.scan(body, (st.carry(), list(init)), list(xs),
                                          length=p["length"], reverse=p["reverse"],
                                          unroll=p.get("unroll", 1))
    st.restore(carry)
    if st.log is not None:
        st.log.extend(log)  # one array per access, stacked over the iterations
    return [*values, *ys]


@_rule(jc.run_scoped_p)
def _run_scoped(eqn: Any, invals: list[Any], st: TracedState) -> list[Any]:
    raise UnsupportedFeatureError("a compiled launch allocates no scoped buffer")
