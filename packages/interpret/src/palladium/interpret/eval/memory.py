"""Reads, writes and swaps of simulated buffers through a chain of ref transforms."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from palladium.interpret.errors import (
    KernelError,
    UnsupportedFeatureError,
    jax_hbm_reference_phrase,
)
from palladium.interpret.eval.context import Equation, KernelContext
from palladium.interpret.eval.primitive_groups import jax_access_name
from palladium.interpret.eval.refs import Access, Bitcast, MemRef, resolve, tpu_bitcast
from palladium.interpret.eval.value_shadows import (
    read_origin,
    region_shadow,
    stored_origin,
    view_shadow,
)
from palladium.shared_memory import AccessPlan, MemorySpace


def checked(ev: KernelContext, ref: Any, eqn: Equation, op: str) -> MemRef:
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


def read_access(ev: KernelContext, ref: MemRef, acc: Access, eqn: Equation,
                plan: AccessPlan, *, check_written: bool = True) -> np.ndarray:
    """Read a resolved access of a checked ref through the simulator's ``plan`` of its
    region. ``check_written=False``: the old value a store replaces, not a read of the
    kernel's (``uninitialized_reads`` does not check it)."""
    data = ev.sim.read(ref.buffer, plan, core=ev.core, site=ev.site(eqn),
                       check_written=check_written)
    if ev.tracks_values:
        _note_read(ev, ref, acc, plan, eqn, None)
    return acc.apply(np.asarray(data)) if acc.post else data


def _note_read(ev: KernelContext, ref: MemRef, acc: Access, plan: AccessPlan, eqn: Equation,
               region_mask: Any) -> None:
    """``uninitialized_reads="on_use"``: note the shadow of what a read returns (None:
    every element it reads holds initialised data)."""
    sim = ev.sim
    missing = sim.uninitialized_elements(ref.buffer, plan)
    if missing is not None and region_mask is not None:
        missing = missing & region_mask
        if not missing.any():
            missing = None
    if missing is None:
        ev.read_shadow = None
        return
    found = sim.unwritten(ref.buffer, plan)
    region = found[0] if found is not None else str(list(acc.region_shape))
    what = f"{ref.buffer.label} region {region}"
    origin = read_origin(what, ev.site(eqn), sim.taint(ref.buffer))
    ev.read_shadow = (view_shadow(acc, missing), origin)


def read_masked(ev: KernelContext, ref: MemRef, acc: Access, plan: AccessPlan, mask: Any,
                eqn: Equation) -> np.ndarray:
    """Read a resolved access where ``mask`` (of the view's shape) is True.

    Only the True elements are read: a False one may lie out of bounds (it reads the
    buffer's fill) and the race detector does not see it. Through a bitcast the whole
    region counts as read.
    """
    if any(isinstance(op, Bitcast) for op in acc.post):
        return read_access(ev, ref, acc, eqn, plan)
    if acc.post:
        region_mask = acc.region_mask(mask)
    else:
        region_mask = np.broadcast_to(np.asarray(mask, dtype=bool), acc.region_shape)
    data = ev.sim.read(ref.buffer, plan, mask=region_mask, core=ev.core, site=ev.site(eqn))
    if ev.tracks_values:
        _note_read(ev, ref, acc, plan, eqn, region_mask)
    return acc.apply(np.asarray(data)) if acc.post else data


