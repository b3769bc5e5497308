"""Where XLA places each ``pallas_call``'s operands in the whole program (issue 40).

A kernel called inside a larger jitted program does not always read and write HBM: XLA's
memory-space assignment may put a TPU custom call's operands and results in VMEM (an
operand copied there by ``copy-start``/``copy-done`` ahead of the call, a result the
next kernel reads from there). Its pipeline's block copies are then VMEM -> VMEM, a few
times faster than from HBM: on a v5e, jax's flash-attention backward (the ``jax.grad``
program) has every operand and result of its dkv and dq kernels in VMEM, and their steps
take their resident time (437 ns at 128-blocks, where the same step from HBM takes 653
ns; ``benchmarks/results_tpu/xla_memory_spaces.v5e.json``, calibration7).

Knowing it needs XLA: the program, its ``pallas_call``s bound with ``interpret=False``,
is lowered for the TPU and compiled by libtpu for a topology of the chip, without a TPU,
in the compiler's own process (``compiler_process``), and the custom calls' layouts are
read (``compiler_protocol.custom_call_placement``). On the v5e the placement compiled
without a TPU equals the chip's on all 80 calibration programs (both files above). Even
a program that is one ``pallas_call`` on its own arguments is compiled: XLA may copy an
argument to the layout the kernel wants and put the copy in VMEM (the gated-delta
kernel's (2, 1024, 1) operands on a v5e).

The answer is kept in memory and in palladium's disk cache (folder ``xla-placement``),
keyed by the lowered program, the chip, the topology and the versions.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.fidelity import tpu_compiler
from palladium.interpret.fidelity.compiler_process import COMPILER_PROCESS
from palladium.interpret.fidelity.compiler_protocol import (
    VMEM_SPACE,
    CallPlacement,
    describe_failure,
)
from palladium.interpret.state.disk_cache import DiskCache
from palladium.interpret.state.process_state import STATE

__all__ = ["ProgramPlacement", "hlo_type", "program_placement"]

_FORMAT = 1
PLACEMENTS = DiskCache("xla-placement")
_MEMORY: dict[str, tuple[CallPlacement, ...]] = STATE.keep(
    "xla_placements", {}, owner=__name__,
    holds="XLA's placement of TPU custom calls' operands, by lowered program",
    clear=lambda: _MEMORY.clear())
_LOCK = threading.Lock()


def hlo_type(shape: Sequence[int], dtype: Any) -> str:
    """An array type as XLA's HLO text writes it: ``f32[1,2,1024,128]``."""
    dt = np.dtype(dtype)
    name = {"bool": "pred", "bfloat16": "bf16"}.get(dt.name)
    if name is None:
        kind = {"f": "f", "i": "s", "u": "u", "c": "c"}.get(dt.kind, dt.kind)
        name = f"{kind}{dt.itemsize * 8}" if dt.kind in "fiuc" else dt.name
    return f"{name}[{','.join(str(int(n)) for n in shape)}]"


@dataclasses.dataclass
class ProgramPlacement:
    """XLA's placement of the program's kernels' operands (``calls``, in the compiled
    program's order), or why it is not known (``reason``: every operand is then taken
    to be in HBM). ``checker``: who placed them (``libtpu 0.0.42.1 (jax 0.10.2)``)."""

    calls: tuple[CallPlacement, ...] = ()
    checker: str | None = None
    reason: str | None = None
    _taken: set[int] = dataclasses.field(default_factory=set)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def local_operands(self, kernel: Any) -> frozenset[tuple[str, str]]:
        """``("in", name)`` / ``("out", name)`` of the ``kernel``'s blocked inputs and
        outputs that XLA placed in VMEM. A launch takes the first custom call not yet
        taken whose input and output types are the kernel's (the call's operands end
        with the kernel's inputs: scalar-prefetch operands come first)."""
        ins = [hlo_type(i.array_shape, i.dtype) for i in kernel.inputs]
        outs = [hlo_type(o.array_shape, o.dtype) for o in kernel.outputs]
        with self._lock:
            for n, call in enumerate(self.calls):
                if n in self._taken or len(call.operands) < len(ins):
                    continue
                tail = call.operands[len(call.operands) - len(ins):]
                if [t for t, _ in tail] != ins or [t for t, _ in call.results] != outs:
                    continue
                self._taken.add(n)
                local = {("in", i.name) for i, (_, s) in zip(kernel.inputs, tail)
                         if s == VMEM_SPACE}
                local |= {("out", o.name) for o, (_, s) in zip(kernel.outputs, call.results)
                          if s == VMEM_SPACE}
                return frozenset(local)
        return frozenset()

    def describe(self) -> str:
        """One line for a prediction: whose placement, and which kernels it moved."""
        if self.reason is not None:
            return f"every operand in HBM ({self.reason})"
        moved = [c.name for c in self.calls
                 if any(s == VMEM_SPACE for _, s in (*c.operands, *c.results))]
        if not moved:
            return f"every operand in HBM (XLA's placement, {self.checker})"
        return (f"XLA's placement ({self.checker}): operands or results in VMEM for "
                f"{', '.join(moved)}")


