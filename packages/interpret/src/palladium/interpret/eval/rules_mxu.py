"""The explicit MXU operations (``pltpu.matmul_push_rhs`` / ``matmul_acc_lhs`` /
``matmul_pop``, TPU v7 and newer), modelled per core with numpy.

Each MXU of a core (``num_mxus`` of jax's ``tpu_info``) has staging registers, the
weights (RHS) it multiplies by, and an accumulator memory of ``num_accumulators``
(8, 256) 32-bit buffers. What the TPU compiler (libtpu 0.0.42.1, v7x) accepts was
measured (``tests/compiler/test_mxu.py``), and is checked here:

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
from palladium.interpret.chip import chip_facts
from palladium.interpret.errors import KernelError, TpuLoweringError
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.registry import rule

__all__ = ["MxuState"]

_RHS_SIZE = 256
_STAGING_REGISTERS = 2
_ROWS_PER_ADDRESS = 4
_PUSH_DTYPES = frozenset({"float32", "bfloat16", "float8_e4m3fn", "float8_e5m2"})


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
        shape = (self.num_mxus, self.accumulator_rows, _RHS_SIZE)
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
        chip = ev.params.chip or "v5e"
        facts = chip_facts(chip)
        if facts.generation < 7 or not facts.num_accumulators:
            raise TpuLoweringError(
                f"{eqn.primitive}: the TPU compiler rejects the explicit MXU operations on "
                f"TPU {chip} (\"Explicit MXU ops not supported on TPU generations < 7\"); "
                "simulate a v7x (InterpretParams(chip='v7x')) or write the product with "
                f"jnp.dot ({ev.site(eqn)})")
        state = MxuState(facts.num_mxus, facts.num_accumulators * facts.num_sublanes)
        ev.state.mxu = state
    return state


def _refuse(ev: KernelContext, eqn: Equation, why: str) -> TpuLoweringError:
    return TpuLoweringError(
        f"{eqn.primitive}: {why}; a TPU rejects this kernel at compile time "
        f"({ev.site(eqn)})")


def _value(ev: KernelContext, eqn: Equation, value: Value, what: str) -> np.ndarray:
    if not isinstance(value, np.ndarray | np.generic):
        raise KernelError(f"{eqn.primitive}: the {what} must be a value (x_ref[...]), not "
                          f"a ref ({ev.site(eqn)})")
    return np.asarray(value)


def _mxu(ev: KernelContext, eqn: Equation, state: MxuState) -> int:
    index = int(eqn.params["mxu_index"])
    if not 0 <= index < state.num_mxus:
        raise _refuse(ev, eqn, f"mxu_index={index}, but a TPU {ev.params.chip} core has "
                               f"{state.num_mxus} MXUs")
    return index


def _rows(ev: KernelContext, eqn: Equation, state: MxuState, addr: int, m: int) -> slice:
    units = state.accumulator_rows // _ROWS_PER_ADDRESS
    if addr % 2 or addr < 0:
        raise _refuse(ev, eqn, f"acc_addr={addr} is not an even accumulator address")
    if addr + -(-m // _ROWS_PER_ADDRESS) > units:
        raise _refuse(ev, eqn, f"acc_addr={addr} with {m} rows ends past the {units} "
                               "accumulator addresses (\"OOB accumulator access\")")
    start = addr * _ROWS_PER_ADDRESS
    return slice(start, start + m)


@rule(*[p for p in (jc.matmul_push_rhs_p,) if p is not None])
def _push_rhs(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    state = _state(ev, eqn)
    mxu = _mxu(ev, eqn, state)
    rhs = _value(ev, eqn, invals[0], "RHS")
    register = int(eqn.params["staging_register"])
    if rhs.shape != (_RHS_SIZE, _RHS_SIZE):
        raise _refuse(ev, eqn, f"the pushed RHS must be 256x256, got {rhs.shape}")
    if rhs.dtype.name not in _PUSH_DTYPES:
        raise _refuse(ev, eqn, f"unsupported element type for matmul push rhs: {rhs.dtype}")
    if not 0 <= register < _STAGING_REGISTERS:
        raise _refuse(ev, eqn, f"invalid staging register: {register} (0 or 1)")
    if (mxu, register) in state.staged:
        raise _refuse(ev, eqn, f"staging register {register} of MXU {mxu} already holds an "
                               "RHS not yet loaded by matmul_acc_lhs (\"Cannot schedule FIFO "
                               "push instruction when the FIFO is full\")")
    state.staged[(mxu, register)] = rhs.T if eqn.params.get("transpose") else rhs
    return []


@rule(*[p for p in (jc.matmul_acc_lhs_p,) if p is not None])
def _acc_lhs(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    state = _state(ev, eqn)
    mxu = _mxu(ev, eqn, state)
    lhs = _value(ev, eqn, invals[0], "LHS")
    if lhs.ndim != 2 or lhs.shape[1] != _RHS_SIZE:
        raise _refuse(ev, eqn, f"the LHS must be M x 256, got {lhs.shape}")
    rows_multiple = 8 * max(1, 4 // lhs.dtype.itemsize)
    if lhs.shape[0] % rows_multiple:
        raise _refuse(ev, eqn, f"the non-contracting dimension of the LHS must be a multiple "
                               f"of {rows_multiple} for {lhs.dtype}, got {lhs.shape[0]}")
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
    if n != _RHS_SIZE:
        raise _refuse(ev, eqn, f"the popped shape must be M x 256, got {(m, n)}")
    rows = _rows(ev, eqn, state, int(eqn.params["acc_addr"]), m)
    out = state.accumulators[mxu, rows].astype(np.dtype(eqn.params["dtype"]))
    state.accumulators[mxu, rows] = 0.0
    state.live[mxu, rows] = False
    return [out]
