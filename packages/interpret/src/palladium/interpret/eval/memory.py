"""Reads, writes and swaps of simulated buffers through a chain of ref transforms."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import (
    KernelError,
    UnsupportedFeatureError,
    jax_hbm_reference_phrase,
)
from palladium.interpret.eval.context import Equation, KernelContext
from palladium.interpret.eval.refs import Access, Bitcast, MemRef, resolve, tpu_bitcast
from palladium.shared_memory import AccessPlan, MemorySpace

# The primitives that read or write a ref's contents, and the name jax's interpreter
# gives each in its message.
REF_ACCESSES = {
    jc.get_p: ("read", "get_p"),
    jc.swap_p: ("write", "swap_p"),
    jc.addupdate_p: ("accumulate into", "addupdate_p"),
    jc.load_p: ("read", "load_p"),
    jc.masked_swap_p: ("write", "swap_p"),
}


def jax_access_name(primitive: Any) -> str:
    """The name jax's interpreter gives a ref access primitive in its messages."""
    access = REF_ACCESSES.get(primitive)
    return access[1] if access is not None else f"{primitive}_p"


def checked_ref(ev: KernelContext, ref: Any, eqn: Equation, op: str) -> MemRef:
    """``ref`` as a ``MemRef`` a kernel may read or write directly (``op``: what it
    does); raises ``KernelError`` for another value or an HBM or host-memory ref."""
    if not isinstance(ref, MemRef):
        raise KernelError(f"{op} of a non-memory ref {ref!r} ({ev.site(eqn)})")
    if ref.buffer.space.per_device:
        home = "HBM (memory space ANY/HBM)" if ref.buffer.space == MemorySpace.HBM else (
            "the host's memory (memory space pl.HOST)")
        raise KernelError(
            f"{op} of '{ref.name}', which lives in {home}: a TPU kernel "
            f"cannot read or write it directly; copy it with pltpu.sync_copy or "
            f"pltpu.async_copy ({ev.site(eqn)}). "
            f"{jax_hbm_reference_phrase(jax_access_name(eqn.primitive))}"
        )
    return ref


def access_of(ref: MemRef, transforms: Any) -> Access:
    buf = ref.buffer
    return resolve(tuple(buf.shape), np.dtype(buf.dtype), transforms, buf.name)


def read(ev: KernelContext, ref: Any, transforms: Any, eqn: Equation, op: str = "read",
         check_written: bool = True) -> np.ndarray:
    ref = checked_ref(ev, ref, eqn, op)
    return read_access(ev, ref, access_of(ref, transforms), eqn, check_written=check_written)


def read_masked(ev: KernelContext, ref: Any, transforms: Any, mask: Any, eqn: Equation) -> np.ndarray:
    """Read through ``transforms`` where ``mask`` (of the view's shape) is True.

    Only the True elements are read: a False one may lie out of bounds (it reads the
    buffer's fill) and the race detector does not see it. Through a bitcast the whole
    region counts as read.
    """
    ref = checked_ref(ev, ref, eqn, "load")
    acc = access_of(ref, transforms)
    if any(isinstance(op, Bitcast) for op in acc.post):
        return read_access(ev, ref, acc, eqn)
    if acc.post:
        region_mask = acc.region_mask(mask)
    else:
        region_mask = np.broadcast_to(np.asarray(mask, dtype=bool), acc.region_shape)
    data = ev.sim.read(
        ref.buffer, acc.region, mask=region_mask, core=ev.core, site=ev.site(eqn)
    )
    return acc.apply(np.asarray(data)) if acc.post else data


def read_access(ev: KernelContext, ref: MemRef, acc: Access, eqn: Equation,
                plan: AccessPlan | None = None, *, check_written: bool = True) -> np.ndarray:
    """Read a resolved access of a checked ref (through the simulator's ``plan`` of its
    region when the caller keeps one). ``check_written=False``: the old value a store
    replaces, not a read of the kernel's (``uninitialized_reads`` does not check it)."""
    region = acc.region if plan is None else plan
    data = ev.sim.read(ref.buffer, region, core=ev.core, site=ev.site(eqn),
                       check_written=check_written)
    return acc.apply(np.asarray(data)) if acc.post else data


