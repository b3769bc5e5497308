"""The emitter core: the inlined software pipeline, below both entry points.

:func:`emit_inline` traces the pipeline directly into the kernel (a ``fori_loop`` over
the steps, with the prologue and epilogue of the copies in flight). ``emit_pipeline``
(:mod:`palladium.pipeline.emit`) calls it while tracing, and the ``emit_pipeline``
primitive (:mod:`palladium.pipeline.primitive`) calls it when its equation is lowered or
discharged, so both paths produce the same DMAs. Neither is imported here.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline.allocations import make_pipeline_allocations, normalize_specs
from palladium.pipeline.buffered_ref import BufferedRef
from palladium.pipeline.errors import PipelineConfigError
from palladium.pipeline.grid import (
    next_index,
    partition_grid,
    prev_index,
    zero_unit_dims,
)
from palladium.pipeline.grid import (
    num_steps as grid_num_steps,
)
from palladium.pipeline.scheduler import Scheduler
from palladium.pipeline.step import (
    PipelineStep,
    is_bref,
    map_brefs,
    map_inputs,
    map_outputs,
    sync_copy,
)


def _fori_loop(upper, body, init):
    """``fori_loop`` from 0: a scan for a static bound, a while loop for a dynamic one."""
    if isinstance(upper, int):
        if upper <= 0:
            return init
        return lax.fori_loop(0, upper, body, init)
    return lax.fori_loop(jnp.int32(0), jnp.asarray(upper, jnp.int32), body, init)


def emit_inline(body, *, grid, in_specs=(), out_specs=(), tiling=None,
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
    in_specs = normalize_specs(in_specs)
    out_specs = normalize_specs(out_specs)

    def pipeline(*refs, scratches=None, allocations=None):
        scratches = () if scratches is None else scratches
        if allocations is None:
            return jc.run_scoped(
                lambda allocs: pipeline(*refs, scratches=scratches, allocations=allocs),
                make_pipeline_allocations(*refs, in_specs=in_specs, out_specs=out_specs,
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
                    make_pipeline_allocations(*refs[len(in_specs):], in_specs=(),
                                               out_specs=out_specs, grid=grid, tiling=tiling),
                )
        if output_wait_read_only:
            allocations = map_brefs(
                lambda b: dataclasses.replace(b, output_wait_read_only=True), allocations)
        return _run(refs, scratches, allocations)

    def _run(refs, scratches, allocations):
        leaves = [b for b in jax.tree.leaves(allocations, is_leaf=is_bref) if b is not None]
        num_stages = max((2, *(max(b.in_buffer_count, b.out_buffer_count) for b in leaves)))

        def scheduler(step, indices):
            return Scheduler(step, indices, grid, grid_offsets=grid_offsets,
                             num_stages=num_stages, trace_scopes=trace_scopes,
                             _explicit_indices=_explicit_indices)

        def run_body(sched, brefs):
            current = map_brefs(lambda b: b.current_ref, brefs)
            with sched.named_scope("ep_run_kernel"):
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
