"""Rules for DMAs: ``dma_start`` queues a copy in the simulator, ``dma_wait`` waits for it."""

from __future__ import annotations

from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import KernelError
from palladium.interpret.eval.dma_view import dma_view, view_nbytes
from palladium.interpret.eval.memory import access_of
from palladium.interpret.eval.refs import MemRef, SemaphoreRef, split_transformed
from palladium.interpret.eval.registry import rule


def _mem(ev: Any, value: Any, eqn: Any, role: str) -> tuple[MemRef, Any]:
    ref, transforms = split_transformed(value)
    if not isinstance(ref, MemRef):
        raise KernelError(f"DMA {role} is not a memory ref ({ev.site(eqn)})")
    return ref, access_of(ref, transforms)


def _side(ref: MemRef, acc: Any) -> tuple[Any, np.dtype, str]:
    return acc, np.dtype(ref.buffer.dtype), ref.name


def sem_id(ev: Any, value: Any, eqn: Any, transforms: Any = ()) -> int:
    ref, own = split_transformed(value)
    transforms = (*own, *transforms)
    if not isinstance(ref, SemaphoreRef):
        raise KernelError(f"expected a semaphore, got {ref!r} ({ev.site(eqn)})")
    return ref.index(transforms).scalar_id()


@rule(jc.dma_start_p)
def _dma_start(ev: Any, eqn: Any, invals: list[Any]) -> list[Any]:
    src, dst, dst_sem, src_sem, device_id = jc.dma_operands(eqn.params["tree"], invals)
    src_ref, src_acc = _mem(ev, src, eqn, "source")
    dst_ref, dst_acc = _mem(ev, dst, eqn, "destination")
    view = dma_view(_side(src_ref, src_acc), _side(dst_ref, dst_acc), ev.site(eqn))
    target = ev.launch.remote_core(ev, device_id, None, eqn.params["device_id_type"], eqn)
    dst_buffer = dst_ref.buffer
    if target is not None and target != ev.core:
        dst_buffer = ev.launch.peer_buffer(dst_buffer, target)
    ev.launch.sim.dma_start(
        src_ref.buffer,
        src_acc.region,
        dst_buffer,
        dst_acc.region,
        core=ev.core,
        dst_sem=sem_id(ev, dst_sem, eqn),
        src_sem=None if src_sem is None else sem_id(ev, src_sem, eqn),
        dst_core=target,
        site=ev.site(eqn),
        name=f"{src_ref.name}->{dst_ref.name}",
        view=view,
        add=bool(eqn.params.get("add", False)),
    )
    return []


@rule(jc.dma_wait_p)
def _dma_wait(ev: Any, eqn: Any, invals: list[Any]) -> list[Any]:
    src, _dst, sem, _src_sem, _device_id = jc.dma_operands(eqn.params["tree"], invals)
    src_ref, src_acc = _mem(ev, src, eqn, "source")
    nbytes = view_nbytes(src_acc, np.dtype(src_ref.buffer.dtype))
    ev.launch.sim.dma_wait(sem_id(ev, sem, eqn), nbytes, core=ev.core, site=ev.site(eqn))
    return []
