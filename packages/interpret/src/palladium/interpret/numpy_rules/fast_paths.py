"""Fast paths: a rule's common case with its static decisions taken when the equation is
compiled, not at every call.

A numpy rule (``rule(*invals, **params)``) learns its operands' dtypes and shapes at
every call and goes through a few layers to find its numpy call (the dtype test, the
output dtype, the flushes, the 0-d result made an array). An equation's avals are static,
so for the common case (f32 operands of known shapes) those decisions can be taken once:
``fast_path(eqn, operands_flushed)`` returns a function of the operands that computes
what the rule computes, in the same numpy calls, or None when the operands it gets are
not the ones it was made for (then the rule runs). The bits are the rule's:
each fast path below names the branch of its rule that it repeats.

On a kernel's first launch (equations run one by one) this is most of what an equation
costs beyond numpy itself: an f32 add on a 128x128 block, ~2.5 us of numpy, went through
~4 us of rule layers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax import lax
from jax.extend.core import Primitive

from palladium.interpret.numpy_rules.common import (
    BF16,
    ERRORS_IGNORED,
    F32,
    HARDWARE_FLUSHES,
    back,
    back_flushed,
    f32,
    f32_flushed,
)
from palladium.interpret.numpy_rules.elementwise import ARITH, EXACT_OUTPUT, IEEE, PASS_THROUGH

__all__ = ["FAST_PATHS", "FastPath", "fast_path"]

#: A fast path: the equation's results from its operands, or None (run the rule).
FastPath = Callable[[list[Any]], list[Any] | None]

_ND = np.ndarray
_IEEE_BINARY = {lax.add_p: np.add, lax.sub_p: np.subtract, lax.mul_p: np.multiply}


def _avals_f32(eqn: Any) -> bool:
    return all(getattr(v.aval, "dtype", None) == F32 for v in (*eqn.invars, *eqn.outvars))


def _any_param(eqn: Any) -> bool:
    """Whether a parameter is set (``accuracy``, ``out_dtype``: the rule's other branches)."""
    return any(v is not None for v in eqn.params.values())


def _shape(atom: Any) -> tuple[int, ...]:
    return tuple(getattr(atom.aval, "shape", ()))


def _ieee_binary(eqn: Any, operands_flushed: bool) -> FastPath | None:
    """add, sub, mul of f32 arrays where the FP environment flushes (``HARDWARE_FLUSHES``):
    ``_elementwise``'s ``ieee`` branch, ``float_fn(*xs)``."""
    if not _avals_f32(eqn) or not _shape(eqn.outvars[0]) or _any_param(eqn):
        return None
    return _where_flushing(_IEEE_BINARY[eqn.primitive])


def _div(eqn: Any, operands_flushed: bool) -> FastPath | None:
    """div of f32 arrays whose divisor is not 0-d, where the FP environment flushes:
    ``elementwise._div``'s ``np.divide`` of its operands (a 0-d divisor takes XLA's
    reciprocal rewrite there)."""
    if not _avals_f32(eqn) or not _shape(eqn.invars[1]) or _any_param(eqn):
        return None
    return _where_flushing(np.divide)


def _where_flushing(fn: Callable[[Any, Any], Any]) -> FastPath:
    """``fn`` of two f32 arrays, run as it is where the FP environment flushes."""
    flushes = HARDWARE_FLUSHES.get

    def run(invals: list[Any]) -> list[Any] | None:
        a, b = invals
        if (type(a) is _ND and type(b) is _ND and a.dtype is F32 and b.dtype is F32
                and flushes() and ERRORS_IGNORED.get()):
            return [fn(a, b)]
        return None

    return run


def _float_elementwise(eqn: Any, operands_flushed: bool) -> FastPath | None:
    """The other f32 functions of ``elementwise.ARITH`` (max, min, exp, sqrt, ...):
    ``_elementwise``'s float branch, ``narrow(float_fn(*widened), F32)``, with the widen
    and narrow of the rule the program picked (``PREFLUSHED_RULES`` for flushed
    operands)."""
    prim = eqn.primitive
    if (prim in IEEE or prim in PASS_THROUGH or not _avals_f32(eqn)
            or not _shape(eqn.outvars[0]) or _any_param(eqn)):
        return None
    fn = ARITH[prim][0]
    widen = f32_flushed if operands_flushed else f32
    exact = operands_flushed and prim in EXACT_OUTPUT
    narrow = back_flushed if exact else back

    def run(invals: list[Any]) -> list[Any] | None:
        for x in invals:
            if type(x) is not _ND or x.dtype is not F32:
                return None
        if not ERRORS_IGNORED.get():
            return None
        return [narrow(fn(*[widen(x) for x in invals]), F32)]

    return run


def _tile(eqn: Any, operands_flushed: bool) -> FastPath | None:
    """tile by ones: the operand itself (values are immutable); ``structural._tile``
    leaves bf16 operands with subnormals to bind, so only other dtypes."""
    reps = eqn.params["reps"]
    dtype = getattr(eqn.invars[0].aval, "dtype", None)
    if any(int(r) != 1 for r in reps) or dtype is None or np.dtype(dtype) == BF16:
        return None

    def run(invals: list[Any]) -> list[Any] | None:
        x = invals[0]
        return [x] if type(x) is _ND and x.dtype != BF16 else None

    return run


def _broadcast_in_dim(eqn: Any, operands_flushed: bool) -> FastPath | None:
    """``structural._broadcast_in_dim`` with its view shape computed once (no dynamic
    shapes; bf16 is left to the rule, which tests it for subnormals)."""
    p = eqn.params
    dtype = getattr(eqn.invars[0].aval, "dtype", None)
    if len(eqn.invars) != 1 or dtype is None or np.dtype(dtype) == BF16:
        return None
    shape = tuple(p["shape"])
    view = [1] * len(shape)
    for i, d in enumerate(p["broadcast_dimensions"]):
        view[d] = _shape(eqn.invars[0])[i]
    view_shape = tuple(view)
    broadcast = np.broadcast_to

    def run(invals: list[Any]) -> list[Any] | None:
        x = invals[0]
        if type(x) is not _ND or x.dtype == BF16:
            return None
        return [broadcast(x.reshape(view_shape), shape)]

    return run


def _dot_general(eqn: Any, operands_flushed: bool) -> FastPath | None:
    """``dot._dot_general`` for f32 operands and result: its transposes and reshapes to
    one batched matmul computed once, then the same calls (widen, matmul, back)."""
    if not _avals_f32(eqn) or eqn.params.get("preferred_element_type") not in (None, F32):
        return None
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lshape, rshape = _shape(eqn.invars[0]), _shape(eqn.invars[1])
    lf = [d for d in range(len(lshape)) if d not in lc and d not in lb]
    rf = [d for d in range(len(rshape)) if d not in rc and d not in rb]

    def size(shape: Sequence[int], dims: Sequence[int]) -> int:
        return math.prod(shape[d] for d in dims)

    batch = size(lshape, lb)
    lperm, rperm = (*lb, *lf, *lc), (*rb, *rc, *rf)
    lview = (batch, size(lshape, lf), size(lshape, lc))
    rview = (batch, size(rshape, rc), size(rshape, rf))
    out = _shape(eqn.outvars[0])
    widen = f32_flushed if operands_flushed else f32
    transpose, matmul = np.transpose, np.matmul

    def run(invals: list[Any]) -> list[Any] | None:
        lhs, rhs = invals
        if (type(lhs) is not _ND or type(rhs) is not _ND or lhs.dtype is not F32
                or rhs.dtype is not F32 or not ERRORS_IGNORED.get()):
            return None
        a = widen(transpose(lhs, lperm).reshape(lview))
        b = widen(transpose(rhs, rperm).reshape(rview))
        return [back(matmul(a, b).reshape(out), F32)]

    return run


FAST_PATHS: dict[Primitive, Callable[[Any, bool], FastPath | None]] = {
    **{p: _ieee_binary for p in _IEEE_BINARY},
    lax.div_p: _div,
    **{p: _float_elementwise for p in ARITH if p not in IEEE and p not in PASS_THROUGH},
    lax.tile_p: _tile,
    lax.broadcast_in_dim_p: _broadcast_in_dim,
    lax.dot_general_p: _dot_general,
}


def fast_path(eqn: Any, operands_flushed: bool = False) -> FastPath | None:
    """The fast path of ``eqn`` (see the module), or None."""
    make = FAST_PATHS.get(eqn.primitive)
    return None if make is None else make(eqn, operands_flushed)
