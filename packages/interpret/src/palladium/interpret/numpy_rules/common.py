"""The numpy rules' shared machinery: the two rule tables, the registering decorator, the
dtype sets and XLA CPU's float helpers (widen to f32, flush subnormals, round back)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

import ml_dtypes
import numpy as np
from jax.extend.core import Primitive

Rule = Callable[..., Any]

NUMPY_RULES: dict[Primitive, Rule] = {}
"""The registry: primitive -> numpy rule (see the module docstring for the contract)."""

PREFLUSHED_RULES: dict[Primitive, Rule] = {}
"""Variants of rules for when every floating operand is f32 and known to hold no
subnormals (the evaluator knows it of the results of ``FLUSHING`` and ``PRESERVING``
primitives): they skip flushing their operands. On such operands each gives the same
result as its ``NUMPY_RULES`` rule."""
DETERMINISTIC_RULES: dict[Primitive, Rule] = {}
"""Rules that give the same bits on every CPU, used instead of ``NUMPY_RULES``' with
``InterpretParams(deterministic_dot=True)`` (``dot_general``: summed in order)."""


F32 = np.dtype(np.float32)
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
BOOL = np.dtype(np.bool_)
FLOATS = frozenset({F32, BF16, F16})
INTS = frozenset(
    np.dtype(t)
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
)
INTS_BOOL = INTS | {BOOL}
SMALL_INTS = frozenset(t for t in INTS if t.itemsize <= 4)
TINY = np.float32(np.finfo(np.float32).tiny)
ZERO = np.float32(0.0)
ONE = np.float32(1.0)
HALF = np.float32(0.5)


def register(
    *primitives: Primitive | None, table: dict[Primitive, Rule] = NUMPY_RULES
) -> Callable[[Rule], Rule]:
    """Registers a rule for ``primitives`` in ``table``; makes 0-d results arrays, not scalars.

    A ``None`` primitive (absent from the installed jax, see ``_jax_compat``) is skipped.
    """
    present = tuple(p for p in primitives if p is not None)

    def wrap(fn: Rule) -> Rule:
        if not present:
            return fn
        multiple = present[0].multiple_results

        @functools.wraps(fn)
        def rule(*args: Any, **params: Any) -> Any:
            out = fn(*args, **params)
            if out is NotImplemented:
                return out
            if multiple:
                return [np.asarray(o) for o in out]
            return np.asarray(out)

        for p in present:
            table[p] = rule
        return fn

    return wrap


# True while the evaluator runs a kernel body: it has set ``np.errstate(all="ignore")``
# for the whole body already, so the rules need not set it again for each operation.
# A ContextVar, so that it is right per thread and per greenlet.
ERRORS_IGNORED: ContextVar[bool] = ContextVar("palladium_numpy_errors_ignored", default=False)
_ALREADY_QUIET = contextlib.nullcontext()


def quiet() -> contextlib.AbstractContextManager[Any]:
    """``np.errstate(all="ignore")``, unless the evaluator has set it already: the
    floating-point warnings of the rules' numpy calls are not the user's (XLA computes
    the same values silently)."""
    return _ALREADY_QUIET if ERRORS_IGNORED.get() else np.errstate(all="ignore")


def arr(x: Any) -> np.ndarray:
    """A numpy array of ``x``, keeping the dtype of typed jax literals."""
    if type(x) is np.ndarray:
        return x
    return np.asarray(x, dtype=getattr(x, "dtype", None))


# Subnormals are found from the raw bits, never by float comparison: XLA runs host
# callbacks (so every launch) with denormals-are-zero set, and there ``abs(x) != 0`` is
# False for a subnormal ``x``. Integer ops see the bits whatever the FP environment.
_ABS_BITS = np.uint32(0x7FFFFFFF)
_SIGN_BITS = np.uint32(0x80000000)
_MIN_NORMAL_BITS = np.uint32(0x00800000)  # the bits of TINY
_ONE_BIT = np.uint32(1)


def _magnitude_bits(x: np.ndarray) -> np.ndarray:
    """The f32 array ``x``'s bits without the sign (subnormal: 1 ..  0x7FFFFF)."""
    return np.bitwise_and(x.view(np.uint32), _ABS_BITS)


def flush(x: np.ndarray) -> np.ndarray:
    """Subnormal f32 values -> zeros of the same sign (XLA CPU's DAZ/FTZ), from the bits
    (right in any floating-point environment)."""
    if x.size == 0:
        return x
    a = _magnitude_bits(x)
    if a.min() >= _MIN_NORMAL_BITS:  # the common case: one reduction (NaNs are large)
        return x
    a -= _ONE_BIT  # zeros wrap to the top: subnormals are exactly the a < MIN - 1
    small = a < _MIN_NORMAL_BITS - _ONE_BIT
    if small.any():
        bits = x.view(np.uint32)
        return np.where(small, bits & _SIGN_BITS, bits).view(F32)
    return x


