"""The schedule of one pipeline step: when each operand copies, waits and advances.

Per step ``s`` of an operand with ``in`` input slots and ``out`` output slots:

* prologue (before the loop): fetch the blocks of steps ``0 .. in-2`` that differ
  from their predecessor;
* ``copy_in``: fetch the block of step ``s + in - 1`` if it differs from the block of
  step ``s + in - 2`` (lookahead operands instead fetch every upcoming *changed* block
  while a slot is free);
* ``wait_in``: wait for the current block if it changed (or at the first step);
* the body runs on the current slots;
* ``copy_out``: write the block back if the next step moves to another block (or at the
  last step);
* ``wait_out``: wait for the write-back issued ``max(out - 1, 1)`` steps earlier;
* ``advance``: move the wait-in counter if the block changes next step;
* epilogue (after the loop): wait for the write-backs still in flight.

Every predicate is a static bool when it can be decided while tracing.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline.grid import all_less, i32, indices_differ, next_index, prev_index

when = jc.when


def _as_uint32(x):
    return jnp.uint32(x) if isinstance(x, bool) else x.astype(jnp.uint32)


def fetch_with_lookahead(buffered_ref, src_ref, grid, grid_offsets, predicate: Any = True,
                         max_num_fetches: int | None = None):
    """Fetch upcoming changed blocks of ``buffered_ref`` while it has free input slots.

    Walks the grid from ``next_fetch`` and starts a copy for every step whose block
    differs from the previous step's, until the slots are full (``wait_in + in``
    copies), ``max_num_fetches`` copies were issued, or the grid ends.
    """
    assert buffered_ref.use_lookahead
    shift = lambda idx: tuple(i + o for i, o in zip(idx, grid_offsets, strict=True))  # noqa: E731
    limit = buffered_ref.cumulative_wait_in + buffered_ref.in_buffer_count
    if max_num_fetches is not None:
        once = buffered_ref.cumulative_copy_in + max_num_fetches
        # min() of two uint32 counters does not lower in Mosaic; select does.
        limit = lax.select(limit < once, limit, once)

    def cond(carry):
        _, upcoming, issued = carry
        return predicate & (issued < limit) & all_less(upcoming, grid)

    def body(carry):
        current, upcoming, issued = carry
        here = shift(current)
        there = shift(upcoming)
        changes = indices_differ(buffered_ref.compute_index(*here),
                                 buffered_ref.compute_index(*there))
        should_copy = changes
        if buffered_ref.prefetched_count > 0:
            should_copy = should_copy & (issued >= buffered_ref.prefetched_count)
        at_slot = buffered_ref.with_slot_index(copy_in_slot=issued)

        @when(should_copy)
        def _():
            at_slot.copy_in(src_ref, there)

        return upcoming, next_index(upcoming, grid, overflow=True), issued + _as_uint32(changes)

    start = buffered_ref.next_fetch_indices
    final, _, issued = lax.while_loop(
        cond, body, (start, next_index(start, grid, overflow=True),
                     buffered_ref.cumulative_copy_in))
    return buffered_ref.with_next_fetch(final).with_slot_index(copy_in_slot=issued)


class Scheduler:
    """Sequences input and output copies and waits for one pipeline step."""

    def __init__(self, step, indices, grid, grid_offsets, num_stages: int,
                 trace_scopes: bool = True, _explicit_indices: bool = False):
        """
        Args:
          step: the linear step (traced or int).
          indices: the grid indices of the step, before the megacore offset.
          grid: this core's grid.
          grid_offsets: the megacore offset of each grid dimension.
          num_stages: the deepest buffering of any operand (at least 2).
          trace_scopes: wrap each phase in a ``jax.named_scope``.
          _explicit_indices: the body receives a PipelineStep; no grid env is pushed.
        """
        self.step = step
        self.grid = grid
        self.grid_offsets = grid_offsets
        self.num_stages = num_stages
        self.trace_scopes = trace_scopes
        self._explicit_indices = _explicit_indices
        self.num_steps = math.prod(grid)
        self.first_step = step == 0
        self.last_step = step == self.num_steps - 1
        self.add_offset = lambda idx: tuple(  # noqa: E731
            i32(i) if isinstance(o, int) and o == 0 else i32(i + o)
            for i, o in zip(idx, grid_offsets, strict=True))
        self.indices = self.add_offset(indices)
        upcoming = next_index(indices, grid)
        self.next_indices = self.add_offset(upcoming)
        # fetch_indices[k]: the step k ahead; prev_indices[k]: k behind (wrapping, so
        # only meaningful once step >= k).
        self.fetch_indices = [self.indices, self.next_indices]
        self.prev_indices = [self.indices]
        behind = indices
        for _ in range(num_stages - 1):
            behind = prev_index(behind, grid)
            upcoming = next_index(upcoming, grid)
            self.prev_indices.append(self.add_offset(behind))
            self.fetch_indices.append(self.add_offset(upcoming))
        self._block_index_memo: dict[Any, Any] = {}

    def _block_index(self, bref, indices):
        key = (id(bref.spec.index_map),
               tuple((True, id(i)) if isinstance(i, jc.Tracer) else (False, i)
                     for i in indices))
        if key not in self._block_index_memo:
            # Keep the indices alive so that their ids stay unique while memoised.
            self._block_index_memo[key] = (bref.compute_index(*indices), indices)
        return self._block_index_memo[key][0]

    @contextlib.contextmanager
    def named_scope(self, name: str):
        if self.trace_scopes:
            with jax.named_scope(name):
                yield
        else:
            yield

    def grid_env(self):
        """The grid env the body sees (``pl.program_id`` of the inner grid)."""
        if self._explicit_indices:
            return contextlib.nullcontext()
        return jc.grid_env([jc.GridAxis(i, g) for i, g in zip(self.indices, self.grid,
                                                              strict=True)])

    # -- block-change predicates -----------------------------------------------------
    def _static(self, bref) -> bool | None:
        if not bref.is_buffered or bref.is_trivial_windowing:
            return False
        if bref.has_indirect:
            return True
        return None

    def out_of_fetch(self, bref):
        """Whether every block of the grid has been fetched already."""
        if not bref.is_buffered:
            return False
        return self.step >= (self.num_steps - bref.in_buffer_count + 1)

    def has_changed(self, bref, steps_back: int = 1):
        """Whether the block changed on entering step ``step - steps_back + 1``."""
        assert steps_back >= 1, steps_back
        static = self._static(bref)
        if static is not None:
            return static
        return indices_differ(self._block_index(bref, self.prev_indices[steps_back - 1]),
                              self._block_index(bref, self.prev_indices[steps_back]))

    def will_change_current(self, bref):
        static = self._static(bref)
        if static is not None:
            return static
        return indices_differ(self._block_index(bref, self.indices),
                              self._block_index(bref, self.next_indices))

    def will_change_fetch(self, bref):
        static = self._static(bref)
        if static is not None:
            return static
        if bref.in_buffer_count < 2:
            return self.has_changed(bref)
        ahead = bref.in_buffer_count
        return indices_differ(self._block_index(bref, self.fetch_indices[ahead - 2]),
                              self._block_index(bref, self.fetch_indices[ahead - 1]))

    def alias_local_refs(self, bref, ref):
        return bref.bind_existing_ref(ref, self.indices)

    def unalias_local_refs(self, bref):
        return bref.unbind_refs()

    # -- schedule --------------------------------------------------------------------
    def initialize_step(self, bref, src_ref, step: int = 0, init_limit: int | None = None):
        """Prologue fetch number ``step`` (issued at the first grid step only)."""
        with self.named_scope(f"ep_initialize_{step}"):
            if not bref.is_input or not bref.is_buffered:
                return bref
            # A trivial window is fetched once: synchronously before the loop, or (new
            # style async prefetch) at prologue step 0.
            if bref.is_trivial_windowing and (
                not bref.await_prefetch or bref.prefetched_count > 0 or step > 0
            ):
                return bref
            limit = max(bref.in_buffer_count - 1, 0) if init_limit is None else init_limit
            if step >= limit:
                return bref
            in_bounds = step < self.num_steps
            first = self.first_step & in_bounds
            not_prefetched = step >= bref.prefetched_count
            if bref.use_lookahead and step > 0:
                return fetch_with_lookahead(bref, src_ref, self.grid, self.grid_offsets,
                                            predicate=first, max_num_fetches=1)
            if bref.use_lookahead:
                target = self.add_offset(bref.next_fetch_indices)
                predicate = first
            else:
                target = self.fetch_indices[step]
                predicate = first
                if step > 0:
                    predicate = predicate & indices_differ(
                        self._block_index(bref, target),
                        self._block_index(bref, self.fetch_indices[step - 1]))

            @when(predicate & not_prefetched)
            def _():
                bref.copy_in(src_ref, target)

            return bref.advance_copy_in_slot(predicate)

    def wait_in(self, bref, src_ref):
        if bref.is_trivial_windowing and not bref.await_prefetch:
            return bref
        predicate = self.has_changed(bref) | self.first_step
        if not bref.await_prefetch:
            predicate = predicate & (self.step >= bref.prefetched_count)

        @when(predicate)
        @self.named_scope("ep_wait_in")
        def _():
            if bref.is_input:
                bref.wait_in(src_ref, self.indices)

        return bref

    def copy_in(self, bref, src_ref):
        if bref.is_trivial_windowing:
            return bref
        predicate = self.will_change_fetch(bref) & jnp.logical_not(self.out_of_fetch(bref))
        # A single input slot has no prologue: the first step always fetches.
        if bref.is_buffered and bref.in_buffer_count < 2:
            predicate = predicate | self.first_step
        if not bref.is_input:
            return bref
        if bref.use_lookahead:
            return fetch_with_lookahead(bref, src_ref, self.grid, self.grid_offsets)
        needed: Any = True
        if bref.prefetched_count > 0:
            needed = self.step + bref.in_buffer_count > bref.prefetched_count

        @when(predicate & needed)
        @self.named_scope("ep_copy_in")
        def _():
            if bref.is_buffered:
                bref.copy_in(src_ref, self.fetch_indices[bref.in_buffer_count - 1])

        return bref.advance_copy_in_slot(predicate)

    def _out_lag(self, bref) -> int:
        # With one output slot the copy is synchronous; lag 1 keeps the bookkeeping.
        return max(bref.out_buffer_count - 1, 1)

    def wait_out(self, bref, dst_ref):
        if bref.is_trivial_windowing or not bref.is_buffered or not bref.is_output:
            return bref
        lag = self._out_lag(bref)
        predicate = self.has_changed(bref, lag) & (self.step >= lag)

        @when(predicate)
        @self.named_scope("ep_wait_out")
        def _():
            bref.wait_out(dst_ref, self.prev_indices[lag])

        return bref.advance_wait_out_slot(predicate)

    def copy_out(self, bref, dst_ref):
        if bref.is_trivial_windowing:
            return bref
        predicate = self.will_change_current(bref) | self.last_step

        @when(predicate)
        @self.named_scope("ep_copy_out")
        def _():
            if bref.is_output:
                bref.copy_out(dst_ref, self.indices)

        return bref.advance_copy_out_slot(predicate & bref.is_output)

    def finalize_step(self, bref, dst_ref, lag: int = 0):
        """Epilogue: wait for the write-back issued ``lag`` steps before the end."""
        if (bref.is_trivial_windowing or not bref.is_buffered or not bref.is_output
                or lag >= self._out_lag(bref)):
            return bref
        changed = True if lag == 0 else self.has_changed(bref, lag)
        predicate = self.last_step & (lag < self.num_steps) & changed

        @when(predicate)
        @self.named_scope(f"ep_finalize_{lag}")
        def _():
            bref.wait_out(dst_ref, self.prev_indices[lag])

        return bref.advance_wait_out_slot(predicate)

    def advance_slots(self, bref):
        if bref.is_input:
            bref = bref.advance_wait_in_slot(self.will_change_current(bref) | self.last_step)
        return bref
