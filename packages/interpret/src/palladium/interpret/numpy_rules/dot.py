"""``dot_general`` as one batched numpy matmul (f32 accumulation for floats, 64-bit for integers).

Float results depend on the host CPU: numpy's BLAS (OpenBLAS) picks its kernel family, and so
its accumulation order, per CPU, as XLA's own CPU dot does; integer results are exact.
``InterpretParams(deterministic_dot=True)`` selects ``DETERMINISTIC_RULES``' dot instead: the
contracted dimension summed in order, one correctly rounded f32 multiply and add per term
(elementwise numpy operations, which no CPU's SIMD width or BLAS changes), the same bits on
every host; its cost is in benchmarks/LOG.md ("Deterministic dot").

See the package docstring for the rule contract and the accuracy classes."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax import lax

from palladium.interpret.numpy_rules.common import (
    DETERMINISTIC_RULES,
    F32,
    FLOATS,
    INTS,
    PREFLUSHED_RULES,
    Rule,
    arr,
    back,
    f32,
    f32_flushed,
    quiet,
    register,
)


def _dot_general_rule(flushed_inputs: bool, ordered: bool = False) -> Rule:
    """The rule of ``dot_general``: inputs flushed of subnormals first or not; with
    ``ordered`` (``InterpretParams(deterministic_dot=True)``) float dots summed in order."""
    widen = f32_flushed if flushed_inputs else f32

    def rule(
        lhs: Any,
        rhs: Any,
        *,
        dimension_numbers: Any,
        precision: Any = None,
        preferred_element_type: Any = None,
        out_sharding: Any = None,
    ) -> Any:
        return _dot_general(lhs, rhs, dimension_numbers, preferred_element_type, widen,
                            ordered=ordered)

    return rule


def _ordered_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` (batched, f32) summed over k in order: ``acc = acc + a[.., k] * b[k, ..]``,
    each product and sum rounded to f32 on its own (no FMA, no reassociation)."""
    batch, m, k = a.shape
    acc = np.zeros((batch, m, b.shape[2]), F32)
    term = np.empty_like(acc)
    for t in range(k):
        np.multiply(a[:, :, t : t + 1], b[:, t : t + 1, :], out=term)
        np.add(acc, term, out=acc)
    return acc


def _dot_general(
    lhs: Any,
    rhs: Any,
    dimension_numbers: Any,
    preferred_element_type: Any,
    widen: Callable[[np.ndarray], np.ndarray],
    ordered: bool = False,
) -> Any:
    lhs, rhs = arr(lhs), arr(rhs)
    (lc, rc), (lb, rb) = dimension_numbers
    lc, rc, lb, rb = tuple(lc), tuple(rc), tuple(lb), tuple(rb)
    if lhs.dtype != rhs.dtype and not (
        lhs.dtype in FLOATS and rhs.dtype in FLOATS
        and (preferred_element_type is not None or ordered)
    ):
        # Mixed floats (paged attention's f32 x bf16) widen both to f32 like equal ones.
        return NotImplemented
    out_dt = np.dtype(preferred_element_type) if preferred_element_type is not None else lhs.dtype
    if lhs.dtype in FLOATS and out_dt in FLOATS:
        compute: np.dtype = F32
    elif lhs.dtype in INTS and out_dt in INTS:
        compute = np.dtype(np.int64 if lhs.dtype.kind == "i" else np.uint64)
    else:
        return NotImplemented
    lf = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
    rf = [d for d in range(rhs.ndim) if d not in rc and d not in rb]

    def size(a: np.ndarray, dims: Sequence[int]) -> int:
        return math.prod(a.shape[d] for d in dims)  # np.prod costs ~5 us per call

    batch = size(lhs, lb)
    a = np.transpose(lhs, (*lb, *lf, *lc)).reshape(batch, size(lhs, lf), size(lhs, lc))
    b = np.transpose(rhs, (*rb, *rc, *rf)).reshape(batch, size(rhs, rc), size(rhs, rf))
    if compute == F32:
        a, b = widen(a), widen(b)
    else:
        a, b = a.astype(compute), b.astype(compute)
    with quiet():
        r = _ordered_matmul(a, b) if ordered and compute == F32 else np.matmul(a, b)
    shape = (*(lhs.shape[d] for d in lb), *(lhs.shape[d] for d in lf), *(rhs.shape[d] for d in rf))
    r = r.reshape(shape)
    return back(r, out_dt) if compute == F32 else r.astype(out_dt)


register(lax.dot_general_p)(_dot_general_rule(flushed_inputs=False))
register(lax.dot_general_p, table=PREFLUSHED_RULES)(_dot_general_rule(flushed_inputs=True))
register(lax.dot_general_p, table=DETERMINISTIC_RULES)(
    _dot_general_rule(flushed_inputs=False, ordered=True))
