"""The memory map of one launch: operands, scratch, scoped allocations and peer buffers.

Every simulated buffer a launch allocates goes through :class:`MemoryMap`, which also
remembers the order each core (VMEM/SMEM) or device (HBM) allocated them in: a remote
DMA to core ``c`` targets "the buffer core ``c`` allocated at the same position".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import JAX_HBM_IN_RUN_SCOPED, KernelError
from palladium.interpret.eval.context import CoreId, Where
from palladium.interpret.eval.refs import MemRef, SemaphoreRef
from palladium.interpret.kernel.blocks import BlockSpecInfo, memory_space_of
from palladium.interpret.kernel.prepared_kernel import PreparedKernel
from palladium.interpret.params import InterpretParams
from palladium.shared_memory import (
    BufferRef,
    MemorySpace,
    SemaphoreKind,
    SemaphoreLeakError,
    Simulation,
    UninitializedOrigin,
    uninitialized_value,
)

__all__ = ["MemoryMap", "hbm_name"]


_HBM, _HOST = MemorySpace.HBM, MemorySpace.HOST
_HBM_VALUE, _HOST_VALUE = _HBM.value, _HOST.value


def _owner(space: Any, core: CoreId) -> Any:
    """Who owns a buffer of ``space`` allocated on ``core``: the core, or for HBM its
    device."""
    # Identity tests, not ``space.per_device``/``space.value`` (enum properties): a
    # remote DMA asks this once per DMA.
    if space is _HBM:
        return (_HBM_VALUE, core[0])
    return (_HOST_VALUE, core[0]) if space is _HOST else core


def _core_label(core: CoreId) -> str:
    return f"device {core[0]} core {core[1]}"


def _semaphore_kind(dtype: Any) -> SemaphoreKind:
    if isinstance(dtype, jc.DMASemaphoreDType):
        return SemaphoreKind.DMA
    if isinstance(dtype, jc.BarrierSemaphoreDType):
        return SemaphoreKind.BARRIER
    return SemaphoreKind.REGULAR


def _home(info: BlockSpecInfo) -> MemorySpace:
    """Where an operand's array lives: the host's memory for ``pl.HOST``, else HBM."""
    return MemorySpace.HOST if info.space == MemorySpace.HOST else MemorySpace.HBM


def hbm_name(info: BlockSpecInfo) -> str:
    """The name of an operand's HBM copy as errors show it."""
    return info.name if info.in_hbm else f"{info.name} (HBM)"


