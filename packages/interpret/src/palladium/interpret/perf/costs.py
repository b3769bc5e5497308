"""What one jaxpr equation costs on a TensorCore, from its shapes and dtypes alone.

One rule per kind of primitive (a table, not a chain): ``dot_general`` on the MXU by
flops, elementwise ops / reductions / transcendentals on the vector unit by (8, 128)
vregs, loads and stores by the vregs they move, everything that only moves data
between refs (DMAs, semaphores: the timeline models those) or holds sub-jaxprs (their
equations are reported one by one) costs nothing here. Values are never looked at, so
``skip_floating_point_ops=True`` predicts the same time.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from palladium.interpret.perf.model import ChipModel

__all__ = ["Cost", "equation_cost"]


@dataclasses.dataclass(frozen=True, slots=True)
class Cost:
    """Seconds one equation keeps its core busy; ``unit`` is ``"mxu"``, ``"vpu"``,
    ``"eup"``, ``"vmem"`` or ``""`` (free); ``flops`` counts MXU flops only."""

    seconds: float
    unit: str
    flops: float = 0.0


FREE = Cost(0.0, "")

#: MXU passes of an f32 matmul, by ``precision``. Mosaic lowers ``None`` / ``DEFAULT``
#: to its default contract precision, which the Pallas TPU matmul guide
#: (docs.jax.dev/en/latest/pallas/tpu/matmul.html) times at the bf16 rate ("197 TFLOP/s
#: of bf16/f32 compute" on v5e): one pass. ``HIGHEST`` lowers to
#: ``#tpu.contract_precision<fp32>``, modelled as XLA TPU's bf16_6x (6 bf16 passes);
#: ``HIGH`` as bf16_3x. (ASSUMPTION for HIGH and HIGHEST: no published Mosaic timing.)
F32_PASSES = {"DEFAULT": 1, "HIGH": 3, "HIGHEST": 6}

_TRANSCENDENTAL = frozenset({
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan",
    "rsqrt", "sqrt", "cbrt", "erf", "erfc", "erf_inv", "atan2", "asin", "acos", "atan",
    "sinh", "cosh", "asinh", "acosh", "atanh", "pow", "lgamma", "digamma", "div",
})
_REDUCTIONS = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
    "reduce_xor", "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin",
    "cumlogsumexp",
})
_LOADS = frozenset({"get", "load"})
_STORES = frozenset({"swap", "masked_swap", "addupdate"})
#: Primitives with no TensorCore cost of their own: ref/DMA/semaphore bookkeeping (the
#: timeline models DMAs and waits), metadata, and control flow (sub-jaxpr equations
#: are reported and costed one by one).
_FREE = frozenset({
    "dma_start", "dma_wait", "semaphore_signal", "semaphore_wait", "semaphore_read",
    "barrier_semaphore", "get_barrier_semaphore", "program_id", "num_programs",
    "axis_index", "multiple_of", "run_scoped", "cond", "while", "scan", "pjit",
    "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
    "custom_vjp_call_jaxpr", "remat", "checkpoint", "delay", "trace_value", "touch",
    "debug_callback", "debug_print", "device_id", "iota", "broadcast_in_dim", "reshape",
    "squeeze", "expand_dims", "bitcast", "bitcast_convert_type", "get_global",
    "prng_seed", "emit_pipeline", "optimization_barrier",
})


def _nbytes(aval: Any) -> int:
    shape = getattr(aval, "shape", ())
    dtype = getattr(aval, "dtype", None)
    try:
        itemsize = np.dtype(dtype).itemsize if dtype is not None else 4
    except TypeError:
        return 0
    return math.prod(shape) * itemsize


def _vregs(aval: Any, chip: ChipModel) -> int:
    """The (8, 128) vregs an array occupies: its 32-bit words, rounded up to vregs
    (a 16-bit array packs two elements per word)."""
    nbytes = _nbytes(aval)
    return max(1, math.ceil(nbytes / chip.vreg_bytes)) if nbytes else 0


def _largest_vregs(eqn: Any, chip: ChipModel) -> int:
    avals = [v.aval for v in (*eqn.invars, *eqn.outvars) if hasattr(v.aval, "shape")]
    return max((_vregs(a, chip) for a in avals), default=0)


def _dot_cost(eqn: Any, chip: ChipModel) -> Cost:
    (lc, _rc), _batch = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
    out = eqn.outvars[0].aval
    contract = math.prod(int(lhs.shape[d]) for d in lc)
    flops = 2.0 * math.prod(out.shape) * contract
    names = {np.dtype(lhs.dtype).name, np.dtype(rhs.dtype).name}
    if names <= {"int8", "uint8", "int4", "uint4"}:
        rate = chip.mxu_int8_ops
    elif all(n.startswith("float8") for n in names):
        rate = chip.mxu_fp8_ops
    elif names & {"float32", "float64"}:
        precision = eqn.params.get("precision")
        if isinstance(precision, tuple):
            precision = precision[0]
        level = getattr(precision, "name", None) or "DEFAULT"
        rate = chip.mxu_bf16_flops / F32_PASSES.get(level, 1)
    else:
        rate = chip.mxu_bf16_flops
    return Cost(flops / rate, "mxu", flops)


def _explicit_mxu_cost(eqn: Any, chip: ChipModel) -> Cost:
    """The explicit MXU operations (v7x): ``matmul_acc_lhs`` multiplies an M x 256 LHS by
    the loaded 256 x 256 weights (2 * M * 256 * 256 flops at the dtype's MXU rate);
    pushing an RHS and popping a result move their vregs through the MXU's push / pop
    slots, one vreg per cycle (the bundle's matrix-push and -pop slots, see model.py).
    ASSUMPTION: the core's whole MXU rate for one MXU's matmul (a kernel using both MXUs
    alternates between them, which this sequential model does not overlap)."""
    name = str(eqn.primitive)
    if name == "matmul_acc_lhs":
        lhs = eqn.invars[0].aval
        flops = 2.0 * int(lhs.shape[0]) * 256 * 256
        rate = (chip.mxu_fp8_ops if np.dtype(lhs.dtype).name.startswith("float8")
                else chip.mxu_bf16_flops)
        return Cost(flops / rate, "mxu", flops)
    moved = eqn.invars[0].aval if name == "matmul_push_rhs" else eqn.outvars[0].aval
    return Cost(_vregs(moved, chip) / chip.clock_hz, "mxu")


_EXPLICIT_MXU = frozenset({"matmul_push_rhs", "matmul_acc_lhs", "matmul_pop"})


def equation_cost(eqn: Any, chip: ChipModel) -> Cost:
    """The cost of one equation on ``chip``'s TensorCore."""
    name = str(eqn.primitive)
    if name in _FREE or any(hasattr(p, "eqns") or hasattr(p, "jaxpr")
                            for p in eqn.params.values()):
        return FREE
    if name == "dot_general":
        return _dot_cost(eqn, chip)
    if name in _EXPLICIT_MXU:
        return _explicit_mxu_cost(eqn, chip)
    if name in _LOADS:
        n = sum(_vregs(v.aval, chip) for v in eqn.outvars)
        return Cost(n / (chip.vmem_vregs_per_cycle * chip.clock_hz), "vmem")
    if name in _STORES:
        n = _vregs(eqn.invars[1].aval, chip) if len(eqn.invars) > 1 else 0
        return Cost(n / (chip.vmem_vregs_per_cycle * chip.clock_hz), "vmem")
    vregs = _largest_vregs(eqn, chip)
    if not vregs:
        return FREE
    if name in _TRANSCENDENTAL:
        return Cost(vregs / (chip.eup_vreg_ops_per_cycle * chip.clock_hz), "eup")
    if name in _REDUCTIONS:
        # a reduction reads every vreg once (a VALU op each) and finishes with a
        # cross-lane step per output vreg: model it as one op per input vreg.
        vregs = max(_vregs(v.aval, chip) for v in eqn.invars)
    return Cost(vregs / (chip.vpu_vreg_ops_per_cycle * chip.clock_hz), "vpu")
