"""``BufferedRefBase``: the face every buffered operand shows the pipeline scheduler.

The scheduler and the emitter core speak to a buffered operand only through this
interface (its counts, kind and DMA slices); :class:`~palladium.pipeline.buffered_ref.
BufferedRef` is the implementation. Also the two questions asked of any jax ref here:
its value type and its memory space.
"""

from __future__ import annotations

import jax

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline import blocks
from palladium.pipeline.buffering import BufferType
from palladium.pipeline.errors import PipelineConfigError
from palladium.pipeline.tiling import Tiling, infer_tiling


def ref_value_aval(ref):
    """The array type behind a ref (or a transformed ref)."""
    if isinstance(ref, jc.TransformedRef):
        return jc.ShapedArray(shape=ref.shape, dtype=ref.dtype)
    return jax.typeof(ref).inner_aval


def ref_memory_space(ref):
    """The memory space of a ref (or a transformed ref)."""
    if isinstance(ref, jc.TransformedRef):
        return ref.memory_space
    return jax.typeof(ref).memory_space


def block_memory_space(spec):
    """The TPU memory space a block spec asks for (VMEM when it names none)."""
    requested = jc.VMEM if spec.memory_space is None else spec.memory_space
    space = jc.memory_space_to_tpu_memory_space(requested, jc.CoreType.TC)
    if space not in (jc.SMEM, jc.VMEM, jc.HBM):
        raise PipelineConfigError(f"Unsupported buffer memory space: {space}")
    return space


def is_aliased(spec, space, source_memory_space) -> bool:
    """Whether an operand in ``source_memory_space`` is used in place (no buffer) by a
    block in ``space``: the source is already there, or the block asks for HBM."""
    if source_memory_space is not space and space is not jc.HBM:
        return False
    if space is jc.HBM and source_memory_space not in (jc.ANY, jc.HBM):
        raise PipelineConfigError(
            "You cannot request HBM block spec for a non-HBM source for"
            f" {spec=} and {source_memory_space=}"
        )
    return True


def window_type(ty, spec, slots: int, tiling, is_trivial_windowing: bool):
    """The type of a window buffer of ``slots`` blocks of ``spec`` (1-D blocks end to
    end; a trivially windowed operand's buffer is the whole array)."""
    if is_trivial_windowing:
        return ty
    block = blocks.window_shape(spec)
    if len(block) == 1 and tiling is not Tiling.SPARSE_CORE:
        return ty.update(shape=(slots * block[0],))
    return ty.update(shape=(slots, *block))


def window_slot(window, slot, buffer_count: int, window_slice=None):
    """The ref of slot ``slot`` of a window buffer (of ``window_slice`` within it)."""
    if window.ndim > 1:
        return window.at[(slot, *(window_slice or ()))]
    # 1-D windows keep their slots end to end.
    per_slot = window.shape[0] // buffer_count
    if window_slice is None:
        return window.at[jc.ds(slot * per_slot, per_slot)]
    (part,) = window_slice
    return window.at[jc.ds(slot * per_slot + part.start, part.size)]


class BufferedRefBase:
    """The interface the scheduler drives; :class:`BufferedRef` implements it."""

    @property
    def spec(self):
        raise NotImplementedError

    @property
    def buffer_type(self) -> BufferType:
        raise NotImplementedError

    @property
    def in_buffer_count(self) -> int:
        return 0

    @property
    def out_buffer_count(self) -> int:
        return 0

    @property
    def is_buffered(self) -> bool:
        return False

    @property
    def is_input(self) -> bool:
        return self.buffer_type.is_input

    @property
    def is_output(self) -> bool:
        return self.buffer_type.is_output

    @property
    def is_input_output(self) -> bool:
        return self.buffer_type is BufferType.INPUT_OUTPUT

    @property
    def is_manual(self) -> bool:
        return self.buffer_type is BufferType.MANUAL

    @property
    def is_trivial_windowing(self) -> bool:
        """Whether the block is the whole array, copied once around the pipeline."""
        return False

    @property
    def prefetched_count(self) -> int:
        return 0

    @property
    def await_prefetch(self) -> bool:
        return False

    @property
    def block_shape(self):
        return self.spec.block_shape

    @property
    def has_indirect(self) -> bool:
        if self.block_shape is None or jc.Indirect is None:
            return False
        return any(isinstance(d, jc.Indirect) for d in self.block_shape)

    @property
    def compute_index(self):
        return self.spec.index_map

    def get_dma_slice(self, src_ty, grid_indices):
        """The indexer of the source covered by the block at ``grid_indices``.

        A ragged last block is rounded up to the tile, not to the full block: e.g. a
        (256, 256) block of a (600, 600) f32 array at block (2, 0) copies rows 512:600
        (88 rows; 600 is a multiple of 8), and of a (601, 600) array rows 512:608.
        """
        src_shape = getattr(src_ty, "shape", None)
        if src_shape is None:
            raise PipelineConfigError(f"Type {src_ty} does not have a shape")
        if not src_shape:
            return ()
        tiles = infer_tiling(src_ty, getattr(self, "tiling", None))
        return blocks.dma_slices(self.block_shape, self.compute_index(*grid_indices),
                                 src_shape, tiles)

    def to_window_slice(self, dma_slice):
        return blocks.window_slices(self.block_shape, dma_slice)

    def bind_existing_ref(self, window_ref, indices):
        del window_ref, indices
        return self

    def unbind_refs(self):
        return self

    def with_spec(self, spec) -> BufferedRefBase:
        raise NotImplementedError