class MemoryMap:
    """The buffers of one launch (see the module docstring)."""

    def __init__(self, sim: Simulation, kernel: PreparedKernel, params: InterpretParams,
                 num_cores: int) -> None:
        self.sim = sim
        self.num_cores = num_cores
        self.kernel = kernel
        self.params = params
        # Buffers in allocation order, per owner (_owner: a core for VMEM/SMEM, a device
        # for HBM): a remote DMA targets "the buffer the other owner allocated at the
        # same position".
        self._allocated: dict[Any, list[BufferRef]] = {}
        self._position: dict[int, int] = {}
        self._shared_hbm: dict[tuple[int, int], BufferRef] = {}
        self._scoped_hbm_exits: dict[int, int] = {}  # buffer key -> cores that left its scope
        self._hbm_seq: dict[CoreId, int] = {}
        # Buffers a remote DMA wrote before their owner allocated them, by (owner,
        # position): the owner's allocation at that position adopts the buffer.
        self._early: dict[tuple[Any, int], BufferRef] = {}

    def fill_value(self, dtype: Any) -> Any:
        """What uninitialised memory of ``dtype`` holds in this launch."""
        return uninitialized_value(dtype, self.params.uninitialized_memory)

    def allocate(self, core: CoreId, space: Any, name: str, shape: Any, dtype: Any,
                 value: Any = None, where: Where | None = None,
                 private: bool = False, read_only: bool = False,
                 storage: np.ndarray | None = None) -> BufferRef:
        """A new buffer of ``core`` (HBM: of its device), remembered in allocation order;
        ``private``: no DMA of the kernel reaches it (``kernel.dma_reach``), so only its
        core accesses it (VMEM and SMEM only: HBM is the device's); ``read_only``: nothing
        writes it during the launch (an input nothing writes); ``storage``: the array to
        hold a new buffer's data (``Simulation.allocate``)."""
        owner = _owner(space, core)
        lst = self._allocated.setdefault(owner, [])
        early = self._early.pop((owner, len(lst)), None) if self._early else None
        if early is not None and value is None:
            buf = self._adopt(early, core, name, tuple(shape), np.dtype(dtype), where)
        else:
            buf = self.sim.allocate(
                space, core[0], core[1], name=name,
                shape=None if value is not None else tuple(shape),
                dtype=None if value is not None else np.dtype(dtype),
                value=value,
                private=private and isinstance(space, MemorySpace) and not space.per_device,
                read_only=read_only, storage=storage,
            )
        self._position[buf.key] = len(lst)
        lst.append(buf)
        return buf

    def _adopt(self, early: BufferRef, core: CoreId, name: str, shape: tuple[int, ...],
               dtype: np.dtype, where: Where | None) -> BufferRef:
        """``core`` allocates the buffer a remote DMA already wrote into. Scoped VMEM/SMEM
        has a static address on a TPU: the bytes a peer's DMA put there before this core
        entered the scope are what the scope's buffer holds."""
        if tuple(early.shape) != shape or np.dtype(early.dtype) != dtype:
            raise KernelError(
                f"a remote DMA wrote '{early.name}' ({np.dtype(early.dtype)}"
                f"{list(early.shape)}) on {_core_label(core)} before that core allocated "
                f"it, but the core's allocation at that position is '{name}' ({dtype}"
                f"{list(shape)}): the cores allocate different buffers in a different "
                f"order. Allocate the same scratch and run_scoped buffers in the same order "
                f"on every core, or synchronise (a semaphore) before the remote DMA"
                + ("" if where is None else f" ({where()})")
            )
        return early

    def peer_buffer(self, buf: BufferRef, target: CoreId) -> BufferRef:
        """The buffer on ``target`` that corresponds to ``buf`` (same allocation position)."""
        space = buf.space
        if (space is _HBM or space is _HOST) and target[0] == buf.device:
            return buf
        owner = _owner(space, target)
        peers = self._allocated.get(owner, [])
        pos = self._position[buf.key]
        if pos < len(peers):
            return peers[pos]
        # The target has not allocated this buffer yet (it has not entered the
        # run_scoped, say): the DMA writes where the buffer will be; the target's
        # allocation at this position adopts what was written (see _adopt).
        early = self._early.get((owner, pos))
        if early is None:
            early = self.sim.allocate(buf.space, target[0], target[1], name=buf.name,
                                      shape=tuple(buf.shape), dtype=np.dtype(buf.dtype))
            self._early[(owner, pos)] = early
        return early

    def allocate_scoped(self, core: CoreId, aval: Any, name: str, where: Where,
                        var: Any = None) -> MemRef | SemaphoreRef:
        """The buffer or semaphores of one ``run_scoped`` allocation on ``core`` (``var``:
        the jaxpr variable it binds, to tell whether a DMA reaches it)."""
        space = memory_space_of(getattr(aval, "memory_space", None))
        if space == "semaphore":
            kind = _semaphore_kind(aval.dtype)
            ids = self.sim.allocate_semaphores(core[0], core[1], kind=kind, name=name,
                                               shape=tuple(aval.shape))
            return SemaphoreRef(np.asarray(ids), kind, name)
        if space == MemorySpace.HBM:
            if not self.params.allow_hbm_allocation_in_run_scoped:
                raise KernelError(
                    f"run_scoped allocates '{name}' in HBM, which a TPU kernel cannot do; pass "
                    f"InterpretParams(allow_hbm_allocation_in_run_scoped=True) to simulate it "
                    f"anyway ({where()}). {JAX_HBM_IN_RUN_SCOPED}"
                )
            seq = self._hbm_seq.get(core, 0)
            self._hbm_seq[core] = seq + 1
            key = (core[0], seq)
            # HBM belongs to the device: the k-th HBM allocation of each of its cores is
            # one buffer, allocated by the first core to enter the scope and freed when
            # every core has left it (a core that leaves early must not free it under
            # the others).
            buf = self._shared_hbm.get(key)
            if buf is None:
                buf = self.allocate(core, space, name, aval.shape, aval.dtype, where=where)
                self._shared_hbm[key] = buf
                self._scoped_hbm_exits[buf.key] = 0
            return MemRef(buf)
        return MemRef(self.allocate(core, space, name, aval.shape, aval.dtype, where=where,
                                    private=var is not None and self.kernel.is_private(var)))

    def free_scoped(self, core: CoreId, alloc: MemRef | SemaphoreRef, where: Where) -> None:
        """The end of a ``run_scoped``: free its buffer or leak-check its semaphores."""
        if isinstance(alloc, SemaphoreRef):
            try:
                self.sim.free_semaphores(alloc.ids, device=core[0], core=core[1])
            except SemaphoreLeakError as e:
                raise SemaphoreLeakError(f"{where()}: {e}") from e
        elif alloc.buffer.key in self._scoped_hbm_exits:
            exits = self._scoped_hbm_exits[alloc.buffer.key] + 1
            self._scoped_hbm_exits[alloc.buffer.key] = exits
            if exits == self.num_cores:
                self.sim.free(alloc.buffer)
        else:
            self.sim.free(alloc.buffer)

    def hbm_operand(self, device: int, info: BlockSpecInfo, x: np.ndarray,
                    read_only: bool = False) -> BufferRef:
        """The HBM copy of an input (padded by its ``pl.Element`` padding); ``read_only``:
        nothing writes it during the launch (``PreparedKernel.read_only_inputs``)."""
        padded = info.padded_shape
        shape = tuple(x.shape)
        if padded != shape:
            full = np.full(padded, self.fill_value(x.dtype), dtype=x.dtype)
            full[info.array_region(shape)] = x
            x = full
        ref = self.allocate((device, 0), _home(info), hbm_name(info), None, None, value=x,
                            read_only=read_only)
        if padded != shape and self.params.uninitialized_reads == "on_use":
            # the padding of its last blocks holds no data (on a TPU, whatever VMEM held)
            initialized = np.zeros(padded, bool)
            initialized[info.array_region(shape)] = True
            sim = self.sim
            sim.set_initialized(ref, sim.plan(ref, None), initialized, taint=UninitializedOrigin(
                f"the padding of a partial edge block of input '{info.name}' (past the end "
                f"of its {list(shape)} array)", None, "padding"))
        return ref

    def hbm_output(self, device: int, info: BlockSpecInfo,
                   storage: np.ndarray | None = None) -> BufferRef:
        """A fresh (uninitialised) HBM buffer for an output (``storage``: the array to
        hold it, from ``output_storage``)."""
        return self.allocate((device, 0), _home(info), hbm_name(info), info.padded_shape,
                             info.dtype, storage=storage)

    def core_operands(self, core: CoreId, scalars: list[Any], hbm_inputs: list[BufferRef],
                      hbm_outputs: list[BufferRef]) -> list[MemRef | SemaphoreRef]:
        """The kernel's operands on ``core``: scalar prefetch in SMEM, a block buffer per
        blocked operand (HBM operands as they are), then the scratch."""
        k = self.kernel
        private = k.private_positions
        operands: list[MemRef | SemaphoreRef] = []
        for name, value in zip(k.scalar_names, scalars):
            operands.append(MemRef(self.allocate(core, MemorySpace.SMEM, name, None, None,
                                                 value=np.asarray(value),
                                                 private=len(operands) in private)))
        for info, hbm in [*zip(k.inputs, hbm_inputs), *zip(k.outputs, hbm_outputs)]:
            if info.in_hbm:
                operands.append(MemRef(hbm))
            else:
                operands.append(MemRef(self.allocate(core, info.space, info.name,
                                                     info.block_shape, info.dtype,
                                                     private=len(operands) in private)))
        for i, s in enumerate(k.scratch):
            space = k.scratch_space(i)
            aval = s.aval
            if space == "semaphore":
                kind = _semaphore_kind(aval.dtype)
                ids = self.sim.allocate_semaphores(core[0], core[1], kind=kind, name=s.name,
                                                   shape=tuple(aval.shape))
                operands.append(SemaphoreRef(np.asarray(ids), kind, s.name))
            elif space == MemorySpace.HBM:
                key = (core[0], -1 - i)
                if key not in self._shared_hbm:
                    self._shared_hbm[key] = self.allocate(core, space, s.name, aval.shape,
                                                          aval.dtype)
                operands.append(MemRef(self._shared_hbm[key]))
            else:
                operands.append(MemRef(self.allocate(core, space, s.name, aval.shape,
                                                     aval.dtype,
                                                     private=len(operands) in private)))
        return operands
