"""The buffers of a pipeline: one BufferedRef per pipelined operand, from its spec."""

from __future__ import annotations

import jax

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline.blocks import has_trivial_windowing
from palladium.pipeline.buffered_ref import (
    BufferedRef,
    BufferedRefBase,
    ref_memory_space,
    ref_value_aval,
)
from palladium.pipeline.buffering import BufferType, PipelineMode
from palladium.pipeline.errors import PipelineConfigError, PipelineNotImplementedError
from palladium.pipeline.tiling import Tiling

_REVISIT_EXPLANATION = (
    "emit_pipeline does not implement RevisitMode. A block may be revisited once the"
    " previous write back has landed: it is awaited out_buffer_count - 1 steps after the"
    " visit that wrote it, and an input_output block is re-fetched in_buffer_count - 1"
    " steps before the revisit, so visits must be in_buffer_count + out_buffer_count - 1"
    " grid steps apart."
)

def normalize_specs(specs) -> tuple:
    if isinstance(specs, list):
        return tuple(specs)
    if not isinstance(specs, tuple):
        return (specs,)
    return specs


def filter_specs_and_refs(specs, refs):
    """Operands with ``pl.no_block_spec`` are not pipelined: spec and ref become None."""
    unwindowed = lambda s: s is jc.no_block_spec  # noqa: E731
    return (jax.tree.map(lambda s, r: None if unwindowed(s) else s, specs, refs),
            jax.tree.map(lambda s, r: None if unwindowed(s) else r, specs, refs))


def _named(operand: str, make):
    try:
        return make()
    except PipelineConfigError as err:
        raise type(err)(f"{operand}: {err}") from None


def make_pipeline_allocations(*refs, in_specs=(), out_specs=(), tiling: Tiling | None = None,
                               grid=()):
    """BufferedRefs (as types to allocate) for every operand of a pipeline.

    Allocate them with ``pltpu.run_scoped`` (or pass the result of
    :func:`emit_pipeline_with_allocations`' second function) to reuse the buffers
    across several invocations of the pipeline.
    """
    num_in = len(in_specs)
    in_specs = normalize_specs(in_specs)
    out_specs = normalize_specs(out_specs)
    in_specs, in_refs = filter_specs_and_refs(in_specs, refs[:num_in])
    out_specs, out_refs = filter_specs_and_refs(out_specs, refs[num_in:])
    counter = iter(range(10**9))

    def make_input(spec, ref):
        name = f"in_specs[{next(counter)}]"
        aval = ref_value_aval(ref)
        mode = _named(name, lambda: PipelineMode.of(spec.pipeline_mode))
        trivial = has_trivial_windowing(spec, grid, aval.shape)
        buffer_count = 2 if mode is None else mode.buffer_count
        if mode is None and trivial:
            buffer_count = 1
        if mode is not None and mode.use_lookahead and grid is None:
            raise PipelineConfigError(f"{name}: Grid must be specified when using lookahead.")
        return _named(name, lambda: BufferedRef.input(
            spec, aval, buffer_count, grid_rank=len(grid),
            use_lookahead=mode is not None and mode.use_lookahead,
            source_memory_space=ref_memory_space(ref), tiling=tiling,
            is_trivial_windowing=trivial,
            prefetched_count=0 if mode is None else mode.prefetched_count,
        ))

    in_brefs = jax.tree.map(make_input, in_specs, in_refs)
    counter = iter(range(10**9))

    def make_output(spec, ref):
        name = f"out_specs[{next(counter)}]"
        aval = ref_value_aval(ref)
        mode = _named(name, lambda: PipelineMode.of(spec.pipeline_mode))
        if mode is not None and mode.use_lookahead:
            raise PipelineConfigError(f"{name}: Output buffering does not support lookahead.")
        if mode is not None and mode.revisit is not None:
            raise PipelineNotImplementedError(f"{name}: {_REVISIT_EXPLANATION}")
        trivial = has_trivial_windowing(spec, grid, aval.shape)
        buffer_count = 2 if mode is None else mode.buffer_count
        if mode is None and trivial:
            buffer_count = 1
        return _named(name, lambda: BufferedRef.output(
            spec, aval, buffer_count, source_memory_space=ref_memory_space(ref),
            tiling=tiling, is_trivial_windowing=trivial,
        ))

    out_brefs = jax.tree.map(make_output, out_specs, out_refs)
    return (*in_brefs, *out_brefs)


def specs_from_allocations(allocations, args):
    flat = [b for b in allocations if isinstance(b, BufferedRefBase) or b is None]
    is_in = lambda b: b is None or b.buffer_type is BufferType.INPUT  # noqa: E731
    in_specs = tuple(b.spec if b is not None else None for b in flat if is_in(b))
    out_specs = tuple(b.spec for b in flat if not is_in(b))
    num_in = sum(1 for b in flat if is_in(b))
    in_specs, in_refs = filter_specs_and_refs(in_specs, args[:num_in])
    out_specs, out_refs = filter_specs_and_refs(out_specs, args[num_in:])
    return in_specs, in_refs, out_specs, out_refs
