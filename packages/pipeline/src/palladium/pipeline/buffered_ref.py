"""``BufferedRef``: the window buffer, semaphores and slot counters of one operand.

A buffered operand owns a window buffer with one slot per block in flight. Four
monotone counters (``copy_in_slot``, ``wait_in_slot``, ``copy_out_slot``,
``wait_out_slot``; uint32) count the DMAs issued and awaited; the slot a DMA uses is
the counter modulo the number of slots. An input-output operand with an ``(in, out)``
buffer count shares one slot between its last input and first output stage and so
has ``in + out - 1`` slots.

An operand whose source already lives in the memory space the block asks for (for
example a VMEM ref with a VMEM block spec, or any HBM/ANY ref with an HBM block spec)
gets no buffer: the pipeline aliases the block of the source in place.

The interface (``BufferedRefBase``) and the ref helpers are ``buffered_ref_base``,
re-exported here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline import blocks
from palladium.pipeline.buffered_ref_base import (
    BufferedRefBase,
    block_memory_space,
    is_aliased,
    ref_memory_space,
    ref_value_aval,
    window_slot,
    window_type,
)
from palladium.pipeline.buffering import BufferType, split_buffer_count, total_slots
from palladium.pipeline.dma import LocalCopy
from palladium.pipeline.errors import PipelineConfigError
from palladium.pipeline.grid import next_index
from palladium.pipeline.tiling import Tiling

__all__ = ["BufferedRef", "BufferedRefBase", "ref_memory_space", "ref_value_aval"]


_STATIC_FIELDS = (
    "_spec", "_buffer_type", "_in_buffer_count", "_out_buffer_count", "_grid_rank",
    "tiling", "is_trivial_windowing", "has_allocated_buffer", "prefetched_count",
    "await_prefetch", "output_wait_read_only",
)
_DATA_FIELDS = (
    "window_ref", "copy_in_slot", "wait_in_slot", "copy_out_slot", "wait_out_slot",
    "next_fetch", "sem_recvs", "sem_sends",
)


@dataclasses.dataclass(frozen=True)
class BufferedRef(BufferedRefBase):
    """Multiple-buffered window of one pipeline operand (a pytree).

    Attributes:
      window_ref: the slots (``(slots, *block)``; 1-D blocks are stored contiguously
        as ``(slots * block,)``), or the aliased source block, or None before binding.
      copy_in_slot / wait_in_slot / copy_out_slot / wait_out_slot: DMA counters.
      next_fetch: the grid indices the lookahead fetcher looks at next.
      sem_recvs / sem_sends: one DMA semaphore per slot for input / output copies.
      output_wait_read_only: await output copies for the read of their slot only. On
        a TensorCore with jax 0.10.x, Mosaic accepts a source (read) semaphore only on
        remote DMAs, so the wait covers the whole copy (a stronger wait: the slot is
        free and the write has landed) and no fence is needed at the end.
      tiling: the tiling to round ragged blocks to (None: from the TPU generation).
    """

    _spec: Any
    _buffer_type: BufferType
    _in_buffer_count: int
    _out_buffer_count: int
    _grid_rank: int | None
    window_ref: Any
    copy_in_slot: Any
    wait_in_slot: Any
    copy_out_slot: Any
    wait_out_slot: Any
    next_fetch: Sequence[Any] | None
    sem_recvs: Any
    sem_sends: Any
    tiling: Tiling | None = None
    is_trivial_windowing: bool = False  # type: ignore[misc]
    has_allocated_buffer: bool = False
    prefetched_count: int = 0  # type: ignore[misc]
    await_prefetch: bool = False  # type: ignore[misc]
    output_wait_read_only: bool = False

    # -- configuration --------------------------------------------------------------
    @property
    def spec(self):
        return self._spec

    @property
    def buffer_type(self) -> BufferType:
        return self._buffer_type

    @property
    def in_buffer_count(self) -> int:
        """Slots the pipeline prefetches inputs into."""
        return self._in_buffer_count

    @property
    def out_buffer_count(self) -> int:
        """Slots the pipeline writes back from."""
        return self._out_buffer_count

    @property
    def is_buffered(self) -> bool:
        """Whether the operand has a window buffer the pipeline copies through."""
        return self._in_buffer_count > 0 or self._out_buffer_count > 0

    @property
    def use_lookahead(self) -> bool:
        return self._grid_rank is not None

    @property
    def buffer_count(self) -> int:
        """The number of slots of the window buffer."""
        if not self.is_buffered:
            raise PipelineConfigError("buffer count is undefined for an aliased operand")
        return total_slots(self._in_buffer_count, self._out_buffer_count, self._buffer_type)

    @classmethod
    def create(
        cls,
        spec,
        dtype_or_type,
        buffer_type: BufferType,
        buffer_count,
        grid_rank: int | None = None,
        use_lookahead: bool = False,
        source_memory_space: Any = jc.ANY,
        tiling: Tiling | None = None,
        is_trivial_windowing: bool = False,
        prefetched_count: int = 0,
    ) -> BufferedRef:
        """A BufferedRef whose buffers are *types* (allocate them with ``run_scoped``).

        Args:
          spec: the block spec.
          dtype_or_type: the dtype of the operand, or its aval (the shape is ignored).
          buffer_type: INPUT, OUTPUT or INPUT_OUTPUT.
          buffer_count: slots; an ``(in, out)`` pair for INPUT_OUTPUT.
          grid_rank: rank of the pipeline grid (needed for lookahead).
          use_lookahead: fetch changed blocks as soon as slots free up.
          source_memory_space: memory space of the operand's ref.
          tiling: tiling to round ragged blocks to.
          is_trivial_windowing: the block is the whole array.
          prefetched_count: leading blocks already fetched by the caller; the window
            buffer then comes from ``with_window_ref``.
        """
        if isinstance(dtype_or_type, jc.AbstractValue):
            ty = dtype_or_type
        else:
            ty = jc.ShapedArray((1,), dtype_or_type)
        space = block_memory_space(spec)
        if is_aliased(spec, space, source_memory_space):
            return cls(
                _spec=spec, _buffer_type=buffer_type, _in_buffer_count=0,
                _out_buffer_count=0, _grid_rank=None, window_ref=None,
                copy_in_slot=None, wait_in_slot=None, copy_out_slot=None,
                wait_out_slot=None, next_fetch=None, sem_recvs=None, sem_sends=None,
                tiling=None, is_trivial_windowing=is_trivial_windowing,
                has_allocated_buffer=False,
            )
        if use_lookahead and grid_rank is None:
            raise PipelineConfigError("grid_rank must be specified when use_lookahead is True.")
        in_count, out_count = split_buffer_count(buffer_count, buffer_type)
        slots = total_slots(in_count, out_count, buffer_type)
        window_ref = space.from_type(window_type(ty, spec, slots, tiling, is_trivial_windowing))
        if prefetched_count > 0:
            window_ref = None
            if not is_trivial_windowing and prefetched_count > in_count:
                raise PipelineConfigError(
                    "prefetched_count must be at most in_buffer_count for non-trivial"
                    f" windowing, got prefetched_count={prefetched_count} and"
                    f" in_buffer_count={in_count}"
                )
        sems = jc.SemaphoreType.DMA((slots,))
        return cls(
            _spec=spec, _buffer_type=buffer_type, _in_buffer_count=in_count,
            _out_buffer_count=out_count,
            _grid_rank=grid_rank if use_lookahead else None, window_ref=window_ref,
            copy_in_slot=None, wait_in_slot=None, copy_out_slot=None, wait_out_slot=None,
            next_fetch=None,
            sem_recvs=None if buffer_type is BufferType.OUTPUT or is_trivial_windowing
            else sems,
            sem_sends=None if buffer_type is BufferType.INPUT or is_trivial_windowing
            else sems,
            tiling=tiling, is_trivial_windowing=is_trivial_windowing,
            has_allocated_buffer=True, prefetched_count=prefetched_count,
        )

    @classmethod
    def input(cls, spec, dtype_or_type, buffer_count=2, **kwargs) -> BufferedRef:
        """An input operand (copied in ahead of use)."""
        return cls.create(spec, dtype_or_type, BufferType.INPUT, buffer_count, **kwargs)

    @classmethod
    def output(cls, spec, dtype_or_type, buffer_count=2, **kwargs) -> BufferedRef:
        """An output operand (written back after use)."""
        return cls.create(spec, dtype_or_type, BufferType.OUTPUT, buffer_count, **kwargs)

    @classmethod
    def input_output(cls, spec, dtype_or_type, buffer_count: int | tuple[int, int] = (2, 1),
                     **kwargs) -> BufferedRef:
        """An operand read and written back; uses ``in + out - 1`` slots."""
        return cls.create(spec, dtype_or_type, BufferType.INPUT_OUTPUT, buffer_count, **kwargs)

    # -- functional updates ---------------------------------------------------------
    def with_spec(self, spec) -> BufferedRef:
        return dataclasses.replace(self, _spec=spec)

    def with_next_fetch(self, next_fetch=None) -> BufferedRef:
        return dataclasses.replace(self, next_fetch=next_fetch)

    def with_window_ref(self, window_ref) -> BufferedRef:
        """Bind an externally allocated window buffer (prefetched inputs)."""
        return dataclasses.replace(self, window_ref=window_ref)

    def with_slot_index(self, copy_in_slot=None, copy_out_slot=None, wait_in_slot=None,
                        wait_out_slot=None) -> BufferedRef:
        updates = {name: value for name, value in (
            ("copy_in_slot", copy_in_slot), ("copy_out_slot", copy_out_slot),
            ("wait_in_slot", wait_in_slot), ("wait_out_slot", wait_out_slot),
        ) if value is not None}
        return dataclasses.replace(self, **updates) if updates else self

    # -- slots ----------------------------------------------------------------------
    def _missing_window_error(self) -> PipelineConfigError:
        if self.prefetched_count > 0:
            return PipelineConfigError(
                "Expected external window buffer to be bound for prefetched input"
                f" (prefetched_count={self.prefetched_count}), but window_ref is None."
                " Ensure .with_window_ref(...) is called on the BufferedRef in allocations."
            )
        return PipelineConfigError("window_ref is None")

    @property
    def current_ref(self):
        """The block the body sees at the current step."""
        if self.window_ref is None:
            raise self._missing_window_error()
        if not self.is_buffered or self.is_trivial_windowing:
            return self.window_ref
        slot = self.current_copy_out_slot if self.is_output else self.current_wait_in_slot
        return self._window_ref_at(slot)

    def _slot(self, counter):
        return lax.rem(counter, np.uint32(self.buffer_count))

    @property
    def cumulative_copy_in(self):
        assert self.copy_in_slot is not None
        return self.copy_in_slot

    @property
    def cumulative_wait_in(self):
        assert self.wait_in_slot is not None
        return self.wait_in_slot

    @property
    def cumulative_copy_out(self):
        assert self.copy_out_slot is not None
        return self.copy_out_slot

    @property
    def cumulative_wait_out(self):
        assert self.wait_out_slot is not None
        return self.wait_out_slot

    @property
    def current_copy_in_slot(self):
        return self._slot(self.cumulative_copy_in)

    @property
    def current_wait_in_slot(self):
        return self._slot(self.cumulative_wait_in)

    @property
    def current_copy_out_slot(self):
        return self._slot(self.cumulative_copy_out)

    @property
    def current_wait_out_slot(self):
        return self._slot(self.cumulative_wait_out)

    @property
    def next_fetch_indices(self):
        if not self.use_lookahead:
            raise PipelineConfigError("Can only get fetch indices if using lookahead.")
        assert self.next_fetch is not None
        return self.next_fetch

    def initialize_slots(self) -> BufferedRef:
        """All counters at zero (and the lookahead cursor at the first grid step)."""
        if self.window_ref is None and self.prefetched_count > 0:
            raise self._missing_window_error()
        zero_in = np.uint32(0) if self.buffer_type.is_input else None
        zero_out = np.uint32(0) if self.buffer_type.is_output else None
        return dataclasses.replace(
            self, copy_in_slot=zero_in, wait_in_slot=zero_in, copy_out_slot=zero_out,
            wait_out_slot=zero_out,
            next_fetch=None if self._grid_rank is None
            else tuple(np.int32(0) for _ in range(self._grid_rank)),
        )

    def _advanced(self, name: str, predicate) -> BufferedRef:
        counter = getattr(self, name)
        assert counter is not None
        if isinstance(predicate, bool):
            new = counter + 1 if predicate else counter
        else:
            new = lax.select(predicate, counter + 1, counter)
        return dataclasses.replace(self, **{name: new})

    def advance_copy_in_slot(self, predicate: Any = True) -> BufferedRef:
        if not (self.is_buffered and self.is_input):
            return self
        return self._advanced("copy_in_slot", predicate)

    def advance_wait_in_slot(self, predicate: Any = True) -> BufferedRef:
        if not (self.is_buffered and self.is_input):
            return self
        return self._advanced("wait_in_slot", predicate)

    def advance_copy_out_slot(self, predicate: Any = True) -> BufferedRef:
        if not (self.is_buffered and self.is_output):
            return self
        return self._advanced("copy_out_slot", predicate)

    def advance_wait_out_slot(self, predicate: Any = True) -> BufferedRef:
        if not (self.is_buffered and self.is_output):
            return self
        return self._advanced("wait_out_slot", predicate)

    def loop_state(self) -> tuple:
        """The values that change from step to step (carried by the grid loop)."""
        return (self.copy_in_slot, self.wait_in_slot, self.copy_out_slot,
                self.wait_out_slot, self.next_fetch)

    def with_loop_state(self, state: tuple) -> BufferedRef:
        copy_in, wait_in, copy_out, wait_out, next_fetch = state
        return dataclasses.replace(self, copy_in_slot=copy_in, wait_in_slot=wait_in,
                                   copy_out_slot=copy_out, wait_out_slot=wait_out,
                                   next_fetch=next_fetch)

    def advance_next_fetch(self, grid) -> BufferedRef:
        if self.next_fetch is None:
            raise PipelineConfigError("next_fetch is None")
        return self.with_next_fetch(next_index(tuple(self.next_fetch), grid))

    def _window_ref_at(self, slot, window_slice=None):
        if self.window_ref is None:
            raise self._missing_window_error()
        if self.is_trivial_windowing:
            return self.window_ref
        return window_slot(self.window_ref, slot, self.buffer_count, window_slice)

    # -- aliasing -------------------------------------------------------------------
    def bind_existing_ref(self, window_ref, indices) -> BufferedRef:
        """Alias the block of an operand that already lives in the block's memory."""
        if self.is_buffered or self.has_allocated_buffer:
            return self
        if self.is_trivial_windowing:
            return dataclasses.replace(self, window_ref=window_ref)
        return dataclasses.replace(self, window_ref=window_ref.at[self.compute_slice(indices)])

    def unbind_refs(self) -> BufferedRef:
        if self.is_buffered or self.has_allocated_buffer:
            return self
        return dataclasses.replace(self, window_ref=None)

    def compute_slice(self, grid_indices):
        """The indexer of the whole block at ``grid_indices`` (no tile rounding)."""
        assert self.block_shape is not None
        return blocks.block_indexer(self.block_shape, self.compute_index(*grid_indices))

    # -- DMAs -----------------------------------------------------------------------
    def _in_copy(self, slot, src_ref, grid_indices) -> LocalCopy:
        assert self.sem_recvs is not None
        src_slice = self.get_dma_slice(ref_value_aval(src_ref), grid_indices)
        window = self._window_ref_at(slot, self.to_window_slice(src_slice))
        return LocalCopy(src_ref.at[src_slice], window, self.sem_recvs.at[slot])

    def _out_copy(self, slot, dst_ref, grid_indices) -> LocalCopy:
        assert self.sem_sends is not None
        dst_slice = self.get_dma_slice(ref_value_aval(dst_ref), grid_indices)
        window = self._window_ref_at(slot, self.to_window_slice(dst_slice))
        return LocalCopy(window, dst_ref.at[dst_slice], self.sem_sends.at[slot])

    def _await_out(self, copy: LocalCopy) -> None:
        # A full wait also covers output_wait_read_only (see the class docstring).
        copy.wait()

    def copy_in(self, src_ref, grid_indices) -> None:
        """Start the DMA of the block at ``grid_indices`` into the copy-in slot."""
        assert self.is_input
        if not self.is_buffered:
            return
        self._in_copy(self.current_copy_in_slot, src_ref, grid_indices).start()

    def wait_in(self, src_ref, grid_indices) -> None:
        """Wait for the DMA into the wait-in slot."""
        assert self.is_input
        if not self.is_buffered:
            return
        self._in_copy(self.current_wait_in_slot, src_ref, grid_indices).wait()

    def copy_out(self, dst_ref, grid_indices) -> None:
        """Start writing the copy-out slot back; synchronous with one output slot."""
        assert self.is_output
        if not self.is_buffered:
            return
        copy = self._out_copy(self.current_copy_out_slot, dst_ref, grid_indices)
        copy.start()
        if self.out_buffer_count == 1:
            self._await_out(copy)

    def wait_out(self, dst_ref, grid_indices) -> None:
        """Wait for the write-back from the wait-out slot (no-op with one slot)."""
        assert self.is_output
        if not self.is_buffered:
            return
        if self.out_buffer_count > 1:
            self._await_out(self._out_copy(self.current_wait_out_slot, dst_ref, grid_indices))

    def wait_out_write(self, dst_ref, grid_indices) -> None:
        """Wait for the *write* of one output copy (``output_wait_read_only`` fence)."""
        if not self.is_buffered or self.is_trivial_windowing:
            return
        # Every output wait already covered the write (see the class docstring).
        del dst_ref, grid_indices


jax.tree_util.register_dataclass(
    BufferedRef, data_fields=list(_DATA_FIELDS), meta_fields=list(_STATIC_FIELDS)
)
