"""``emit_pipeline``: a software pipeline over an inner grid, inside a Pallas TPU kernel.

The pipeline runs ``body`` once per step of ``grid`` on blocks of its operands, the way
``pallas_call`` runs a kernel over its grid, while DMAs of the next blocks and
write-backs of the previous ones are in flight. The grid loop is one ``fori_loop``
(a ``scan`` for a static grid), so tracing and lowering cost does not grow with the
number of steps.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline import primitive, primitive_rules  # noqa: F401  (registers the rules)
from palladium.pipeline.allocations import (
    filter_specs_and_refs,
    make_pipeline_allocations,
    normalize_specs,
    specs_from_allocations,
)
from palladium.pipeline.core import emit_inline
from palladium.pipeline.errors import PipelineConfigError
from palladium.pipeline.grid import core_info
from palladium.pipeline.step import PipelineStep, map_brefs, map_inputs, map_outputs, sync_copy
from palladium.pipeline.tiling import Tiling

__all__ = [
    "PipelineStep",
    "emit_pipeline",
    "emit_pipeline_with_allocations",
    "map_brefs",
    "map_inputs",
    "map_outputs",
    "sync_copy",
]


def emit_pipeline(
    body,
    *,
    grid: tuple[int | jax.Array, ...],
    in_specs=(),
    out_specs=(),
    tiling: Tiling | None = None,
    core_axis: tuple[int, ...] | int | None = None,
    core_axis_name: tuple[str, ...] | str | None = None,
    dimension_semantics: tuple[Any, ...] | None = None,
    trace_scopes: bool = True,
    no_pipelining: bool = False,
    output_wait_read_only: bool = False,
    use_primitive: bool | None = None,
    _explicit_indices: bool = False,
):
    """A function that runs ``body`` over ``grid`` as a pipeline, inside a TPU kernel.

    Call the result with the operands (refs, usually in HBM / ``pl.ANY``): first one per
    ``in_specs`` entry, then one per ``out_specs`` entry. ``body`` receives one block
    ref per operand (and the ``scratches`` passed to the call).

    Args:
      body: the per-step kernel.
      grid: the inner grid; Python ints and/or traced int32 scalars (dynamic grid).
      in_specs / out_specs: ``pl.BlockSpec`` per operand (pytrees allowed); a
        ``pipeline_mode=Buffered(n)`` (ours or ``pl.Buffered``) sets the buffering,
        ``pl.no_block_spec`` leaves an operand unpipelined.
      tiling: the tiling ragged blocks are rounded to (default: from the TPU
        generation, see :mod:`palladium.pipeline.tiling`).
      core_axis / core_axis_name: a kernel grid axis (int) or mesh axis name to split
        the parallel dimensions of ``grid`` over (megacore).
      dimension_semantics: PARALLEL / ARBITRARY per grid dimension.
      trace_scopes: annotate each phase with ``jax.named_scope``.
      no_pipelining: debug mode; every copy is synchronous.
      output_wait_read_only: await output copies only for the read of their slot and
        fence all writes once at the end.
      use_primitive: trace the pipeline into one ``palladium_emit_pipeline`` jaxpr
        equation (body and index maps as jaxprs) that is expanded when lowered to
        Mosaic or discharged, instead of inlining it while tracing (see
        :mod:`palladium.pipeline.primitive`). None follows jax's switch
        ``jax_use_emit_pipeline_primitive`` (the name the reference uses).
      _explicit_indices: ``body`` receives a :class:`PipelineStep` first.

    Example::

        def kernel(x_hbm, o_hbm):
            def body(x, o):
                o[...] = x[...] * 2
            emit_pipeline(body, grid=(4,),
                          in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                          out_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))])(x_hbm, o_hbm)
    """
    in_specs = normalize_specs(in_specs)
    out_specs = normalize_specs(out_specs)
    if any(g <= 0 for g in grid if isinstance(g, int)):
        raise PipelineConfigError(
            f"All elements in the grid must be strictly positive, but got {grid=}"
        )
    if core_axis is not None and core_axis_name is not None:
        raise PipelineConfigError("Only one of `core_axis` or `core_axis_name` can be set.")
    core_axis_ = core_axis_name if core_axis is None else core_axis
    if dimension_semantics is None:
        dimension_semantics = (jc.ARBITRARY,) * len(grid)
    options = dict(tiling=tiling, dimension_semantics=dimension_semantics,
                   trace_scopes=trace_scopes, no_pipelining=no_pipelining,
                   output_wait_read_only=output_wait_read_only,
                   _explicit_indices=_explicit_indices)

    def wrapped(*args, allocations=None, **kwargs):
        num_cores, core_id = core_info(core_axis_)
        if allocations is not None and not in_specs and not out_specs:
            ins, in_refs, outs, out_refs = specs_from_allocations(allocations, args)
        else:
            ins, in_refs = filter_specs_and_refs(in_specs, args[:len(in_specs)])
            outs, out_refs = filter_specs_and_refs(out_specs, args[len(in_specs):])
        if _primitive_enabled(use_primitive):
            return _bind_primitive(ins, in_refs, outs, out_refs, num_cores, core_id,
                                   allocations, **kwargs)
        pipeline = emit_inline(body, grid=grid, in_specs=ins, out_specs=outs,
                                  num_cores=num_cores, core_id=core_id, **options)
        return pipeline(*in_refs, *out_refs, allocations=allocations, **kwargs)

    def _bind_primitive(ins, in_refs, outs, out_refs, num_cores, core_id, allocations,
                        scratches=None):
        inline_options = {k: v for k, v in options.items() if k != "_explicit_indices"}

        def make_allocations(in_refs_, out_refs_, core_grid):
            return make_pipeline_allocations(*in_refs_, *out_refs_, in_specs=ins,
                                              out_specs=outs, grid=core_grid, tiling=tiling)

        primitive.bind_pipeline(
            body, grid=tuple(grid), in_specs=ins, in_refs=tuple(in_refs), out_specs=outs,
            out_refs=tuple(out_refs), scratches=() if scratches is None else tuple(scratches),
            num_cores=num_cores, core_id=core_id, options=inline_options,
            explicit_indices=_explicit_indices, make_allocations=make_allocations,
            allocations=allocations)

    return wrapped


def _primitive_enabled(use_primitive: bool | None) -> bool:
    if use_primitive is not None:
        return use_primitive
    flag = jc.use_emit_pipeline_primitive
    return bool(flag is not None and flag.value)


def emit_pipeline_with_allocations(body, *, grid, in_specs=(), out_specs=(), **kwargs):
    """``(pipeline, make_allocations)``: a pipeline and a maker of its buffers.

    ``make_allocations(*refs)`` returns the BufferedRefs of every operand, to allocate
    once at the top of a kernel (``pltpu.run_scoped``) and pass to several pipeline
    calls as ``pipeline(*refs, allocations=allocated)``. Extra keyword arguments go to
    :func:`emit_pipeline`.
    """
    make_allocations = functools.partial(make_pipeline_allocations, in_specs=in_specs,
                                         out_specs=out_specs, grid=grid,
                                         tiling=kwargs.get("tiling"))
    pipeline = emit_pipeline(body, grid=grid, in_specs=in_specs, out_specs=out_specs, **kwargs)
    return pipeline, make_allocations