def write(
    ev: KernelContext, ref: Any, transforms: Any, value: Any, eqn: Equation, mask: Any = None, op: str = "write"
) -> None:
    ref = checked_ref(ev, ref, eqn, op)
    acc = access_of(ref, transforms)
    sim = ev.sim
    site = ev.site(eqn)
    if not acc.post:
        value = np.asarray(value, dtype=ref.buffer.dtype)
        value = np.broadcast_to(value, acc.region_shape)
        if mask is not None:
            mask = np.broadcast_to(np.asarray(mask, dtype=bool), acc.region_shape)
        sim.write(ref.buffer, acc.region, value, mask=mask, core=ev.core, site=site)
        return
    if any(isinstance(op_, Bitcast) for op_ in acc.post):
        _write_through_bitcast(ev, ref, acc, value, mask, eqn)
        return
    # Reshape / transpose / index after the region: scatter by element position, and
    # tell the simulator exactly which elements of the region were written.
    positions = acc.positions()
    value = np.broadcast_to(np.asarray(value, dtype=ref.buffer.dtype), positions.shape)
    full = np.zeros(math.prod(acc.region_shape), dtype=ref.buffer.dtype)
    if mask is not None:
        m = np.broadcast_to(np.asarray(mask, dtype=bool), positions.shape)
        full[positions[m]] = value[m]
    else:
        full[positions.ravel()] = value.ravel()
    full = full.reshape(acc.region_shape)
    touched = acc.region_mask(mask)
    sim.write(
        ref.buffer,
        acc.region,
        full,
        mask=None if touched.all() else touched,
        core=ev.core,
        site=site,
    )


def _write_through_bitcast(ev: KernelContext, ref: MemRef, acc: Any, value: Any, mask: Any, eqn: Equation) -> None:
    post = acc.post
    if not isinstance(post[0], Bitcast) or any(isinstance(p, Bitcast) for p in post[1:]):
        raise UnsupportedFeatureError(
            f"write to '{ref.name}' through a reshape followed by a bitcast, or through two "
            f"bitcasts, is not supported ({ev.site(eqn)})"
        )
    sim = ev.sim
    site = ev.site(eqn)
    old = np.asarray(sim.read(ref.buffer, acc.region, core=ev.core, site=site,
                              check_written=False))  # the words the store completes
    view = tpu_bitcast(old, post[0].dtype).copy()
    rest = Access(acc.region, view.shape, post[1:])
    positions = rest.positions()
    value = np.broadcast_to(np.asarray(value, dtype=view.dtype), positions.shape)
    flat = view.reshape(-1)
    if mask is not None:
        m = np.broadcast_to(np.asarray(mask, dtype=bool), positions.shape)
        flat[positions[m]] = value[m]
    else:
        flat[positions.ravel()] = value.ravel()
    new = tpu_bitcast(flat.reshape(view.shape), old.dtype)
    sim.write(ref.buffer, acc.region, new, core=ev.core, site=site)


def swap(ev: KernelContext, ref: Any, transforms: Any, value: Any, eqn: Equation, mask: Any = None) -> np.ndarray:
    checked = checked_ref(ev, ref, eqn, "swap")
    acc = access_of(checked, transforms)
    if not acc.post:
        value = np.broadcast_to(np.asarray(value, dtype=checked.buffer.dtype), acc.region_shape)
        if mask is not None:
            mask = np.broadcast_to(np.asarray(mask, dtype=bool), acc.region_shape)
        return np.asarray(
            ev.sim.swap(
                checked.buffer, acc.region, value, mask=mask, core=ev.core, site=ev.site(eqn)
            )
        )
    old = read(ev, ref, transforms, eqn, "swap", check_written=False)
    write(ev, ref, transforms, value, eqn, mask=mask, op="swap")
    return old
