"""Uninitialised memory reported on use, as MemorySanitizer does for C
(``InterpretParams(uninitialized_reads="on_use")``, the default).

A value read from memory that holds no initialised data (a scratch nothing wrote, an
output block at a new block index, the padding of a partial edge block) carries a
*shadow*: a bool mask, True where its element derives from uninitialised data, and the
``UninitializedOrigin`` of that data. Values read from initialised memory carry nothing
(a plain array): they cost one type check per operand. Every equation propagates the
shadow to its results (elementwise: any operand's; ``select_n``: the chosen case's and
the predicate's; reductions and dots: any contributing element's; moves: the moved
elements'), stores keep it in the buffer (``Simulation.set_initialized``), DMAs and
block copies carry it (the simulator). A shadowed value is reported
(``UninitializedUseError``) only where it decides something: a branch, a loop, an index
or a DMA or semaphore operand. What reaches an output is reported when the launch ends
(``run/launch.py``); data masked away or overwritten is never reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import UninitializedUseError
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.refs import MemRef, RefView, SemaphoreRef
from palladium.shared_memory import UninitializedOrigin
from palladium.shared_memory.errors import at_site, core_name

__all__ = ["PASS_THROUGH", "SHADOW_RULES", "Tainted", "describe_origin", "fix_hint", "plain", "run_shadowed"]


class Tainted:
    """A value derived (in part) from uninitialised memory: the value as computed,
    ``shadow`` (a bool array broadcastable to it: True where the element derives from
    uninitialised data) and the ``origin`` of that data. Only the evaluator's loop and
    the rules below see one; anything else that asks for its truth or an index from it
    reports the use."""

    __slots__ = ("origin", "shadow", "value")

    def __init__(self, value: Any, shadow: np.ndarray, origin: UninitializedOrigin) -> None:
        self.value = value
        self.shadow = shadow
        self.origin = origin

    def _used(self, what: str) -> UninitializedUseError:
        return UninitializedUseError(
            f"{what} is derived from uninitialised memory: {describe_origin(self.origin)}. "
            f"{fix_hint(self.origin)}")

    def __bool__(self) -> bool:
        raise self._used("a condition")

    def __index__(self) -> int:
        raise self._used("an index")

    __int__ = __index__

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.value, dtype=dtype)


def plain(x: Any) -> Any:
    """``x`` without its shadow."""
    return x.value if x.__class__ is Tainted else x


def describe_origin(origin: UninitializedOrigin) -> str:
    """Where uninitialised data came from, as a message says it."""
    if origin.kind == "stored" and origin.source is not None:
        return (f"stored into {origin.what}{at_site(origin.site)}, derived from "
                + describe_origin(origin.source))
    text = f"{origin.what} read{at_site(origin.site)}"
    if origin.kind == "padding":
        return text + " (the padding of a partial edge block: on a TPU, whatever VMEM held)"
    return text + " before anything wrote it (on a TPU: whatever an earlier kernel left there)"


def root(origin: UninitializedOrigin) -> UninitializedOrigin:
    """The read an origin goes back to (a store's record names the read it stored)."""
    while origin.kind == "stored" and origin.source is not None:
        origin = origin.source
    return origin


def fix_hint(origin: UninitializedOrigin) -> str:
    """What to change in the kernel, by where the data came from."""
    if root(origin).kind == "padding":
        return ("Mask the elements past the array's end before they reach a result (e.g. "
                "jnp.where(row < n, x, 0) with row from pl.program_id and "
                "lax.broadcasted_iota), or use a block shape that divides the array.")
    return ("Write it before it is read: e.g. zero an accumulator (or initialise a running "
            "max or sum) at the first step of the reduction axis, "
            "@pl.when(pl.program_id(k) == 0), and write every output block the grid visits.")


_OFF = " If the kernel means it, pass InterpretParams(uninitialized_reads='off')."


def report_use(ev: KernelContext, eqn: Equation, value: Tainted, what: str) -> UninitializedUseError:
    """The error for ``value`` deciding ``what`` at ``eqn``."""
    return UninitializedUseError(
        f"{core_name(ev.core)}: {what}{at_site(ev.site(eqn))} is decided by a value derived "
        f"from uninitialised memory: {describe_origin(value.origin)}. "
        f"{fix_hint(value.origin)}{_OFF}")


def read_origin(what: str, site: object, held: Any) -> UninitializedOrigin:
    """The origin of a read of uninitialised elements: ``what`` (operand and region)
    read at ``site``; ``held``: the buffer's own record of where its uninitialised data
    came from (a padding copy, a store of derived data), or None (never written)."""
    if held is None:
        return UninitializedOrigin(what, site)
    if held.kind == "padding":
        return UninitializedOrigin(what, site, "padding")
    return root(held)


def stored_origin(what: str, site: object, origin: UninitializedOrigin) -> UninitializedOrigin:
    """A buffer's record of a store of data derived from ``origin`` into ``what``."""
    return UninitializedOrigin(what, site, "stored", root(origin))


# -- the loop ----------------------------------------------------------------------------

ShadowRule = Callable[[KernelContext, Any, Equation, list[Value]], list[Value]]
SHADOW_RULES: dict[Any, ShadowRule] = {}


def _first(ops: list[Value]) -> Tainted | None:
    for x in ops:
        if x.__class__ is Tainted:
            return x  # type: ignore[no-any-return]
    return None


def run_shadowed(ev: KernelContext, prog: Any, env: list[Any], observers: Any) -> list[Value]:
    """Run ``prog``'s steps on ``env`` (its arguments stored) with shadows: the
    evaluator's loop when values track initialisation."""
    if observers is None:
        for (rule, eqn, operands, one, out, outs), special in zip(prog.fast, prog.shadow_rules):
            ops = [env[one]] if one is not None else list(operands(env))
            if special is not None:
                results = special(ev, rule, eqn, ops)
            else:
                for x in ops:
                    if x.__class__ is Tainted:
                        results = propagate(ev, rule, eqn, ops)
                        break
                else:
                    results = rule(ev, eqn, ops)
            if out is not None:
                env[out] = results[0]
            else:
                for s, o in zip(outs, results):
                    env[s] = o
        return [env[i] for i in prog.out_slots]
    core, compute = ev.core, observers.compute
    for step in prog.steps:
        if not step.segment:
            compute(core, step.eqn)
        if step.observe_only:
            continue
        ops = [env[i] for i in step.in_slots]
        special = _passthrough if step.segment else SHADOW_RULES.get(step.eqn.primitive)
        if special is not None:
            results = special(ev, step.rule, step.eqn, ops)
        elif _first(ops) is not None:
            results = propagate(ev, step.rule, step.eqn, ops)
        else:
            results = step.rule(ev, step.eqn, ops)
        for s, o in zip(step.out_slots, results):
            env[s] = o
    return [env[i] for i in prog.out_slots]


def _is_ref(x: Any) -> bool:
    return isinstance(x, MemRef | SemaphoreRef | RefView | jc.TransformedRef)


def _use_name(eqn: Equation) -> str:
    name = str(eqn.primitive)
    if "dma" in name:
        return f"an operand of a DMA ({name})"
    if "semaphore" in name:
        return f"a semaphore operand ({name})"
    return f"an index or operand of '{name}' on a ref"


def propagate(ev: KernelContext, rule: Any, eqn: Equation, ops: list[Value]) -> list[Value]:
    """A step with shadowed operands and no rule of its own here: a pure computation
    (its results' shadows by the kind of primitive) or an operation on refs (reported:
    a shadowed index, DMA operand or semaphore count)."""
    first = _first(ops)
    assert first is not None
    if any(_is_ref(x) for x in ops):
        raise report_use(ev, eqn, first, _use_name(eqn))
    values = [plain(x) for x in ops]
    results = rule(ev, eqn, values)
    shadows = _SHADOW_OF.get(str(eqn.primitive), _elementwise)(ev, rule, eqn, values, ops,
                                                               results)
    return [_wrap(r, s, first.origin) for r, s in zip(results, shadows)]


def _wrap(value: Any, shadow: Any, origin: UninitializedOrigin) -> Any:
    if shadow is None:
        return value
    shadow = np.asarray(shadow, dtype=bool)
    if not shadow.any():
        return value
    return Tainted(value, shadow, origin)


def _shadow(x: Any) -> np.ndarray | None:
    return x.shadow if x.__class__ is Tainted else None


def _full(x: Any) -> np.ndarray:
    """The shadow of operand ``x`` at its value's shape (False: initialised)."""
    shape = np.shape(plain(x))
    s = _shadow(x)
    if s is None:
        return np.zeros(shape, bool)
    return np.broadcast_to(s, shape)


ShadowOf = Callable[[KernelContext, Any, Equation, list[Value], list[Value], list[Value]],
                    list[Any]]
_SHADOW_OF: dict[str, ShadowOf] = {}


def _shadow_of(*names: str) -> Callable[[ShadowOf], ShadowOf]:
    def register(fn: ShadowOf) -> ShadowOf:
        for n in names:
            _SHADOW_OF[n] = fn
        return fn
    return register


def _elementwise(ev: KernelContext, rule: Any, eqn: Equation, values: list[Value],
                 ops: list[Value], results: list[Value]) -> list[Any]:
    """Any operand's shadow, where shapes broadcast; else every element (conservative)."""
    out: list[Any] = []
    for r in results:
        shape = np.shape(r)
        acc: Any = None
        for x in ops:
            s = _shadow(x)
            if s is None:
                continue
            try:
                s = np.broadcast_to(s, shape)
            except ValueError:
                s = np.ones(shape, bool)
            acc = s if acc is None else acc | s
        out.append(acc)
    return out


def _absorbing(ops: list[Value], values: list[Value], shape: tuple[int, ...],
               absorbs: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Where some initialised operand holds the value that decides the result alone
    (``absorbs``: an initialised False / 0 for ``and``, True / all ones for ``or``)."""
    known = np.zeros(shape, bool)
    for x, v in zip(ops, values):
        s = _shadow(x)
        decided = np.broadcast_to(absorbs(np.asarray(v)), shape)
        known |= decided if s is None else decided & ~np.broadcast_to(s, shape)
    return known


@_shadow_of("and")
def _and(ev: KernelContext, rule: Any, eqn: Equation, values: list[Value],
         ops: list[Value], results: list[Value]) -> list[Any]:
    """An initialised False (0) decides an ``and`` whatever the other operand holds (as
    MemorySanitizer's rule: ``(x < n) & (v > 0)`` over padding rows is initialised)."""
    shape = np.shape(results[0])
    (any_shadow,) = _elementwise(ev, rule, eqn, values, ops, results)
    return [np.broadcast_to(any_shadow, shape) & ~_absorbing(ops, values, shape,
                                                              lambda v: v == 0)]


@_shadow_of("or")
def _or(ev: KernelContext, rule: Any, eqn: Equation, values: list[Value],
        ops: list[Value], results: list[Value]) -> list[Any]:
    """An initialised True (all ones) decides an ``or``."""
    shape = np.shape(results[0])
    (any_shadow,) = _elementwise(ev, rule, eqn, values, ops, results)

    def all_ones(v: np.ndarray) -> np.ndarray:
        return v if v.dtype == np.bool_ else v == ~np.zeros((), v.dtype)

    return [np.broadcast_to(any_shadow, shape) & ~_absorbing(ops, values, shape, all_ones)]


# Moves: the same primitive on the shadows (index operands keep their values; a
# shadowed index is an address decided by uninitialised data).
_MOVES: dict[str, tuple[int, ...] | None] = {
    "reshape": (0,), "broadcast_in_dim": (0,), "transpose": (0,), "squeeze": (0,),
    "expand_dims": (0,), "slice": (0,), "rev": (0,), "copy": (0,), "copy_p": (0,),
    "concatenate": None, "pad": (0, 1), "dynamic_slice": (0,),
    "dynamic_update_slice": (0, 1), "gather": (0,), "split": (0,), "roll": (0,),
}


def _moved(ev: KernelContext, rule: Any, eqn: Equation, values: list[Value],
           ops: list[Value], results: list[Value]) -> list[Any]:
    data = _MOVES[str(eqn.primitive)]
    data_at = range(len(ops)) if data is None else data
    for i, x in enumerate(ops):
        if i not in data_at and x.__class__ is Tainted:
            raise report_use(ev, eqn, x, f"an index of '{eqn.primitive}'")
    subst = [_full(x) if i in data_at else values[i] for i, x in enumerate(ops)]
    out = _bool_rule(ev, eqn, subst)
    return [np.asarray(o, bool) for o in out]


def _bool_rule(ev: KernelContext, eqn: Equation, operands: list[Any]) -> list[Any]:
    prim = eqn.primitive
    try:
        from palladium.interpret.numpy_rules import NUMPY_RULES
        np_rule = NUMPY_RULES.get(prim)
        if np_rule is not None:
            out = np_rule(*operands, **dict(eqn.params))
            if out is not NotImplemented:
                return list(out) if prim.multiple_results else [out]
    except Exception:  # noqa: BLE001 - a numpy rule made for other dtypes: bind instead
        pass
    out = prim.bind(*operands, **prim.get_bind_params(eqn.params))
    return [np.asarray(o) for o in out] if prim.multiple_results else [np.asarray(out)]


for _name in _MOVES:
    _SHADOW_OF[_name] = _moved


@_shadow_of("select_n")
def _select_n(ev: KernelContext, rule: Any, eqn: Equation, values: list[Value],
              ops: list[Value], results: list[Value]) -> list[Any]:
    pred = np.asarray(values[0])
    shape = np.shape(results[0])
    cases = [_full(x) for x in ops[1:]]
    if pred.dtype == np.bool_:
        chosen = np.where(pred, np.broadcast_to(cases[1], shape),
                          np.broadcast_to(cases[0], shape))
    else:
        idx = np.broadcast_to(np.clip(pred, 0, len(cases) - 1), shape)
        chosen = np.choose(idx, [np.broadcast_to(c, shape) for c in cases])
    p = _shadow(ops[0])
    return [chosen if p is None else chosen | np.broadcast_to(p, shape)]


@_shadow_of("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
            "reduce_or", "reduce_xor", "argmax", "argmin")
def _reduction(ev: KernelContext, rule: Any, eqn: Equation, values: list[Value],
               ops: list[Value], results: list[Value]) -> list[Any]:
    axes = tuple(eqn.params["axes"])
    return [np.any(_full(ops[0]), axis=axes)]


@_shadow_of("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")
def _cumulative(ev: KernelContext, rule: Any, eqn: Equation, values: list[Value],
                ops: list[Value], results: list[Value]) -> list[Any]:
    s = _full(ops[0])
    axis = int(eqn.params["axis"])
    if eqn.params.get("reverse"):
        return [np.flip(np.logical_or.accumulate(np.flip(s, axis), axis=axis), axis)]
    return [np.logical_or.accumulate(s, axis=axis)]


@_shadow_of("dot_general")
def _dot(ev: KernelContext, rule: Any, eqn: Equation, values: list[Value],
         ops: list[Value], results: list[Value]) -> list[Any]:
    """An output element derives from uninitialised data if any element of its row or
    column does: the dot of each operand's shadow (as 0/1) with ones."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    from palladium.interpret.numpy_rules import NUMPY_RULES
    dot = NUMPY_RULES[eqn.primitive]
    lhs, rhs = np.asarray(values[0]), np.asarray(values[1])
    total: Any = 0
    params = {k: v for k, v in eqn.params.items() if k not in ("preferred_element_type",)}
    for mine, other, first in ((ops[0], rhs, True), (ops[1], lhs, False)):
        s = _shadow(mine)
        if s is None:
            continue
        a = np.broadcast_to(s, np.shape(plain(mine))).astype(np.float32)
        ones = np.ones(other.shape, np.float32)
        out = dot(a, ones, **params, preferred_element_type=np.float32) if first else \
            dot(ones, a, **params, preferred_element_type=np.float32)
        total = total + np.asarray(out)
    return [np.asarray(total) > 0]


# -- rules with something to decide -------------------------------------------------------

def _shadow_rule(*prims: Any) -> Callable[[ShadowRule], ShadowRule]:
    def register(fn: ShadowRule) -> ShadowRule:
        for p in prims:
            if p is not None:
                SHADOW_RULES[p] = fn
        return fn
    return register


@_shadow_rule(jc.cond_p)
def _cond(ev: KernelContext, rule: Any, eqn: Equation, ops: list[Value]) -> list[Value]:
    if ops[0].__class__ is Tainted:
        raise report_use(ev, eqn, ops[0], "a branch (lax.cond / pl.when)")
    return rule(ev, eqn, ops)  # type: ignore[no-any-return]


@_shadow_rule(jc.while_p)
def _while(ev: KernelContext, rule: Any, eqn: Equation, ops: list[Value]) -> list[Value]:
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cond_consts, body_consts, carry = ops[:nc], ops[nc: nc + nb], ops[nc + nb:]
    tick, site = ev.sim.tick, ev.site(eqn)
    while True:
        pred = ev.eval_closed(p["cond_jaxpr"], [*cond_consts, *carry])[0]
        if pred.__class__ is Tainted:
            raise report_use(ev, eqn, pred, "a loop's condition (lax.while_loop / "
                                            "lax.fori_loop bound)")
        if not bool(np.asarray(pred)):
            return carry
        tick(site)  # the watchdog sees a loop that never ends
        carry = ev.eval_closed(p["body_jaxpr"], [*body_consts, *carry])


@_shadow_rule(jc.scan_p)
def _scan(ev: KernelContext, rule: Any, eqn: Equation, ops: list[Value]) -> list[Value]:
    # (the plain rule's own loop would drop the shadows of its ys when stacking them)
    p = eqn.params
    n_consts, n_carry, length = p["num_consts"], p["num_carry"], p["length"]
    consts, carry, xs = ops[:n_consts], ops[n_consts: n_consts + n_carry], ops[n_consts + n_carry:]
    y_avals = [v.aval for v in eqn.outvars[n_carry:]]
    ys: list[list[Any]] = [[] for _ in y_avals]
    steps = range(length - 1, -1, -1) if p["reverse"] else range(length)
    for i in steps:
        sliced = [_index(x, i) for x in xs]
        out = ev.eval_closed(p["jaxpr"], [*consts, *carry, *sliced])
        carry = out[:n_carry]
        for acc, y in zip(ys, out[n_carry:]):
            acc.append(y)
    if p["reverse"]:
        for acc in ys:
            acc.reverse()
    stacked = []
    for acc, aval in zip(ys, y_avals):
        if not acc:
            stacked.append(np.zeros(aval.shape, aval.dtype))
            continue
        value = np.stack([np.asarray(plain(y), dtype=aval.dtype) for y in acc])
        first = _first(acc)
        if first is None:
            stacked.append(value)
        else:
            shadow = np.stack([_full(y) for y in acc])
            stacked.append(Tainted(value, shadow, first.origin))
    return [*carry, *stacked]


def _index(x: Any, i: int) -> Any:
    if x.__class__ is Tainted:
        return _wrap(np.asarray(x.value)[i], np.broadcast_to(
            x.shadow, np.shape(x.value))[i], x.origin)
    return np.asarray(x)[i]


def _passthrough(ev: KernelContext, rule: Any, eqn: Equation, ops: list[Value]) -> list[Value]:
    """Calls whose rule hands its operands to a body the same loop evaluates (and
    compiled segments, which run their equations so when an operand has a shadow)."""
    return rule(ev, eqn, ops)  # type: ignore[no-any-return]


PASS_THROUGH = _passthrough
_shadow_rule(jc.run_scoped_p, jc.jit_p, jc.custom_jvp_call_p, jc.custom_vjp_call_p)(
    _passthrough)


# Ref accesses: ``memory.py`` notes the shadow of what a read returns
# (``ev.read_shadow``) and stores the shadow of what a store writes (``ev.store_shadow``).
def _access_roles(eqn: Equation) -> dict[int, str]:
    """The operands of a ref access that are data (not an address): by position, the
    stored value, a load's or store's mask, a load's fill."""
    prim = eqn.primitive
    if prim is jc.swap_p or prim is jc.addupdate_p:
        return {1: "value"}
    if prim is jc.load_p or prim is jc.masked_swap_p:
        import jax
        args_tree = eqn.params["args_tree"]
        ref_tree, transforms_tree, third, fourth = jax.tree_util.treedef_children(args_tree)
        n = ref_tree.num_leaves + transforms_tree.num_leaves
        roles: dict[int, str] = {}
        if prim is jc.load_p:
            if third.num_leaves:
                roles[n] = "mask"
            if fourth.num_leaves:
                roles[n + int(third.num_leaves > 0)] = "other"
        else:
            roles[n] = "value"
            if fourth.num_leaves:
                roles[n + 1] = "mask"
        return roles
    return {}


_ROLES: dict[int, tuple[Any, dict[int, str]]] = {}


def _roles(eqn: Equation) -> dict[int, str]:
    hit = _ROLES.get(id(eqn))
    if hit is None or hit[0] is not eqn:
        hit = _ROLES[id(eqn)] = (eqn, _access_roles(eqn))
    return hit[1]


def _access(ev: KernelContext, rule: Any, eqn: Equation, ops: list[Value]) -> list[Value]:
    store: Any = None
    extra: Any = None  # a load's mask / fill, or a store's mask, with a shadow
    if _first(ops) is not None:
        roles = _roles(eqn)
        for i, x in enumerate(ops):
            if x.__class__ is not Tainted:
                continue
            role = roles.get(i)
            if role is None:
                raise report_use(ev, eqn, x, f"an index of a ref access ('{eqn.primitive}')")
            if role == "value":
                store = x
            else:
                extra = (role, x, i)
        ops = [plain(x) for x in ops]
    prim = eqn.primitive
    combine = prim is jc.addupdate_p
    if extra is not None and extra[0] == "mask" and prim is jc.masked_swap_p:
        # a store where the mask is uninitialised: those elements are unknown after it
        m = extra[1]
        mshadow = np.asarray(m.shadow)
        store = Tainted(plain(store) if store is not None else None,
                        mshadow if store is None else (store.shadow | mshadow), m.origin)
    ev.read_shadow = None
    ev.store_shadow = (None if store is None else store.shadow,
                       None if store is None else store.origin, combine) \
        if store is not None or combine else None
    try:
        results = rule(ev, eqn, ops)
    finally:
        ev.store_shadow = None
    noted, ev.read_shadow = ev.read_shadow, None
    if not results or results[0] is None:
        return results  # type: ignore[no-any-return]
    out = results[0]
    shadow: Any = None
    origin: Any = None
    if noted is not None:
        shadow, origin = noted
    if extra is not None and prim is jc.load_p:
        role, x, i = extra
        mask = np.asarray(ops[_mask_at(eqn)]) if "mask" in _roles(eqn).values() else None
        if role == "mask":
            add = np.broadcast_to(x.shadow, np.shape(out))
        else:  # the fill: where the mask is False
            add = np.broadcast_to(x.shadow, np.shape(out)) & ~np.broadcast_to(
                mask, np.shape(out))
        shadow = add if shadow is None else np.broadcast_to(shadow, np.shape(out)) | add
        origin = origin or x.origin
    if shadow is None or prim is jc.addupdate_p:
        return results  # type: ignore[no-any-return]
    return [_wrap(out, shadow, origin), *results[1:]]


def _mask_at(eqn: Equation) -> int:
    return next(i for i, r in _roles(eqn).items() if r == "mask")


_shadow_rule(jc.get_p, jc.swap_p, jc.addupdate_p, jc.load_p, jc.masked_swap_p)(_access)


def view_shadow(acc: Any, missing: np.ndarray) -> np.ndarray:
    """The shadow of a read's value from the region's uninitialised elements
    (``missing``, of the region's shape) through the access's numpy ops; through a
    bitcast, all or nothing."""
    from palladium.interpret.eval.refs import Bitcast
    if not acc.post:
        return missing
    if any(isinstance(op, Bitcast) for op in acc.post):
        shape = np.shape(acc.apply(np.zeros(acc.region_shape, np.uint8)))
        return np.full(shape, bool(missing.any()))
    return np.asarray(acc.apply(missing), bool)


def region_shadow(acc: Any, shadow: Any, value_shape: tuple[int, ...]) -> np.ndarray:
    """The region-shaped shadow of a store's value (of the view's shape)."""
    from palladium.interpret.eval.refs import Bitcast
    if not acc.post:
        return np.broadcast_to(np.asarray(shadow, bool), acc.region_shape)
    if any(isinstance(op, Bitcast) for op in acc.post):
        return np.full(acc.region_shape, bool(np.any(shadow)))
    positions = acc.positions()
    full = np.zeros(math.prod(acc.region_shape), bool)
    full[positions.ravel()] = np.broadcast_to(np.asarray(shadow, bool), positions.shape).ravel()
    return full.reshape(acc.region_shape)
