"""What a pipeline step sees: ``PipelineStep``, maps over BufferedRef trees, ``sync_copy``."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline.buffered_ref import BufferedRef, BufferedRefBase, ref_value_aval
from palladium.pipeline.errors import PipelineConfigError

is_bref = lambda x: isinstance(x, BufferedRefBase)  # noqa: E731
map_brefs = functools.partial(jax.tree.map, is_leaf=is_bref)
map_brefs.__doc__ = "``jax.tree.map`` with BufferedRefs as leaves."


def map_inputs(f, *args):
    """Apply ``f`` to every input BufferedRef (others pass through)."""
    return map_brefs(lambda bref, *rest: f(bref, *rest) if bref.is_input else bref, *args)


def map_outputs(f, *args):
    """Apply ``f`` to every output BufferedRef (others pass through)."""
    return map_brefs(lambda bref, *rest: f(bref, *rest) if bref.is_output else bref, *args)


@dataclasses.dataclass(frozen=True, eq=False)
class PipelineStep:
    """Where the body runs, passed first to the body with ``_explicit_indices=True``.

    Attributes:
      index: the grid indices of the step (with the megacore offset), one per dim.
      local_index: the linear step counter of this core's share of the grid.
    """

    index: tuple[Any, ...]
    local_index: Any


jax.tree_util.register_dataclass(PipelineStep, data_fields=["index", "local_index"],
                                 meta_fields=[])


def sync_copy(src, dst, indices) -> None:
    """Synchronously copy the block at ``indices`` between a ref and a BufferedRef.

    Exactly one of ``src`` and ``dst`` must be a :class:`BufferedRef`; the copy goes
    into (or out of) its current slot.
    """
    if isinstance(src, BufferedRef):
        if isinstance(dst, BufferedRef):
            raise PipelineConfigError("Only one of src or dst can be a BufferedRef.")
        bref, other, into_window = src, dst, False
    else:
        if not isinstance(dst, BufferedRef):
            raise PipelineConfigError("One of src or dst must be a BufferedRef.")
        bref, other, into_window = dst, src, True
    window = bref.current_ref
    if not bref.is_trivial_windowing:
        other_slice = bref.get_dma_slice(ref_value_aval(other), indices)
        window = window.at[bref.to_window_slice(other_slice)]
        other = other.at[other_slice]
    if into_window:
        jc.tpu_sync_copy(other, window)
    else:
        jc.tpu_sync_copy(window, other)
