"""Rules for semaphore signal / wait / read and the barrier semaphore."""

from __future__ import annotations

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import KernelError, UnsupportedFeatureError
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.refs import SemaphoreRef
from palladium.interpret.eval.registry import rule
from palladium.interpret.eval.rules_dma import sem_id
from palladium.shared_memory import SemaphoreKind


@rule(jc.semaphore_signal_p)
def _signal(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    sem, transforms, inc, device_id, core_index = eqn.params["args_tree"].unflatten(invals)
    target = ev.remote_core(device_id, core_index, eqn.params["device_id_type"], eqn)
    sid = sem_id(ev, sem, eqn, transforms)
    ev.sim.semaphore_signal(
        sid, int(np.asarray(inc)), core=ev.core, target=target, site=ev.site(eqn)
    )
    return []


@rule(jc.semaphore_wait_p)
def _wait(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    sem, transforms, value, decrement = eqn.params["args_tree"].unflatten(invals)
    if not decrement:
        raise UnsupportedFeatureError(f"semaphore_wait with decrement=False ({ev.site(eqn)})")
    sid = sem_id(ev, sem, eqn, transforms)
    ev.sim.semaphore_wait(sid, int(np.asarray(value)), core=ev.core, site=ev.site(eqn))
    return []


@rule(jc.semaphore_read_p)
def _read(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    sem, transforms = eqn.params["args_tree"].unflatten(invals)
    sid = sem_id(ev, sem, eqn, transforms)
    return [np.int32(ev.sim.semaphore_read(sid, core=ev.core, site=ev.site(eqn)))]


@rule(jc.get_barrier_semaphore_p)
def _barrier_semaphore(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    if ev.collective_id is None:
        # Mosaic allocates the barrier semaphore per collective_id, and both it and jax's
        # TPU interpreter reject a kernel that asks for one without it.
        raise KernelError(
            f"pltpu.get_barrier_semaphore() in a kernel without a collective_id: pass "
            f"compiler_params=pltpu.CompilerParams(collective_id=<int>) to the pallas_call "
            f"(a TPU has no barrier semaphore without one) ({ev.site(eqn)})"
        )
    ids = np.asarray(ev.sim.barrier_semaphore(ev.core[0]), dtype=np.int64)
    return [SemaphoreRef(ids, SemaphoreKind.BARRIER, "barrier semaphore")]
