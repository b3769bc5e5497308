"""Integer and boolean scalar equations: the kernels' index arithmetic, without the
general rules' dtype dispatch.

A kernel's control code (program ids, page indices, loop counters, the conditions of
``pl.when``) is equations on 0-d int32 and bool values; paged attention evaluates ~1,500
of them per call. Their general rules (``elementwise``, ``comparisons``, ...) look at
dtypes on every call (~5-6 us each); ``scalar_rule`` decides that once, when the
equation is compiled, and returns a rule that is a single numpy call (~1-2 us). Integer
arithmetic wraps (two's complement) as in XLA; the results are bit-identical to the
general rules' (``tests/numpy_rules/test_scalar_rules.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from jax import lax

from palladium.interpret.numpy_rules.common import BOOL
from palladium.interpret.numpy_rules.comparisons import COMPARISONS

__all__ = ["scalar_rule"]

_I32 = np.dtype(np.int32)
_SCALAR_DTYPES = frozenset({_I32, BOOL})

_BINARY: dict[Any, Callable[[Any, Any], Any]] = {
    lax.add_p: np.add,
    lax.sub_p: np.subtract,
    lax.mul_p: np.multiply,
    lax.max_p: np.maximum,
    lax.min_p: np.minimum,
    **COMPARISONS,
    lax.and_p: np.bitwise_and,
    lax.or_p: np.bitwise_or,
    lax.xor_p: np.bitwise_xor,
}


def _dtype(atom: Any) -> Any:
    aval = getattr(atom, "aval", None)
    if aval is None or getattr(aval, "shape", None) != ():
        return None
    return np.dtype(aval.dtype) if getattr(aval, "dtype", None) is not None else None


Rule = Callable[[Any, Any, list[Any]], list[Any]]


def scalar_rule(eqn: Any, general: Rule) -> Rule | None:
    """The rule of ``eqn`` if every operand and result is a 0-d int32 or bool (of one
    dtype for arithmetic) and its primitive is one of the index operations; else None.
    Operands of another dtype than declared (none are known) go to ``general``."""
    rule = _fast(eqn)
    if rule is None:
        return None
    out_dtype = _dtype(eqn.outvars[0])

    def checked(ev: Any, eqn: Any, invals: list[Any]) -> list[Any]:
        out = rule(invals)
        dtype = out.dtype
        return [out] if dtype is out_dtype or dtype == out_dtype else general(ev, eqn, invals)

    return checked


def _fast(eqn: Any) -> Callable[[list[Any]], Any] | None:
    dtypes = [_dtype(a) for a in (*eqn.invars, *eqn.outvars)]
    if not dtypes or any(d not in _SCALAR_DTYPES for d in dtypes):
        return None
    prim, n_in = eqn.primitive, len(eqn.invars)
    out_dtype = dtypes[-1]
    fn = _BINARY.get(prim)
    if fn is not None and n_in == 2 and dtypes[0] == dtypes[1]:
        if prim in (lax.add_p, lax.sub_p, lax.mul_p):
            return _INT32_ARITHMETIC[prim] if dtypes[0] == _I32 else None

        def binary(invals: list[Any]) -> Any:
            return np.asarray(fn(invals[0], invals[1]))

        return binary
    if prim is lax.rem_p and n_in == 2 and dtypes[0] == dtypes[1] == _I32:
        return _int32_rem
    if prim is lax.not_p and n_in == 1:
        def invert(invals: list[Any]) -> Any:
            return np.asarray(np.invert(invals[0]))

        return invert
    if prim is lax.convert_element_type_p and n_in == 1:
        src = dtypes[0]

        def convert(invals: list[Any]) -> Any:
            x = invals[0]
            if src == out_dtype or out_dtype != BOOL:
                return np.asarray(x, out_dtype)
            return np.asarray(x != 0)

        return convert
    if prim is lax.select_n_p and n_in == 3 and dtypes[0] == BOOL and dtypes[1] == dtypes[2]:
        def select(invals: list[Any]) -> Any:
            return np.asarray(invals[2] if invals[0] else invals[1])

        return select
    return None


_OTHER = np.asarray(False)  # not int32: ``checked`` then runs the general rule
_MIN32 = -(1 << 31)


def _int32_arithmetic(op: Callable[[int, int], int]) -> Callable[[list[Any]], Any]:
    """``op`` of two int32 scalars in Python ints, wrapped to int32 (two's complement,
    as numpy and XLA): a DMA's ring index is a ``sub`` and an ``add`` per DMA, and one
    numpy ufunc call on 0-d arrays costs ~2x this."""

    def arithmetic(invals: list[Any]) -> Any:
        x, y = invals
        if getattr(x, "dtype", None) != _I32 or getattr(y, "dtype", None) != _I32:
            return _OTHER
        v = op(int(x), int(y))
        if not _MIN32 <= v < -_MIN32:
            v = ((v - _MIN32) & 0xFFFFFFFF) + _MIN32
        return np.asarray(v, _I32)

    return arithmetic


_INT32_ARITHMETIC = {
    lax.add_p: _int32_arithmetic(lambda a, b: a + b),
    lax.sub_p: _int32_arithmetic(lambda a, b: a - b),
    lax.mul_p: _int32_arithmetic(lambda a, b: a * b),
}


def _int32_rem(invals: list[Any]) -> Any:
    """``x % y`` of two int32 scalars in Python ints (a DMA's ring index, once per DMA):
    C's sign of the dividend, ``x % 0 == x`` and ``MIN % -1 == 0`` as XLA (and the
    general rule, ``elementwise._int_rem``) give them."""
    x, y = invals
    if getattr(x, "dtype", None) != _I32 or getattr(y, "dtype", None) != _I32:
        return _OTHER
    a, b = int(x), int(y)
    if b:
        r = abs(a) % abs(b)
        a = -r if a < 0 else r
    return np.asarray(a, _I32)
