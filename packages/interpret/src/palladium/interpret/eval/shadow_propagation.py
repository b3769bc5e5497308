"""How a pure computation's results derive from uninitialised memory
(``uninitialized_reads="on_use"``): the shadow of each kind of primitive from its
operands' (``value_shadows.py``), as MemorySanitizer propagates definedness: elementwise
any operand's; ``and``/``or`` decided by an initialised False / True; ``select_n`` the
chosen case's and the predicate's; reductions and cumulative ops any contributing
element's; ``dot_general`` any element of the row or column; moves (reshape, broadcast,
slice, gather, pad, concatenate, ...) by the primitive itself on the masks; anything else
every element (never missed, maybe reported where a finer rule would not)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.refs import MemRef, RefView, SemaphoreRef
from palladium.interpret.eval.value_shadows import (
    Tainted,
    first_tainted,
    full_shadow,
    plain,
    report_use,
    shadow_of,
    tainted,
)

__all__ = ["propagate"]


def _on_ref(x: Any) -> bool:
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
    first = first_tainted(ops)
    assert first is not None
    if any(_on_ref(x) for x in ops):
        raise report_use(ev, eqn, first, _use_name(eqn))
    values = [plain(x) for x in ops]
    results = rule(ev, eqn, values)
    shadows = _SHADOW_OF.get(str(eqn.primitive), _elementwise)(ev, rule, eqn, values, ops,
                                                               results)
    return [tainted(r, s, first.origin) for r, s in zip(results, shadows)]


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
            s = shadow_of(x)
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
        s = shadow_of(x)
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
    subst = [full_shadow(x) if i in data_at else values[i] for i, x in enumerate(ops)]
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
    cases = [full_shadow(x) for x in ops[1:]]
    if pred.dtype == np.bool_:
        chosen = np.where(pred, np.broadcast_to(cases[1], shape),
                          np.broadcast_to(cases[0], shape))
    else:
        idx = np.broadcast_to(np.clip(pred, 0, len(cases) - 1), shape)
        chosen = np.choose(idx, [np.broadcast_to(c, shape) for c in cases])
    p = shadow_of(ops[0])
    return [chosen if p is None else chosen | np.broadcast_to(p, shape)]


@_shadow_of("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
            "reduce_or", "reduce_xor", "argmax", "argmin")
def _reduction(ev: KernelContext, rule: Any, eqn: Equation, values: list[Value],
               ops: list[Value], results: list[Value]) -> list[Any]:
    axes = tuple(eqn.params["axes"])
    return [np.any(full_shadow(ops[0]), axis=axes)]


@_shadow_of("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")
def _cumulative(ev: KernelContext, rule: Any, eqn: Equation, values: list[Value],
                ops: list[Value], results: list[Value]) -> list[Any]:
    s = full_shadow(ops[0])
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
        s = shadow_of(mine)
        if s is None:
            continue
        a = np.broadcast_to(s, np.shape(plain(mine))).astype(np.float32)
        ones = np.ones(other.shape, np.float32)
        out = dot(a, ones, **params, preferred_element_type=np.float32) if first else \
            dot(ones, a, **params, preferred_element_type=np.float32)
        total = total + np.asarray(out)
    return [np.asarray(total) > 0]