def _stored(value: Any, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` as the buffer stores it: its dtype, broadcast to the region's shape (a
    store's value mostly has that shape already: no broadcast view is made then)."""
    value = np.asarray(value, dtype=dtype)
    return value if value.shape == shape else np.broadcast_to(value, shape)


def write(ev: KernelContext, ref: MemRef, acc: Access, plan: AccessPlan, value: Any,
          eqn: Equation, mask: Any = None) -> None:
    """Store ``value`` (of the view's shape; where ``mask``) through a resolved access of
    a checked ref."""
    sim = ev.sim
    site = ev.site(eqn)
    if not acc.post:
        value = _stored(value, ref.buffer.dtype, acc.region_shape)
        if mask is not None:
            mask = np.broadcast_to(np.asarray(mask, dtype=bool), acc.region_shape)
        sim.write(ref.buffer, plan, value, mask=mask, core=ev.core, site=site)
        if ev.store_shadow is not None:
            _note_store(ev, ref, acc, plan, eqn, mask)
        return
    if any(isinstance(op_, Bitcast) for op_ in acc.post):
        _write_through_bitcast(ev, ref, acc, plan, value, mask, eqn)
        if ev.store_shadow is not None:
            _note_store(ev, ref, acc, plan, eqn, None if mask is None else acc.region_mask(mask))
        return
    # Reshape / transpose / index after the region: scatter by element position, and
    # tell the simulator exactly which elements of the region were written.
    full = np.zeros(math.prod(acc.region_shape), dtype=ref.buffer.dtype)
    _scatter(full, acc.positions(), value, mask)
    full = full.reshape(acc.region_shape)
    touched = acc.region_mask(mask)
    sim.write(ref.buffer, plan, full, mask=None if touched.all() else touched,
              core=ev.core, site=site)
    if ev.store_shadow is not None:
        _note_store(ev, ref, acc, plan, eqn, None if touched.all() else touched)


def _scatter(flat: np.ndarray, positions: np.ndarray, value: Any, mask: Any) -> None:
    """Store ``value`` (where ``mask``) at the flat ``positions`` of ``flat``."""
    value = np.broadcast_to(np.asarray(value, dtype=flat.dtype), positions.shape)
    if mask is not None:
        m = np.broadcast_to(np.asarray(mask, dtype=bool), positions.shape)
        flat[positions[m]] = value[m]
    else:
        flat[positions.ravel()] = value.ravel()


def _note_store(ev: KernelContext, ref: MemRef, acc: Access, plan: AccessPlan,
                eqn: Equation, region_mask: Any) -> None:
    """``uninitialized_reads="on_use"``: a store wrote data derived from uninitialised
    memory (``ev.store_shadow``; an accumulation, also the old contents' shadow the
    read before it noted): those elements hold no initialised data now."""
    shadow, origin, combine = ev.store_shadow
    if combine and ev.read_shadow is not None:
        old, old_origin = ev.read_shadow
        shadow = old if shadow is None else shadow | old
        origin = origin or old_origin
    if shadow is None:
        return
    region = region_shadow(acc, shadow, acc.region_shape)
    ev.sim.set_initialized(ref.buffer, plan, ~region, region_mask, taint=stored_origin(
        ref.buffer.label, ev.site(eqn), origin))


def _write_through_bitcast(ev: KernelContext, ref: MemRef, acc: Access, plan: AccessPlan,
                           value: Any, mask: Any, eqn: Equation) -> None:
    post = acc.post
    if not isinstance(post[0], Bitcast) or any(isinstance(p, Bitcast) for p in post[1:]):
        raise UnsupportedFeatureError(
            f"write to '{ref.name}' through a reshape followed by a bitcast, or through two "
            f"bitcasts, is not supported ({ev.site(eqn)})"
        )
    sim = ev.sim
    site = ev.site(eqn)
    old = np.asarray(sim.read(ref.buffer, plan, core=ev.core, site=site,
                              check_written=False))  # the words the store completes
    view = tpu_bitcast(old, post[0].dtype).copy()
    flat = view.reshape(-1)
    _scatter(flat, Access(acc.region, view.shape, post[1:]).positions(), value, mask)
    new = tpu_bitcast(flat.reshape(view.shape), old.dtype)
    sim.write(ref.buffer, plan, new, core=ev.core, site=site)


def swap(ev: KernelContext, ref: MemRef, acc: Access, plan: AccessPlan, value: Any,
         eqn: Equation, mask: Any = None, old_used: bool = True) -> Any:
    """Store ``value`` (where ``mask``) through a resolved access of a checked ref and
    return the old contents of the view. ``old_used=False`` (no later equation reads
    them; most stores, ``ref[...] = x``): a store of the whole region without a mask is
    a plain write -- the same race-detector event and the same checks for a region of
    stored data only (``plan.full``) -- with nothing copied out, and None returned."""
    if not acc.post:
        buf = ref.buffer
        value = _stored(value, buf.dtype, acc.region_shape)
        sim = ev.sim
        if mask is None:
            if plan.full and not old_used:
                sim.write(buf, plan, value, core=ev.core, site=ev.site(eqn))
                if ev.store_shadow is not None:
                    _note_store(ev, ref, acc, plan, eqn, None)
                return None
        else:
            mask = np.broadcast_to(np.asarray(mask, dtype=bool), acc.region_shape)
        if ev.tracks_values and old_used:
            _note_read(ev, ref, acc, plan, eqn, None)  # the old contents returned
        old = np.asarray(sim.swap(buf, plan, value, mask=mask, core=ev.core,
                                  site=ev.site(eqn)))
        if ev.store_shadow is not None:
            _note_store(ev, ref, acc, plan, eqn, mask)
        return old
    old = read_access(ev, ref, acc, eqn, plan, check_written=False)
    write(ev, ref, acc, plan, value, eqn, mask=mask)
    return old