def program_placement(jaxpr: Any, chip: str) -> ProgramPlacement:
    """XLA's placement of the kernels of ``jaxpr`` (a ``ClosedJaxpr`` traced under
    palladium's interpret mode) for ``chip``."""
    if not tpu_compiler.can_compile_for(chip):
        return ProgramPlacement(reason=f"assumed: no libtpu that compiles for TPU {chip} "
                                       f"({tpu_compiler.INSTALL_COMMAND})")
    checker = tpu_compiler.checker_name()
    try:
        calls = _compiled_placement(jaxpr, chip)
    except _Unknown as e:
        return ProgramPlacement(checker=checker, reason=f"not known: {e}")
    except Exception as e:  # noqa: BLE001 - a prediction never fails for want of it
        return ProgramPlacement(checker=checker, reason=f"not known: "
                                f"{describe_failure(e).splitlines()[0]}")
    return ProgramPlacement(calls=calls, checker=checker)


class _Unknown(Exception):
    pass


def _compiled_placement(jaxpr: Any, chip: str) -> tuple[CallPlacement, ...]:
    topo_name = tpu_compiler.topology_name(chip, 1)
    device = tpu_compiler.topology_device(topo_name)
    sharding = jax.sharding.SingleDeviceSharding(device)
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)
               for a in jaxpr.in_avals]
    try:
        on_tpu = jc.with_pallas_interpret(jaxpr, False)

        def program(*args: Any) -> Any:
            return jc.eval_jaxpr(on_tpu.jaxpr, on_tpu.consts, *args)

        with jax.default_device(device):
            lowered = jax.jit(program).trace(*structs).lower(lowering_platforms=("tpu",))
    except Exception as exc:  # noqa: BLE001 - e.g. a core_map the TPU lowering rejects
        raise _Unknown(f"the program does not lower for the TPU: "
                       f"{describe_failure(exc).splitlines()[0]}") from exc
    bytecode = jc.module_bytecode(lowered)
    key = tpu_compiler.module_key(bytecode, chip, topo_name, _FORMAT)
    with _LOCK:
        known = _MEMORY.get(key)
    if known is not None:
        return known
    found = PLACEMENTS.get(key)
    if found is not None:
        try:
            calls = tuple(CallPlacement(c["name"], tuple(map(tuple, c["operands"])),
                                        tuple(map(tuple, c["results"])))
                          for c in json.loads(found))
        except (ValueError, KeyError, TypeError):
            calls = None
        if calls is not None:
            with _LOCK:
                _MEMORY[key] = calls
            return calls
    outcome, message, _, placed = COMPILER_PROCESS.compile(
        bytecode, topo_name, 1, len(structs),
        len(jax.tree_util.tree_leaves(lowered.out_info)))
    if outcome != "accepted" or placed is None:
        raise _Unknown(f"the TPU compiler did not compile the program ({outcome}: "
                       f"{message.splitlines()[0] if message else ''})")
    calls = tuple(placed)
    PLACEMENTS.put(key, json.dumps([{"name": c.name, "operands": c.operands,
                                     "results": c.results} for c in calls]).encode())
    with _LOCK:
        _MEMORY[key] = calls
    return calls
