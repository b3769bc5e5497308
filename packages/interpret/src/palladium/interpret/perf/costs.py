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

import jax.numpy as jnp
import numpy as np

from palladium.interpret.perf.model import ChipModel

__all__ = ["Cost", "equation_cost"]


@dataclasses.dataclass(frozen=True, slots=True)
class Cost:
    """Seconds one equation keeps its core busy; ``unit`` is ``"mxu"``, ``"vpu"``,
    ``"eup"``, ``"vmem"`` or ``""`` (free); ``flops`` counts MXU flops only,
    ``vector_flops`` the elements of floating-point arithmetic on the vector unit (one
    per output element, per input element for reductions: what XLA's cost analysis
    counts) and ``transcendentals`` the elements of transcendental functions."""

    seconds: float
    unit: str
    flops: float = 0.0
    vector_flops: float = 0.0
    transcendentals: float = 0.0
    #: its latency on a chain of dependent equations (a loop's carry, one row a step):
    #: what it adds when the next equation must wait for its result
    latency: float = 0.0
    #: the parts the unit streams one after the other (a dot's blocks of ``mxu_rows``
    #: left-operand rows): a dependent equation may start on the first part
    parts: int = 1
    #: a reduction over the lanes (on the chain: the cross-lane unit's latency; its
    #: result holds the value in every lane)
    lanes: bool = False
    #: the operands (by position) whose one lane is spread over the lanes (a (n, 1)
    #: column broadcast against (n, m)): the cross-lane unit's latency on the chain,
    #: unless the column came from a lane reduction
    spread: tuple[int, ...] = ()
    #: its result is too big for the vector registers (``ChipModel.spill_vregs``): it
    #: is written to VMEM whole, and a dot taking it as its left operand waits for all
    #: of it, not for its first rows
    spills: bool = False


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
#: Floating-point arithmetic counted as flops (one per element) by ``pl.CostEstimate``.
_ARITHMETIC = frozenset({
    "add", "add_any", "sub", "mul", "div", "max", "min", "neg", "abs", "square",
    "integer_pow", "rem", "sign", "floor", "ceil", "round", "clamp", "reduce_sum",
    "reduce_max", "reduce_min", "reduce_prod", "cumsum", "cumprod", "cummax", "cummin",
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


def _vregs(aval: Any, chip: ChipModel) -> int:
    """The vregs an array occupies: a 2-D (or higher) array whole (8, 128) tiles of
    32-bit words over its last two dimensions (16-bit types packing two rows in one
    sublane), a 1-D array its words rounded up to vregs."""
    shape = getattr(aval, "shape", ())
    try:
        itemsize = np.dtype(aval.dtype).itemsize
    except TypeError:
        return 0
    return _tiles(shape, itemsize, chip)


def _tiles(shape: tuple[int, ...], itemsize: int, chip: ChipModel) -> int:
    if not shape or not math.prod(shape):
        return 0
    if len(shape) == 1:
        return max(1, math.ceil(int(shape[0]) * itemsize / chip.vreg_bytes))
    sublanes, lanes = chip.vreg_tile
    pack = max(1, 4 // itemsize)
    return (math.prod(int(d) for d in shape[:-2])
            * math.ceil(int(shape[-2]) / (sublanes * pack)) * math.ceil(int(shape[-1]) / lanes)
            * max(1, itemsize // 4))


def _dot_cost(eqn: Any, chip: ChipModel) -> Cost:
    (lc, _rc), _batch = eqn.params["dimension_numbers"]
    _rc = tuple(_rc)
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
        passes = chip.f32_highest_passes if level == "HIGHEST" else F32_PASSES.get(level, 1)
        rate = chip.mxu_bf16_flops / passes
    else:
        rate = chip.mxu_bf16_flops
    # one dot's fixed cost (fill and drain) and its weight tiles' loads (measured on the
    # chip: benchmarks/chip/calibration_kernels.py's mxu/ group)
    batch = math.prod(int(rhs.shape[d]) for d in _batch[1]) if _batch[1] else 1
    n = math.prod(int(s) for i, s in enumerate(rhs.shape)
                  if i not in _rc and i not in (_batch[1] or ()))
    tiles = batch * math.ceil(contract / 128) * math.ceil(max(n, 1) / 128)
    seconds = flops / rate + tiles * chip.mxu_weight_tile_seconds
    if chip.mxu_transposed_rhs_seconds and len(rhs.shape) - 1 in _rc and n >= 128:
        # q @ k.T: its transpose, per 256 rows begun, from 128 rows on (r14: dependent
        # dots on (128, 128) blocks 21 ns a dot over untransposed, on (64, 128) none;
        # mxu2: (256, 128) 21 ns; longer operands as the per-vreg fit of mxu2 had them)
        seconds += chip.mxu_transposed_rhs_seconds * math.ceil(n / 256)
    if len(lhs.shape) >= 2 and len(lhs.shape) - 2 in lc:
        # a left operand contracting its rows (p.T @ do): transposed first, at the
        # measured transpose rate (round 6's dkv step: -25% -> -11%; gated-delta -2% -> 0)
        seconds += _vregs(lhs, chip) * chip.vector_vreg_seconds("transpose", False)
    # the fixed cost (fill and drain) is latency: the MXU takes the next independent
    # dot meanwhile, a result's user waits for it; the left operand's rows stream
    # through in blocks of mxu_rows, so a dependent dot starts on the first block
    # (measured: benchmarks/chip/calibration_kernels.py's r3/dots group)
    rows = math.prod(int(s) for i, s in enumerate(lhs.shape)
                     if i not in lc and i not in (_batch[0] or ()))
    parts = batch * max(1, math.ceil(rows / max(chip.mxu_rows, 1)))
    return Cost(seconds, "mxu", flops, latency=seconds + chip.mxu_dot_seconds, parts=parts)


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
    cost = _equation_cost(eqn, chip, name)
    if (chip.spill_vregs and cost.unit in ("vpu", "eup")
            and sum(_vregs(v.aval, chip) for v in eqn.outvars) >= chip.spill_vregs):
        cost = dataclasses.replace(cost, spills=True)
    if chip.xlu_latency_seconds and not cost.lanes and cost.unit in ("vpu", ""):
        spread = _spread(eqn, name)
        if spread:
            return dataclasses.replace(cost, spread=spread)
    return cost


def _equation_cost(eqn: Any, chip: ChipModel, name: str) -> Cost:
    if name in _FREE or any(hasattr(p, "eqns") or hasattr(p, "jaxpr")
                            for p in eqn.params.values()):
        return FREE
    if name == "dot_general":
        return _dot_cost(eqn, chip)
    if name in _EXPLICIT_MXU:
        return _explicit_mxu_cost(eqn, chip)
    if name in _LOADS:
        n = sum(_vregs(v.aval, chip) for v in eqn.outvars)
        return Cost(n * chip.vmem_seconds_per_vreg(), "vmem", latency=chip.load_use_seconds)
    if name in _STORES:
        n = _vregs(eqn.invars[1].aval, chip) if len(eqn.invars) > 1 else 0
        return Cost(n * chip.vmem_seconds_per_vreg(), "vmem", latency=chip.load_use_seconds)
    if all(not getattr(v.aval, "shape", ()) for v in (*eqn.invars, *eqn.outvars)):
        # scalar arithmetic (grid indices, addresses): a slot's issue, off the vector
        # chain (the replay's DMA issue times depend on it being non-zero)
        return Cost(chip.vector_vreg_seconds(name, False), "vpu")
    vregs = _vector_vregs(eqn, chip, name in _TRANSCENDENTAL)
    if not vregs:
        return FREE
    floating = any(_is_float(v.aval) for v in eqn.outvars)
    per_vreg = chip.vector_vreg_seconds(name, name in _TRANSCENDENTAL)
    # (one unit: the measured costs of transcendentals include the vector ALU work
    # around the EUP, and added up in chains on the chip)
    latency = chip.vector_latency(name, name in _TRANSCENDENTAL, per_vreg)
    if name in _TRANSCENDENTAL:
        # div runs on the EUP (a reciprocal) but XLA counts it as a flop, not a
        # transcendental: so does the CostEstimate.
        n = _elements(eqn.outvars) if floating else 0
        return Cost(vregs * per_vreg, "vpu", vector_flops=n if name == "div" else 0.0,
                    transcendentals=0.0 if name == "div" else n, latency=latency)
    n = 0
    if name in _REDUCTIONS:
        # a reduction reads every vreg once (a VALU op each) and finishes with a
        # cross-lane step per output vreg: model it as one op per input vreg; on the
        # chain, one over the lanes waits for the cross-lane unit, one over sublanes
        # or leading dimensions for a short tree of ops
        n = _elements(eqn.invars) if floating and name in _ARITHMETIC else 0
        if chip.xlu_latency_seconds and _over_lanes(eqn):
            return Cost(vregs * per_vreg, "vpu", vector_flops=n,
                        latency=chip.xlu_latency_seconds, lanes=True)
        latency = max(latency, chip.sublane_reduce_latency_seconds)
    elif name in _ARITHMETIC and floating:
        n = _elements(eqn.outvars)
    return Cost(vregs * per_vreg, "vpu", vector_flops=n, latency=latency)


def _vector_vregs(eqn: Any, chip: ChipModel, transcendental: bool) -> float:
    """The 32-bit vregs of work of a vector op: its largest array's (its input's for a
    reduction), a 16-bit float element costing the chip's narrow factor of a 32-bit
    one (v5e has no bf16 vector unit: measured 1.9x), other types by their bytes."""
    reduction = str(eqn.primitive) in _REDUCTIONS
    avals = [v.aval for v in (eqn.invars if reduction else (*eqn.invars, *eqn.outvars))
             if hasattr(v.aval, "shape")]
    best = 0.0
    for aval in avals:
        try:
            dtype = np.dtype(aval.dtype)
        except TypeError:
            continue
        if not math.prod(aval.shape):
            continue
        if dtype.name in ("bfloat16", "float16"):
            factor = (chip.narrow_transcendental_factors.get(
                str(eqn.primitive), chip.narrow_transcendental_factor) if transcendental
                else chip.narrow_valu_factor)
            words = _tiles(aval.shape, 4, chip) * factor
        else:
            words = _tiles(aval.shape, dtype.itemsize, chip)
        best = max(best, max(1.0, math.ceil(words)))
    return best


def _over_lanes(eqn: Any) -> bool:
    """A reduction over its operand's last (lane) dimension."""
    shape: tuple[int, ...] = tuple(getattr(eqn.invars[0].aval, "shape", ()))
    axes = eqn.params.get("axes", eqn.params.get("axis", ()))
    axes = axes if isinstance(axes, tuple | list) else (axes,)
    return bool(shape) and shape[-1] > 1 and (len(shape) - 1) in tuple(axes)


def _spread(eqn: Any, name: str) -> tuple[int, ...]:
    """The operands whose last dimension of 1 is spread over an output's lanes (a
    broadcast, or an elementwise op broadcasting a column)."""
    if name in _REDUCTIONS or not eqn.outvars:
        return ()
    out: tuple[int, ...] = tuple(getattr(eqn.outvars[0].aval, "shape", ()))
    if len(out) < 2 or out[-1] <= 1:
        return ()
    found = []
    for i, v in enumerate(eqn.invars):
        shape: tuple[int, ...] = tuple(getattr(v.aval, "shape", ()))
        if len(shape) >= 2 and shape[-1] == 1 and (
                name != "broadcast_in_dim"
                or tuple(eqn.params.get("broadcast_dimensions", ()))[-1:] == (len(out) - 1,)):
            found.append(i)
    return tuple(found)


def _is_float(aval: Any) -> bool:
    try:
        return bool(jnp.issubdtype(aval.dtype, jnp.inexact))  # bfloat16 too
    except TypeError:
        return False


def _elements(variables: Any) -> int:
    """The elements of the largest array among ``variables``."""
    return max((math.prod(v.aval.shape) for v in variables if hasattr(v.aval, "shape")),
               default=0)
