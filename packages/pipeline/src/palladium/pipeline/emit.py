"""``emit_pipeline``: a software pipeline over an inner grid, inside a Pallas TPU kernel.

The pipeline runs ``body`` once per step of ``grid`` on blocks of its operands, the way
``pallas_call`` runs a kernel over its grid, while DMAs of the next blocks and
write-backs of the previous ones are in flight. The grid loop is one ``fori_loop``
(a ``scan`` for a static grid), so tracing and lowering cost does not grow with the
number of steps.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline import primitive
from palladium.pipeline.blocks import has_trivial_windowing
from palladium.pipeline.buffered_ref import (
    BufferedRef,
    BufferedRefBase,
    ref_memory_space,
    ref_value_aval,
)
from palladium.pipeline.buffering import BufferType, PipelineMode
from palladium.pipeline.errors import PipelineConfigError, PipelineNotImplementedError
from palladium.pipeline.grid import (
    core_info,
    next_index,
    partition_grid,
    prev_index,
    zero_unit_dims,
)
from palladium.pipeline.grid import (
    num_steps as grid_num_steps,
)
from palladium.pipeline.scheduler import Scheduler
from palladium.pipeline.tiling import Tiling

_REVISIT_EXPLANATION = (
    "emit_pipeline does not implement RevisitMode. A block may be revisited once the"
    " previous write back has landed: it is awaited out_buffer_count - 1 steps after the"
    " visit that wrote it, and an input_output block is re-fetched in_buffer_count - 1"
    " steps before the revisit, so visits must be in_buffer_count + out_buffer_count - 1"
    " grid steps apart."
)

_is_bref = lambda x: isinstance(x, BufferedRefBase)  # noqa: E731
map_brefs = functools.partial(jax.tree.map, is_leaf=_is_bref)
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
        window = window.at[bref._to_window_slice(other_slice)]
        other = other.at[other_slice]
    if into_window:
        jc.tpu_sync_copy(other, window)
    else:
        jc.tpu_sync_copy(window, other)


def _normalize_specs(specs) -> tuple:
    if isinstance(specs, list):
        return tuple(specs)
    if not isinstance(specs, tuple):
        return (specs,)
    return specs


def _filter_specs_and_refs(specs, refs):
    """Operands with ``pl.no_block_spec`` are not pipelined: spec and ref become None."""
    unwindowed = lambda s: s is jc.no_block_spec  # noqa: E731
    return (jax.tree.map(lambda s, r: None if unwindowed(s) else s, specs, refs),
            jax.tree.map(lambda s, r: None if unwindowed(s) else r, specs, refs))


def _named(operand: str, make):
    try:
        return make()
    except PipelineConfigError as err:
        raise type(err)(f"{operand}: {err}") from None


def _make_pipeline_allocations(*refs, in_specs=(), out_specs=(), tiling: Tiling | None = None,
                               grid=()):
    """BufferedRefs (as types to allocate) for every operand of a pipeline.

    Allocate them with ``pltpu.run_scoped`` (or pass the result of
    :func:`emit_pipeline_with_allocations`' second function) to reuse the buffers
    across several invocations of the pipeline.
    """
    num_in = len(in_specs)
    in_specs = _normalize_specs(in_specs)
    out_specs = _normalize_specs(out_specs)
    in_specs, in_refs = _filter_specs_and_refs(in_specs, refs[:num_in])
    out_specs, out_refs = _filter_specs_and_refs(out_specs, refs[num_in:])
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


def _fori_loop(upper, body, init):
    """``fori_loop`` from 0: a scan for a static bound, a while loop for a dynamic one."""
    if isinstance(upper, int):
        if upper <= 0:
            return init
        return lax.fori_loop(0, upper, body, init)
    return lax.fori_loop(jnp.int32(0), jnp.asarray(upper, jnp.int32), body, init)


def _emit_pipeline(body, *, grid, in_specs=(), out_specs=(), tiling=None,
                   dimension_semantics=None, trace_scopes=True, no_pipelining=False,
                   output_wait_read_only=False, num_cores=None, core_id=None,
                   _explicit_indices=False):
    """The pipeline function for an already filtered set of specs (see emit_pipeline)."""
    if any(not isinstance(d, (int, jax.Array)) or isinstance(d, bool) for d in grid):
        raise PipelineConfigError(
            "Grid must consist of Python integers and JAX Arrays:"
            f" {tuple(type(d) for d in grid)}"
        )
    grid, grid_offsets = partition_grid(tuple(grid), dimension_semantics, num_cores, core_id)
    steps = grid_num_steps(grid)
    in_specs = _normalize_specs(in_specs)
    out_specs = _normalize_specs(out_specs)

    def pipeline(*refs, scratches=None, allocations=None):
        scratches = () if scratches is None else scratches
        if allocations is None:
            return jc.run_scoped(
                lambda allocs: pipeline(*refs, scratches=scratches, allocations=allocs),
                _make_pipeline_allocations(*refs, in_specs=in_specs, out_specs=out_specs,
                                           grid=grid, tiling=tiling),
            )
        if isinstance(allocations, list):
            allocations = tuple(allocations)
        if len(allocations) == len(in_specs):
            # Only the inputs were allocated (async prefetch): re-bind their specs to
            # ours (index maps closing over this trace) and allocate the outputs here.
            allocations = map_brefs(lambda b, s: b.with_spec(s), allocations, in_specs)
            if len(refs) > len(in_specs):
                return jc.run_scoped(
                    lambda outs: pipeline(*refs, scratches=scratches,
                                          allocations=(*allocations, *outs)),
                    _make_pipeline_allocations(*refs[len(in_specs):], in_specs=(),
                                               out_specs=out_specs, grid=grid, tiling=tiling),
                )
        if output_wait_read_only:
            allocations = map_brefs(
                lambda b: dataclasses.replace(b, output_wait_read_only=True), allocations)
        return _run(refs, scratches, allocations)

    def _run(refs, scratches, allocations):
        leaves = [b for b in jax.tree.leaves(allocations, is_leaf=_is_bref) if b is not None]
        num_stages = max((2, *(max(b.in_buffer_count, b.out_buffer_count) for b in leaves)))

        def scheduler(step, indices):
            return Scheduler(step, indices, grid, grid_offsets=grid_offsets,
                             num_stages=num_stages, trace_scopes=trace_scopes,
                             _explicit_indices=_explicit_indices)

        def run_body(sched, brefs):
            current = map_brefs(lambda b: b.current_ref, brefs)
            with sched._named_scope("ep_run_kernel"):
                if _explicit_indices:
                    where = PipelineStep(tuple(jnp.asarray(i, jnp.int32) for i in sched.indices),
                                         jnp.asarray(sched.step, jnp.int32))
                    body(where, *current, *scratches)
                else:
                    body(*current, *scratches)

        if no_pipelining:
            _run_unpipelined(refs, allocations, scheduler, run_body)
            return None

        def loop_body(step, carry):
            state, indices = carry
            indices = zero_unit_dims(indices, grid)
            sched = scheduler(step, indices)
            with sched.grid_env():
                brefs = _with_state(template, state)
                brefs = map_brefs(sched.alias_local_refs, brefs, refs)
                brefs = map_brefs(sched.copy_in, brefs, refs)
                brefs = map_brefs(sched.wait_in, brefs, refs)
                run_body(sched, brefs)
                brefs = map_brefs(sched.copy_out, brefs, refs)
                brefs = map_brefs(sched.wait_out, brefs, refs)
                brefs = map_brefs(sched.advance_slots, brefs)
            return _state(brefs), next_index(indices, grid)

        # Only the counters are carried by the loop; the refs (window buffers,
        # semaphores) are closed over, so no ref ever crosses a loop boundary.
        template = map_brefs(lambda b: b.unbind_refs(), allocations)

        @jc.when(steps > 0)
        def _():
            start = (np.int32(0),) * len(grid)
            sched = scheduler(0, start)
            brefs = map_brefs(lambda b: b.initialize_slots(), allocations)

            def copy_trivial_in(bref, ref):
                if (bref.is_trivial_windowing and bref.window_ref is not None
                        and bref.prefetched_count < 1):
                    sync_copy(ref, bref, start)

            map_inputs(copy_trivial_in, brefs, refs)
            with sched.grid_env():
                # All prologue fetches of step 0 go out before those of step 1, etc.
                for ahead in range(sched.num_stages - 1):
                    brefs = map_brefs(functools.partial(sched.initialize_step, step=ahead),
                                      brefs, refs)
            with jc.mutable_array_checks(False):
                state, after = _fori_loop(steps, loop_body, (_state(brefs), start))
            brefs = _with_state(brefs, state)
            last = prev_index(after, grid)
            sched = scheduler(steps - 1, last)
            with sched.grid_env():
                for lag in range(sched.num_stages - 2, -1, -1):
                    brefs = map_brefs(functools.partial(sched.finalize_step, lag=lag),
                                      brefs, refs)

            def copy_trivial_out(bref, ref):
                if bref.is_trivial_windowing and bref.window_ref is not None:
                    sync_copy(bref, ref, start)

            map_outputs(copy_trivial_out, brefs, refs)

        return None

    def _run_unpipelined(refs, allocations, scheduler, run_body):
        # Debug mode: every copy is synchronous, at the step that needs it.
        def step_body(step, carry):
            state, indices = carry
            indices = zero_unit_dims(indices, grid)
            sched = scheduler(step, indices)
            with sched.grid_env():
                brefs = map_brefs(sched.alias_local_refs, _with_state(template, state), refs)
                map_inputs(lambda b, r: _sync_if_buffered(r, b, sched.indices), brefs, refs)
                run_body(sched, brefs)
                map_outputs(lambda b, r: _sync_if_buffered(b, r, sched.indices), brefs, refs)
            return _state(brefs), next_index(indices, grid)

        template = map_brefs(lambda b: b.initialize_slots(), allocations)
        with jc.mutable_array_checks(False):
            _fori_loop(steps, step_body, (_state(template), (np.int32(0),) * len(grid)))

    return pipeline


def _state(brefs):
    return map_brefs(lambda b: b.loop_state(), brefs)


def _with_state(brefs, state):
    return map_brefs(lambda b, s: b.with_loop_state(s), brefs, state)


def _sync_if_buffered(src, dst, indices):
    bref = src if isinstance(src, BufferedRef) else dst
    if bref.is_buffered:
        sync_copy(src, dst, indices)


def _specs_from_allocations(allocations, args):
    flat = [b for b in allocations if isinstance(b, BufferedRefBase) or b is None]
    is_in = lambda b: b is None or b.buffer_type is BufferType.INPUT  # noqa: E731
    in_specs = tuple(b.spec if b is not None else None for b in flat if is_in(b))
    out_specs = tuple(b.spec for b in flat if not is_in(b))
    num_in = sum(1 for b in flat if is_in(b))
    in_specs, in_refs = _filter_specs_and_refs(in_specs, args[:num_in])
    out_specs, out_refs = _filter_specs_and_refs(out_specs, args[num_in:])
    return in_specs, in_refs, out_specs, out_refs


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
    in_specs = _normalize_specs(in_specs)
    out_specs = _normalize_specs(out_specs)
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
            ins, in_refs, outs, out_refs = _specs_from_allocations(allocations, args)
        else:
            ins, in_refs = _filter_specs_and_refs(in_specs, args[:len(in_specs)])
            outs, out_refs = _filter_specs_and_refs(out_specs, args[len(in_specs):])
        if _primitive_enabled(use_primitive):
            return _bind_primitive(ins, in_refs, outs, out_refs, num_cores, core_id,
                                   allocations, **kwargs)
        pipeline = _emit_pipeline(body, grid=grid, in_specs=ins, out_specs=outs,
                                  num_cores=num_cores, core_id=core_id, **options)
        return pipeline(*in_refs, *out_refs, allocations=allocations, **kwargs)

    def _bind_primitive(ins, in_refs, outs, out_refs, num_cores, core_id, allocations,
                        scratches=None):
        primitive.check_primitive_support(allocations)
        inline_options = {k: v for k, v in options.items() if k != "_explicit_indices"}

        def make_allocations(in_refs_, out_refs_, core_grid):
            return _make_pipeline_allocations(*in_refs_, *out_refs_, in_specs=ins,
                                              out_specs=outs, grid=core_grid, tiling=tiling)

        primitive.bind_pipeline(
            body, grid=tuple(grid), in_specs=ins, in_refs=tuple(in_refs), out_specs=outs,
            out_refs=tuple(out_refs), scratches=() if scratches is None else tuple(scratches),
            num_cores=num_cores, core_id=core_id, options=inline_options,
            explicit_indices=_explicit_indices, make_allocations=make_allocations)

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
    make_allocations = functools.partial(_make_pipeline_allocations, in_specs=in_specs,
                                         out_specs=out_specs, grid=grid,
                                         tiling=kwargs.get("tiling"))
    pipeline = emit_pipeline(body, grid=grid, in_specs=in_specs, out_specs=out_specs, **kwargs)
    return pipeline, make_allocations

