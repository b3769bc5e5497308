"""The explicit MXU operations (``pltpu.matmul_push_rhs`` / ``matmul_acc_lhs`` /
``matmul_pop``, TPU v7 and newer), modelled per core with numpy.

Each MXU of a core (``num_mxus`` of jax's ``tpu_info``) has staging registers, the
weights (RHS) it multiplies by, and an accumulator memory of ``num_accumulators``
(8, 256) 32-bit buffers. What the TPU compiler (libtpu 0.0.42.1, v7x) accepts was
measured (``tests/compiler/test_mxu.py``); ``fidelity/compiler_rejects.py`` decides
it, and these rules ask it:

* ``matmul_push_rhs(rhs, staging_register, mxu_index, transpose=)``: a 256x256 RHS of
  f32, bf16 or float8 into staging register 0 or 1 ("invalid staging register: 2"),
  transposed if asked. Pushing into a register that still holds one fails ("Cannot
  schedule FIFO push instruction when the FIFO is full").
* ``matmul_acc_lhs(acc_addr, lhs, mxu_index, load_staged_rhs=)``: first, if
  ``load_staged_rhs`` is given, the MXU's weights become that register's RHS (the
  register is emptied); then ``lhs @ weights`` (lhs M x 256, M a multiple of 8 rows per
  32-bit packing: 16 for bf16) is *added* to the accumulator slice at ``acc_addr``.
  Addresses count units of 4 rows, are even, and the slice must end within
  ``2 * num_accumulators`` units ("OOB accumulator access").
* ``matmul_pop(acc_addr, shape, dtype, mxu_index)``: the accumulator slice (M x 256) as
  ``dtype`` (f32 or int32), which is then zeroed.

A kernel must leave no RHS staged and no accumulator slice un-popped at its end (jax's
docstrings): palladium checks it when a core finishes. On a chip before v7 the compiler
rejects these operations ("Explicit MXU ops not supported on TPU generations < 7").
"""

from __future__ import annotations

import dataclasses

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.chip import DEFAULT_CHIP, chip_record
from palladium.interpret.errors import KernelError, TpuLoweringError
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.registry import rule
from palladium.interpret.fidelity import compiler_rejects as rejects

__all__ = ["MxuState"]



@dataclasses.dataclass(eq=False)
class MxuState:
    """The MXUs of one core: staged RHS, loaded weights and accumulators."""

    num_mxus: int
    accumulator_rows: int
    staged: dict[tuple[int, int], np.ndarray] = dataclasses.field(default_factory=dict)
    weights: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)
    accumulators: np.ndarray = dataclasses.field(init=False)
    #: Rows written since last popped, per MXU (for the end-of-kernel check).
    live: np.ndarray = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        shape = (self.num_mxus, self.accumulator_rows, rejects.RHS_SIZE)
        self.accumulators = np.zeros(shape, np.float32)
        self.live = np.zeros(shape[:2], bool)

    def leftovers(self) -> list[str]:
        """What the kernel left in the MXUs (it must leave nothing)."""
        left = [f"an RHS staged in register {r} of MXU {m}" for m, r in sorted(self.staged)]
        for m in range(self.num_mxus):
            rows = np.flatnonzero(self.live[m])
            if rows.size:
                left.append(f"accumulator rows {rows[0]}..{rows[-1]} of MXU {m} not popped")
        return left


def _state(ev: KernelContext, eqn: Equation) -> MxuState:
    state = ev.state.mxu
    if state is None:
        chip = ev.params.chip or DEFAULT_CHIP
        rejected = rejects.explicit_mxu(chip)
        if rejected is not None:
            raise TpuLoweringError(
                f"{eqn.primitive}: {rejected}; simulate a v7x (InterpretParams(chip='v7x')) "
                f"or write the product with jnp.dot ({ev.site(eqn)})")
        facts = chip_record(chip).facts
        state = MxuState(facts.num_mxus, facts.num_accumulators * facts.num_sublanes)
        ev.state.mxu = state
    return state


