"""Scalar index arithmetic for tracing a compiled launch: static where it can be.

A launch function computes a region's starts, bounds checks and flat offsets for every
access and DMA of the kernel body. Written with ``jnp`` operators on tracers, each
``+``, ``*``, ``<`` and ``&`` is a nested ``jit`` that jax traces on its own (paged
attention's launch made ~11,700 of them, most of its ~1.5 s of tracing), and many of
them add 0, multiply by 1 or compare constants. Here an index is a Python ``int`` while
it is static and an int32 scalar tracer once it is not; a condition is a Python ``bool``
while static. Traced operands get ``lax``'s primitives directly, static ones no
equation at all. The int32 arithmetic on traced values is the same as before, so the
executable computes what it computed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jax import lax

__all__ = ["add", "all_of", "any_of", "as_index", "at_most", "fits", "is_static", "less", "mul",
           "negate", "traced_bool", "traced_index"]

_I32 = np.dtype(np.int32)


def is_static(x: Any) -> bool:
    return isinstance(x, int | bool | np.integer | np.bool_)


def as_index(x: Any) -> Any:
    """``x`` as an index: a Python int, or an int32 scalar (traced)."""
    if is_static(x):
        return int(x)
    return x if x.dtype == _I32 else lax.convert_element_type(x, _I32)


def traced_index(x: Any) -> Any:
    """``x`` as an int32 scalar value (an array even when static)."""
    x = as_index(x)
    return np.int32(x) if isinstance(x, int) else x


def add(a: Any, b: Any) -> Any:
    a, b = as_index(a), as_index(b)
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(b, int) and b == 0:
        return a
    if isinstance(a, int) and a == 0:
        return b
    return lax.add(traced_index(a), traced_index(b))


def mul(a: Any, k: Any) -> Any:
    a, k = as_index(a), as_index(k)
    if isinstance(a, int) and isinstance(k, int):
        return a * k
    if isinstance(k, int) and k == 1:
        return a
    if isinstance(a, int) and a == 1:
        return k
    return lax.mul(traced_index(a), traced_index(k))


def less(a: Any, b: Any) -> Any:
    """``a < b``: a Python bool when both are static."""
    a, b = as_index(a), as_index(b)
    if isinstance(a, int) and isinstance(b, int):
        return a < b
    return lax.lt(traced_index(a), traced_index(b))


def at_most(a: Any, b: Any) -> Any:
    """``a <= b``: a Python bool when both are static."""
    a, b = as_index(a), as_index(b)
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    return lax.le(traced_index(a), traced_index(b))


def fits(start: Any, extent: int, n: int, step: int = 1) -> Any:
    """Whether ``extent`` elements from ``start * step`` lie in ``[0, n)``: ``0 <= start``
    and ``start * step + extent <= n``, tested as ``start <= (n - extent) // step`` (the
    right side static), so that no int32 sum or product of a traced ``start`` can wrap:
    ``start = 2**31 - 1`` with ``extent = 8`` wraps ``start + 8`` to a negative number,
    and a block index ``2**29`` times a block of 8 wraps to 0; both pass a check written
    ``start * step + extent <= n`` in int32 and read other data (issue 42, item 1)."""
    if extent > n:
        return False
    return all_of(at_most(0, start), at_most(start, (n - extent) // step))


def all_of(*conds: Any) -> Any:
    """The conjunction: static ``True`` terms drop out, a static ``False`` decides."""
    out: Any = True
    for c in conds:
        if is_static(c):
            if not c:
                return False
            continue
        out = c if out is True else lax.bitwise_and(out, c)
    return out


def any_of(*conds: Any) -> Any:
    """The disjunction: static ``False`` terms drop out, a static ``True`` decides."""
    out: Any = False
    for c in conds:
        if is_static(c):
            if c:
                return True
            continue
        out = c if out is False else lax.bitwise_or(out, c)
    return out


def negate(c: Any) -> Any:
    return (not c) if is_static(c) else lax.bitwise_not(c)


def traced_bool(c: Any) -> Any:
    """``c`` as a bool scalar value (an array even when static)."""
    return np.bool_(c) if is_static(c) else c