# True while the evaluator runs a kernel body in a thread whose FP environment flushes
# f32 subnormals as XLA CPU does (``hardware_flushes``): there IEEE arithmetic (add, sub,
# mul, div, sums) reads a subnormal operand as a zero of its sign and writes a zero of
# its sign for a subnormal result, exactly what ``f32`` and ``back`` do, so the rules of
# those operations skip both (XLA runs a launch, and so the evaluator, in such a thread).
HARDWARE_FLUSHES: ContextVar[bool] = ContextVar("palladium_hardware_flushes", default=False)
_SUBNORMALS = np.array([0x00000001, 0x807FFFFF], np.uint32).view(np.float32)
_TWO_TO_64 = np.float32(2.0**64)
_SMALL = np.array([1e-30, -1e-30], np.float32)
_SMALLER = np.float32(1e-10)


def hardware_flushes() -> bool:
    """Whether this thread reads f32 subnormals as zero (DAZ) and writes zero for
    subnormal results (FTZ), from two probes: a subnormal times 2**64 (normal unless
    read as zero) and 1e-30 times 1e-10 (subnormal unless flushed)."""
    with np.errstate(all="ignore"):
        read = np.multiply(_SUBNORMALS, _TWO_TO_64)
        written = np.multiply(_SMALL, _SMALLER)
    return not (_magnitude_bits(read).any() or _magnitude_bits(written).any())


def f32(x: np.ndarray) -> np.ndarray:
    """The f32 value XLA computes with for a float input: widened, subnormals flushed."""
    if x.dtype != F32:
        x = x.astype(F32)
    return flush(x)


def back(r: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """An f32 result flushed and rounded to ``dtype``."""
    r = flush(np.asarray(r, F32))
    return r if dtype == F32 else r.astype(dtype)


MIXED = np.dtype(object)  # in none of the dtype sets: mixed operands are declined


def same_dtype(xs: Sequence[np.ndarray]) -> np.dtype:
    dt = xs[0].dtype
    return dt if all(x.dtype == dt for x in xs) else MIXED



def xla_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """max with NaN propagation and -0 < +0 (f32, already flushed)."""
    r = np.maximum(a, b)
    # np.maximum differs from XLA only on ties of zeros of opposite signs (equal nonzero
    # values have equal bits): fix those, when there are zeros at all.
    zero = r == 0
    if zero.any():
        r = np.where(zero & (a == b), np.where(np.signbit(a), b, a), r)
    return r


def xla_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    r = np.minimum(a, b)
    zero = r == 0
    if zero.any():
        r = np.where(zero & (a == b), np.where(np.signbit(a), a, b), r)
    return r


def f32_flushed(x: np.ndarray) -> np.ndarray:
    """``f32`` of an operand known to hold no subnormals when it is f32."""
    return x if x.dtype == F32 else f32(x)


def back_flushed(r: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``back`` of a result that cannot hold subnormals (max/min of flushed values)."""
    return r if dtype == F32 else back(r, dtype)



def has_subnormal_f32(x: np.ndarray) -> bool:
    """Whether the f32 array ``x`` holds a subnormal value (that ``flush`` rewrites)."""
    a = _magnitude_bits(np.asarray(x, F32))
    a -= _ONE_BIT
    return bool((a < _MIN_NORMAL_BITS - _ONE_BIT).any())


def has_subnormal(x: np.ndarray) -> bool:
    """Whether the float array ``x`` widened to f32 holds a subnormal (f16 subnormals
    are normal f32 values), from the bits."""
    if x.dtype == F32:
        return has_subnormal_f32(x)
    if x.dtype == BF16:
        return has_bf16_subnormal(x)
    return False


def has_negative_subnormal(x: np.ndarray) -> bool:
    """Whether the float array ``x`` widened to f32 holds a negative subnormal."""
    if x.dtype == BF16:
        x = x.astype(F32)  # exact: bf16 is the top half of an f32
    elif x.dtype != F32:
        return False
    bits = x.view(np.uint32)
    a = np.bitwise_and(bits, _ABS_BITS)
    a -= _ONE_BIT
    return bool(((a < _MIN_NORMAL_BITS - _ONE_BIT) & (bits >= _SIGN_BITS)).any())


def has_bf16_subnormal(x: np.ndarray) -> bool:
    bits = x.view(np.uint16)
    return bool((((bits & 0x7F80) == 0) & ((bits & 0x007F) != 0)).any())


def is_nonzero(x: np.ndarray) -> np.ndarray:
    """``x != 0`` of a bf16/f16 array from its bits (a subnormal is nonzero even where
    the FP environment reads it as zero)."""
    return np.bitwise_and(x.view(np.uint16), np.uint16(0x7FFF)) != 0