def _refuse_if(ev: KernelContext, eqn: Equation, why: str | None) -> None:
    """``TpuLoweringError`` for what ``compiler_rejects`` found, if anything."""
    if why is not None:
        raise TpuLoweringError(
            f"{eqn.primitive}: {why}; a TPU rejects this kernel at compile time "
            f"({ev.site(eqn)})")


def _value(ev: KernelContext, eqn: Equation, value: Value, what: str) -> np.ndarray:
    if not isinstance(value, np.ndarray | np.generic):
        raise KernelError(f"{eqn.primitive}: the {what} must be a value (x_ref[...]), not "
                          f"a ref ({ev.site(eqn)})")
    return np.asarray(value)


def _mxu(ev: KernelContext, eqn: Equation, state: MxuState) -> int:
    index = int(eqn.params["mxu_index"])
    _refuse_if(ev, eqn, rejects.mxu_index(index, state.num_mxus, ev.params.chip))
    return index


def _rows(ev: KernelContext, eqn: Equation, state: MxuState, addr: int, m: int) -> slice:
    _refuse_if(ev, eqn, rejects.accumulator_slice(addr, m, state.accumulator_rows))
    start = addr * rejects.ROWS_PER_ADDRESS
    return slice(start, start + m)


@rule(*[p for p in (jc.matmul_push_rhs_p,) if p is not None])
def _push_rhs(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    state = _state(ev, eqn)
    mxu = _mxu(ev, eqn, state)
    rhs = _value(ev, eqn, invals[0], "RHS")
    register = int(eqn.params["staging_register"])
    _refuse_if(ev, eqn, rejects.pushed_rhs(rhs.shape, rhs.dtype.name, register))
    if (mxu, register) in state.staged:
        _refuse_if(ev, eqn, rejects.full_staging_register(register, mxu))
    state.staged[(mxu, register)] = rhs.T if eqn.params.get("transpose") else rhs
    return []


@rule(*[p for p in (jc.matmul_acc_lhs_p,) if p is not None])
def _acc_lhs(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    state = _state(ev, eqn)
    mxu = _mxu(ev, eqn, state)
    lhs = _value(ev, eqn, invals[0], "LHS")
    _refuse_if(ev, eqn, rejects.lhs_operand(lhs.shape, str(lhs.dtype), lhs.dtype.itemsize))
    load = eqn.params.get("load_staged_rhs")
    if load is not None:
        weights = state.staged.pop((mxu, int(load)), None)
        if weights is None:
            raise KernelError(
                f"matmul_acc_lhs(load_staged_rhs={load}) on MXU {mxu}: staging register "
                f"{load} holds no RHS (push one with pltpu.matmul_push_rhs first) "
                f"({ev.site(eqn)})")
        state.weights[mxu] = weights
    weights = state.weights.get(mxu)
    if weights is None:
        raise KernelError(
            f"matmul_acc_lhs on MXU {mxu} without weights: no RHS was ever loaded into it "
            f"(pass load_staged_rhs=<register> after pltpu.matmul_push_rhs) ({ev.site(eqn)})")
    rows = _rows(ev, eqn, state, int(eqn.params["acc_addr"]), lhs.shape[0])
    if not ev.skip_floating_point_ops:
        product = lhs.astype(np.float32) @ weights.astype(np.float32)
        state.accumulators[mxu, rows] += product
    state.live[mxu, rows] = True
    return []


@rule(*[p for p in (jc.matmul_pop_p,) if p is not None])
def _pop(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    state = _state(ev, eqn)
    mxu = _mxu(ev, eqn, state)
    m, n = (int(d) for d in eqn.params["shape"])
    _refuse_if(ev, eqn, rejects.popped_shape(m, n))
    rows = _rows(ev, eqn, state, int(eqn.params["acc_addr"]), m)
    out = state.accumulators[mxu, rows].astype(np.dtype(eqn.params["dtype"]))
    state.accumulators[mxu, rows] = 0.0
    state.live[mxu, rows] = False
    return [out]
