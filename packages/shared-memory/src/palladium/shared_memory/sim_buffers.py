"""The buffers of a simulated launch: allocation, reads, writes, swaps, reference counts."""

from __future__ import annotations

from typing import Any

import numpy as np

from palladium.shared_memory.buffers import Buffer, BufferRef, MemorySpace, stored_mask
from palladium.shared_memory.errors import ConfigError
from palladium.shared_memory.regions import AccessPlan
from palladium.shared_memory.sim_state import CoreId, SimulationState
from palladium.shared_memory.tpu_facts import padded_shape, uninitialized_value

_ELLIPSIS = (Ellipsis,)


class BufferOps(SimulationState):
    """``Simulation``'s buffer operations (see ``API.md``)."""

    def allocate(
        self,
        space: MemorySpace,
        device: int,
        core: int,
        *,
        name: str,
        shape: Any = None,
        dtype: Any = None,
        value: np.ndarray | None = None,
        fill: str | None = None,
    ) -> BufferRef:
        """Allocate a buffer holding a copy of ``value``, else uninitialised memory.

        HBM belongs to the device (``core`` is ignored); VMEM and SMEM to one core.
        """
        space = MemorySpace(space)
        core = 0 if space is MemorySpace.HBM else int(core)
        self._check_core((device, core))
        if value is not None:
            data = np.array(value, dtype=dtype, copy=True)
            if shape is not None and tuple(shape) != data.shape:
                raise ConfigError(f"buffer '{name}': value has shape {data.shape}, not {tuple(shape)}")
        else:
            if shape is None or dtype is None:
                raise ConfigError(f"buffer '{name}': give a value, or a shape and a dtype")
            dtype = np.dtype(dtype)
            data = np.full(tuple(int(d) for d in shape),
                           uninitialized_value(dtype, fill or self.uninitialized), dtype)
        bound = data.shape
        if self.bounds == "padded" and space is not MemorySpace.SMEM:
            bound = padded_shape(data.shape, data.dtype, self.tiling,
                                 generation=self.tpu_generation)
        key = next(self._next_key)
        ref = BufferRef(key, space, int(device), core, name, data.shape, data.dtype)
        self._buffers[key] = Buffer(
            ref, data, bound, uninitialized_value(data.dtype, fill or self.uninitialized),
            self.out_of_bounds_hint,
        )
        if self._det is not None:
            self._det.register_buffer(key, data.shape, f"{name} ({ref.where})")
        if self._obs is not None:
            self._obs.allocate(ref, data.nbytes, (int(device), core))
        return ref

    def incref(self, buf: BufferRef) -> None:
        """One more owner of ``buf``: it survives one more ``free``."""
        self._buffer(buf).refcount += 1

    def free(self, buf: BufferRef) -> None:
        """Drop one reference; the last one deallocates the buffer."""
        b = self._buffer(buf)
        b.refcount -= 1
        if b.refcount == 0:
            del self._buffers[buf.key]
            if self._det is not None:
                self._det.free_buffer(buf.key)
            if self._obs is not None:
                self._obs.free(buf, b.data.nbytes, (buf.device, buf.core))

    def is_allocated(self, buf: BufferRef) -> bool:
        """Whether ``buf`` has not been freed yet."""
        return buf.key in self._buffers

    def plan(self, buf: BufferRef, region: Any) -> AccessPlan:
        """``region`` of ``buf`` resolved once: pass the plan instead of the region to
        ``read``, ``write``, ``swap`` or ``dma_start`` (of ``buf`` or any buffer of the
        same shape and bounds) and neither the simulator nor the race detector parses
        the region again. A plan is immutable; keep it as long as the region is used."""
        return self._buffer(buf).plan(region)

    def read(self, buf: BufferRef, region: Any, *, mask: Any = None, core: CoreId, site: object = None) -> np.ndarray:
        """A copy of ``buf[region]`` as read by ``core``.

        With ``mask`` (broadcastable to the region's shape) only the True elements are
        read: a False element may lie out of bounds (it reads the fill), and the race
        detector sees only the True ones.
        """
        b = self._buffers.get(buf.key) or self._buffer(buf)
        plan = b.plan(region)
        if plan.full:  # the common case, inlined: the interpreter reads on every load
            out = b.data[plan.index + _ELLIPSIS].copy()
        else:
            out = b.read(plan, self._oob_raise, "read", core, site, mask)
        if self._det is not None and plan.index is not None:
            race = plan.prepared or plan.race_access()
            if mask is None:
                self._det.read(self._actor(core), buf.key, race, site=site)
            else:
                sub = stored_mask(plan, mask)
                if sub.any():
                    shape = b.data[plan.index + _ELLIPSIS].shape
                    self._det.read(self._actor(core), buf.key, race, site=site,
                                   mask=np.broadcast_to(sub, shape))
        return out

    def write(self, buf: BufferRef, region: Any, value: Any, *, mask: Any = None, core: CoreId, site: object = None) -> None:
        """Store ``value`` into ``buf[region]`` (only where ``mask`` is True)."""
        b = self._buffers.get(buf.key) or self._buffer(buf)
        plan = b.plan(region)
        mask = b.write(plan, value, mask, "write", core, site)
        if self._det is not None and plan.index is not None:
            self._race_write(core, buf.key, plan, mask, site)

    def swap(self, buf: BufferRef, region: Any, value: Any, *, mask: Any = None, core: CoreId, site: object = None) -> np.ndarray:
        """Store ``value`` (where ``mask``) into ``buf[region]``; return the old contents."""
        b = self._buffers.get(buf.key) or self._buffer(buf)
        plan = b.plan(region)
        old, mask = b.swap(plan, value, mask, core, site)
        if self._det is not None and plan.index is not None:
            self._race_write(core, buf.key, plan, mask, site)
        return old

    def _race_write(self, core: Any, key: Any, plan: AccessPlan, mask: Any, site: object) -> None:
        assert self._det is not None
        race = plan.prepared or plan.race_access()
        if mask is None:
            self._det.write(self._actor(core), key, race, site=site)
        elif mask.any():
            shape = self._buffers[key].data[plan.index + (Ellipsis,)].shape
            self._det.write(self._actor(core), key, race, site=site,
                            mask=np.broadcast_to(mask, shape))

    def value(self, buf: BufferRef) -> np.ndarray:
        """The whole logical contents of ``buf`` (a copy; no race check)."""
        return self._buffer(buf).data.copy()
