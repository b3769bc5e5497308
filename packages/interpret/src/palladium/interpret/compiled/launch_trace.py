"""A kernel body traced for a compiled launch: one rule per primitive that touches the
simulated state (``launch_state.py``), every other equation bound as it is.

Refs are ``Handle``/``SemHandle`` objects, static while tracing; loops and conditionals
carry the whole ``LaunchState``. A primitive with no rule here that takes or returns a
ref, or anything a compiled launch does not model (remote DMAs, semaphore signals, the
MXU, prints, ...), raises ``UnsupportedFeatureError`` while tracing: the kernel then
always runs simulated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from palladium.interpret import _jax_compat as jc
from palladium.interpret.compiled import index_math as im
from palladium.interpret.compiled.launch_state import (
    FLAG_BOUNDS,
    FLAG_LOOP,
    Handle,
    LaunchState,
    SemHandle,
    View,
    apply_indexers,
    read_view,
    write_view,
)
from palladium.interpret.errors import UnsupportedFeatureError
from palladium.interpret.eval import chip_arithmetic
from palladium.interpret.eval.jaxprs import any_equation, evaluate
from palladium.interpret.eval.primitive_groups import ACCESS_PRIMITIVES, CALLS, call_body
from palladium.interpret.eval.refs import split_transformed
from palladium.interpret.eval.registry import RULES as RULES_OWN
from palladium.interpret.eval.registry import rule_by_name
from palladium.interpret.eval.segment_trace import WHILE_LIMIT

__all__ = ["GridContext", "run_jaxpr"]



class GridContext:
    """What ``pl.program_id`` and ``pl.num_programs`` answer at the traced grid point
    (``ids[axis]``: the program id of grid axis ``axis``)."""

    def __init__(self, ids: Any, counts: Sequence[int]) -> None:
        self.ids, self.counts = ids, list(counts)


Rule = Callable[[Any, list[Any], LaunchState, GridContext], list[Any]]
RULES: dict[Any, Rule] = {}


def _rule(*prims: Any) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for p in prims:
            if p is not None:
                RULES[p] = fn
        return fn
    return register


def run_jaxpr(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], st: LaunchState,
              grid: GridContext) -> list[Any]:
    """Evaluate ``jaxpr`` on traced values and handles, updating ``st``."""
    def equation(eqn: Any, invals: list[Any]) -> list[Any]:
        rule = RULES.get(eqn.primitive)
        return rule(eqn, invals, st, grid) if rule is not None else _bind(eqn, invals)

    return evaluate(jaxpr, consts, args, equation)


def _bind(eqn: Any, invals: list[Any]) -> list[Any]:
    """A pure equation, as XLA computes it. A primitive the simulator evaluates with a
    rule of its own (the MXU, PRNG, semaphores, ...) has no XLA meaning to trust."""
    prim = eqn.primitive
    if (RULES_OWN.get(prim) is not None or RULES_OWN.compiler(prim) is not None or eqn.effects
            or (RULES_OWN.by_name and rule_by_name(prim) is not None) or any(isinstance(x, Handle | SemHandle | jc.TransformedRef) for x in invals)):
        raise UnsupportedFeatureError(f"a compiled launch has no rule for '{prim}'")
    return chip_arithmetic.bind(prim, invals, prim.get_bind_params(eqn.params))


# --- ref accesses ------------------------------------------------------------------------
def _access(value: Any, transforms: Sequence[Any], st: LaunchState,
            reshaped: list[Any] | None = None) -> tuple[int, View]:
    """The buffer and region an access reaches. With ``reshaped`` (a read), the chain may
    reshape the ref: the region is the one before the first reshape (what the simulator
    reads and checks), and the transforms from the reshape on are appended to
    ``reshaped``, to apply to the value read."""
    ref, own = split_transformed(value)
    if not isinstance(ref, Handle):
        raise UnsupportedFeatureError("a compiled launch accesses buffers only")
    chain = [*own, *transforms]
    # As the simulator (``eval.refs.resolve``): a bitcast to a type of the same width
    # before any reshape or other bitcast reinterprets elements in place (the indexers
    # after it still narrow the region); the region read is the one before the first
    # reshape or other bitcast, whose transforms apply to the value read.
    dtype = np.dtype(st.bufs[ref.buf].dtype)
    lead: list[Any] = []
    for i, t in enumerate(chain):
        if isinstance(t, jc.ReshapeTransform):
            break
        if isinstance(t, jc.BitcastTransform):
            if np.dtype(t.dtype).itemsize != dtype.itemsize:
                break
            dtype = np.dtype(t.dtype)
            lead.append(i)
    if lead:
        if reshaped is None:
            raise UnsupportedFeatureError("a compiled launch writes or copies no bitcast ref")
        reshaped.append(dtype)  # the in-place cast, first
        chain = [t for i, t in enumerate(chain) if i not in lead]
    cut = next((i for i, t in enumerate(chain)
                if isinstance(t, jc.ReshapeTransform | jc.BitcastTransform)), len(chain))
    if cut < len(chain):
        if reshaped is None:
            raise UnsupportedFeatureError(
                "a compiled launch writes or copies no reshaped or bitcast ref")
        reshaped.extend(chain[cut:])
    view, ok = apply_indexers(View.whole(st.bufs[ref.buf].shape), chain[:cut])
    st.raise_flag(FLAG_BOUNDS, im.negate(ok))
    return ref.buf, view


def _reshaped_value(value: Any, transforms: list[Any], st: LaunchState) -> Any:
    """``value`` (a region read) through a reshaped or bitcast ref's further transforms
    (a dtype: an in-place cast to a type of the same width)."""
    for t in transforms:
        if isinstance(t, jc.ReshapeTransform):
            value = value.reshape(tuple(int(n) for n in t.shape))
            continue
        if isinstance(t, np.dtype | jc.BitcastTransform):
            value = _tpu_bitcast(value, np.dtype(getattr(t, "dtype", t)))
            continue
        view, ok = apply_indexers(View.whole(value.shape), [t])
        st.raise_flag(FLAG_BOUNDS, im.negate(ok))
        value = read_view(value, view)
    return value


def _tpu_bitcast(x: Any, dtype: np.dtype) -> Any:
    """``eval.refs.tpu_bitcast`` traced: a change of bit width scales the second-minor
    dimension (32 -> 16 bits: row ``i`` becomes rows ``2i, 2i+1``, low half first)."""
    xb, yb = np.dtype(x.dtype).itemsize, dtype.itemsize
    if xb == yb:
        return lax.bitcast_convert_type(x, dtype)
    if x.ndim < 2:
        raise UnsupportedFeatureError("bitcast of a rank-1 ref with a bit width change")
    *lead, n, m = x.shape
    if xb < yb:
        r = yb // xb
        packed = x.reshape(*lead, n // r, r, m).swapaxes(-1, -2)
        return lax.bitcast_convert_type(packed, dtype)
    r = xb // yb
    return lax.bitcast_convert_type(x, dtype).swapaxes(-1, -2).reshape(*lead, n * r, m)


def _load(ref: Any, transforms: Sequence[Any], st: LaunchState) -> Any:
    """A read through ``ref`` and ``transforms`` (a reshaped ref included), checked."""
    reshaped: list[Any] = []
    buf, view = _access(ref, transforms, st, reshaped)
    st.check_access(buf, view, write=False)
    return _reshaped_value(read_view(st.bufs[buf], view), reshaped, st)


def _update(ref: Any, transforms: Sequence[Any], st: LaunchState,
            new: Callable[[Any], Any]) -> Any:
    """Store ``new(old contents)`` through ``ref`` and ``transforms``, checked; the old
    contents."""
    buf, view = _access(ref, transforms, st)
    st.check_access(buf, view, write=True)
    old = read_view(st.bufs[buf], view)
    st.write(buf, write_view(st.bufs[buf], view, new(old)))
    return old


@_rule(jc.get_p)
def _get(eqn: Any, invals: list[Any], st: LaunchState, grid: GridContext) -> list[Any]:
    value = _load(invals[0], eqn.params["tree"].unflatten(invals[1:]), st)
    return [value.astype(eqn.outvars[0].aval.dtype)]


@_rule(jc.swap_p, jc.addupdate_p)
def _put(eqn: Any, invals: list[Any], st: LaunchState, grid: GridContext) -> list[Any]:
    ref, value, *idx = invals
    add = eqn.primitive is jc.addupdate_p
    old = _update(ref, eqn.params["tree"].unflatten(idx), st,
                  lambda old: (old + value).astype(old.dtype) if add else value)
    return [] if add else [old]


@_rule(jc.load_p, jc.masked_swap_p)
def _masked(eqn: Any, invals: list[Any], st: LaunchState, grid: GridContext) -> list[Any]:
    """``pltpu.load``/``pltpu.store`` (``pl.load``/``pl.store``): an access with an
    optional mask. The region is checked whole (bounds and DMAs in flight), even where
    masked off: a masked-off element out of bounds raises a flag, and the simulator,
    which reads only the True elements, decides."""
    ref, transforms, third, fourth = eqn.params["args_tree"].unflatten(invals)
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
@_rule(jc.program_id_p)
def _program_id(eqn: Any, invals: list[Any], st: LaunchState, grid: GridContext) -> list[Any]:
    return [jnp.asarray(grid.ids[eqn.params["axis"]], jnp.int32)]


@_rule(jc.num_programs_p)
def _num_programs(eqn: Any, invals: list[Any], st: LaunchState, grid: GridContext) -> list[Any]:
    return [jnp.int32(grid.counts[eqn.params["axis"]])]


@_rule(jc.multiple_of_p)
def _multiple_of(eqn: Any, invals: list[Any], st: LaunchState, grid: GridContext) -> list[Any]:
    return [invals[0]]


@_rule(jc.tpu_bitcast_p)
def _bitcast(eqn: Any, invals: list[Any], st: LaunchState, grid: GridContext) -> list[Any]:
    return [_tpu_bitcast(invals[0], np.dtype(eqn.outvars[0].aval.dtype))]


# --- DMAs -----------------------------------------------------------------------------------
def _semaphore(value: Any, st: LaunchState) -> Any:
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


def _dma_parts(eqn: Any, invals: list[Any], st: LaunchState) -> tuple[Any, ...]:
    src, dst, dst_sem, src_sem, device_id = jc.dma_operands(eqn.params["tree"], invals)
    if device_id is not None or src_sem is not None:
        raise UnsupportedFeatureError("a compiled launch runs no remote DMA")
    s = _access(src, (), st)
    d = _access(dst, (), st)
    if st.bufs[s[0]].dtype != st.bufs[d[0]].dtype or s[1].shape != d[1].shape:
        raise UnsupportedFeatureError("a DMA between views of other shapes or dtypes")
    nbytes = int(np.prod(s[1].shape, dtype=np.int64)) * np.dtype(st.bufs[s[0]].dtype).itemsize
    return s, d, _semaphore(dst_sem, st), nbytes


@_rule(jc.dma_start_p)
def _dma_start(eqn: Any, invals: list[Any], st: LaunchState, grid: GridContext) -> list[Any]:
    if eqn.params.get("add", False):
        raise UnsupportedFeatureError("a compiled launch runs no DMA that adds")
    (sbuf, sview), (dbuf, dview), sem, nbytes = _dma_parts(eqn, invals, st)
    st.start_dma((sbuf, sview), (dbuf, dview), sem, nbytes)
    st.write(dbuf, write_view(st.bufs[dbuf], dview, read_view(st.bufs[sbuf], sview)))
    return []


@_rule(jc.dma_wait_p)
def _dma_wait(eqn: Any, invals: list[Any], st: LaunchState, grid: GridContext) -> list[Any]:
    _s, _d, sem, nbytes = _dma_parts(eqn, invals, st)
    st.wait_dma(sem, nbytes)
    return []


# --- control flow ---------------------------------------------------------------------------
@_rule(*CALLS)
def _call(eqn: Any, invals: list[Any], st: LaunchState, grid: GridContext) -> list[Any]:
    return run_jaxpr(call_body(eqn), [], invals, st, grid)


def _split(values: Sequence[Any]) -> tuple[list[int], list[Any]]:
    """(positions of the handles, the traced values) of ``values``."""
    handles = [i for i, v in enumerate(values) if isinstance(v, Handle | SemHandle)]
    return handles, [v for i, v in enumerate(values) if i not in handles]


def _join(values: Sequence[Any], handles: list[int], traced: Sequence[Any]) -> list[Any]:
    it = iter(traced)
    return [values[i] if i in handles else next(it) for i in range(len(values))]


@_rule(jc.cond_p)
def _cond(eqn: Any, invals: list[Any], st: LaunchState, grid: GridContext) -> list[Any]:
    index, *args = invals
    handles, traced = _split(args)

    def branch(jaxpr: Any) -> Callable[..., Any]:
        def run(operands: Any) -> Any:
            carry, traced = operands
            inner = st.child(carry)
            out = run_jaxpr(jaxpr, [], _join(args, handles, traced), inner, grid)
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
def _while(eqn: Any, invals: list[Any], st: LaunchState, grid: GridContext) -> list[Any]:
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

    def test(state: LaunchState, values: Any) -> Any:
        return run_jaxpr(p["cond_jaxpr"], [], [*cconsts, *values], state, grid)[0]

    def keep_going(c: Any) -> Any:
        n, going, _, _ = c
        return going & (n < WHILE_LIMIT)

    def body(c: Any) -> Any:
        n, _, carry, values = c
        inner = st.child(carry)
        values = run_jaxpr(p["body_jaxpr"], [], [*bconsts, *values], inner, grid)
        going = test(inner, values)  # (its reads' flags go into inner's)
        return n + 1, going, inner.carry(), values

    going = test(st, init)
    _, going, carry, values = lax.while_loop(
        keep_going, body, (jnp.int32(0), jnp.asarray(going, jnp.bool_), st.carry(), list(init)))
    st.restore(carry)
    st.raise_flag(FLAG_LOOP, going)  # stopped by the limit
    return list(values)


@_rule(jc.scan_p)
def _scan(eqn: Any, invals: list[Any], st: LaunchState, grid: GridContext) -> list[Any]:
    p = eqn.params
    nc, ncarry = p["num_consts"], p["num_carry"]
    consts, init, xs = invals[:nc], invals[nc: nc + ncarry], invals[nc + ncarry:]
    if any(isinstance(v, Handle | SemHandle) for v in (*init, *xs)):
        raise UnsupportedFeatureError("a loop that carries a ref")

    def body(c: Any, x: Any) -> Any:
        carry, values = c
        inner = st.child(carry)
        out = run_jaxpr(p["jaxpr"], [], [*consts, *values, *x], inner, grid)
        return (inner.carry(), out[:ncarry]), out[ncarry:]

    (carry, values), ys = lax.scan(body, (st.carry(), list(init)), list(xs),
                                   length=p["length"], reverse=p["reverse"],
                                   unroll=p.get("unroll", 1))
    st.restore(carry)
    return [*values, *ys]


@_rule(jc.run_scoped_p)
def _run_scoped(eqn: Any, invals: list[Any], st: LaunchState, grid: GridContext) -> list[Any]:
    raise UnsupportedFeatureError("a compiled launch allocates no scoped buffer")
