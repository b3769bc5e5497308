"""How a pipelined operand is buffered: :class:`BufferType` and :class:`Buffered`."""

from __future__ import annotations

import dataclasses
import enum
import warnings
from typing import Any

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline.errors import PipelineConfigError


class _BufferTypeMeta(enum.EnumMeta):
    # The deprecation fires on attribute access, as jax's does, so that
    # ``BufferType.MANUAL`` in user code warns where it is written.
    def __getattribute__(cls, name: str):
        if name == "MANUAL":
            warnings.warn(
                "BufferType.MANUAL is deprecated and will be removed in a future release.",
                DeprecationWarning,
                stacklevel=2,
            )
        return super().__getattribute__(name)


class BufferType(enum.Enum, metaclass=_BufferTypeMeta):
    """Whether a pipelined operand is read (INPUT), written (OUTPUT) or both.

    ``MANUAL`` is deprecated: accessing it warns.
    """

    INPUT = 1
    OUTPUT = 2
    INPUT_OUTPUT = 3
    MANUAL = 4

    @property
    def is_input(self) -> bool:
        return self.value in (1, 3)

    @property
    def is_output(self) -> bool:
        return self.value in (2, 3)


@dataclasses.dataclass(frozen=True)
class Buffered:
    """A ``BlockSpec.pipeline_mode`` for :func:`palladium.pipeline.emit_pipeline`.

    Attributes:
      buffer_count: slots to multiple-buffer into. An int, or for an input-output
        operand an ``(in, out)`` pair: ``in`` slots are prefetched, ``out`` slots are
        written back asynchronously, and the operand uses ``in + out - 1`` slots.
      use_lookahead: fetch the next *changed* block as soon as a slot is free, however
        many grid steps ahead it is.
      prefetched_count: how many leading blocks the caller already fetched into the
        window buffer (bound with ``BufferedRef.with_window_ref``) before the pipeline.
      revisit: not implemented; any value other than None is rejected for outputs.

    jax's own ``pl.Buffered`` is accepted wherever this is.

    Example::

        >>> from jax.experimental import pallas as pl
        >>> from palladium.pipeline import Buffered
        >>> spec = pl.BlockSpec((8, 128), lambda i: (i, 0), pipeline_mode=Buffered(3))
    """

    buffer_count: int | tuple[int, int]
    use_lookahead: bool = False
    prefetched_count: int = 0
    revisit: Any = None


@dataclasses.dataclass(frozen=True)
class PipelineMode:
    """The normalised pipeline mode of one operand (ours or jax's ``pl.Buffered``)."""

    buffer_count: int | tuple[int, int]
    use_lookahead: bool
    prefetched_count: int
    revisit: Any

    @classmethod
    def of(cls, mode: Any) -> PipelineMode | None:
        if mode is None:
            return None
        if not isinstance(mode, (Buffered, jc.JaxBuffered)) and not hasattr(
            mode, "buffer_count"
        ):
            raise PipelineConfigError(
                f"pipeline_mode must be palladium.pipeline.Buffered or pl.Buffered, got {mode!r}"
            )
        return cls(
            buffer_count=mode.buffer_count,
            use_lookahead=bool(getattr(mode, "use_lookahead", False)),
            prefetched_count=int(getattr(mode, "prefetched_count", 0) or 0),
            revisit=getattr(mode, "revisit", None),
        )


def split_buffer_count(
    buffer_count: int | tuple[int, int], buffer_type: BufferType
) -> tuple[int, int]:
    """``(in_slots, out_slots)`` of an operand; raises on a malformed count."""
    if not (buffer_type.is_input or buffer_type.is_output):
        raise PipelineConfigError(f"cannot infer buffer counts for {buffer_type}")
    is_pair = (
        isinstance(buffer_count, tuple)
        and len(buffer_count) == 2
        and all(isinstance(c, int) and not isinstance(c, bool) for c in buffer_count)
    )
    if isinstance(buffer_count, int) and not isinstance(buffer_count, bool):
        if buffer_type is BufferType.INPUT_OUTPUT:
            # An int keeps write-back synchronous; an (in, out) pair buffers it.
            counts = (buffer_count, 1)
        else:
            counts = (
                buffer_count if buffer_type.is_input else 0,
                buffer_count if buffer_type.is_output else 0,
            )
    elif is_pair and buffer_type is BufferType.INPUT_OUTPUT:
        counts = (buffer_count[0], buffer_count[1])  # type: ignore[index]
    else:
        raise PipelineConfigError(
            "buffer_count must be a static int, or a static (in, out) pair of ints for"
            f" input_output buffers; got {buffer_count!r} for {buffer_type}"
        )
    in_count, out_count = counts
    if (buffer_type.is_input and in_count < 1) or (buffer_type.is_output and out_count < 1):
        raise PipelineConfigError(f"buffer_count must be at least 1, got {buffer_count}")
    return in_count, out_count


def total_slots(in_count: int, out_count: int, buffer_type: BufferType) -> int:
    """Slots of the window buffer: an input-output operand shares one slot."""
    return in_count + out_count - int(buffer_type is BufferType.INPUT_OUTPUT)
