"""A compiled launch's DMAs and semaphores, as traced arrays: the optional part of the
traced state (``traced_state.TracedState.dma``) that a compiled segment has not.

A DMA copies its data when it starts and is the next bytes of its semaphore's stream; a
``dma_wait`` takes the next bytes of the stream: the simulator's ``on_wait`` mode lands a
semaphore's DMAs in issue order until they cover the wait, so a DMA is in flight until
a wait took its last byte. Wherever that could give other results than the simulator,
a flag is raised (``traced_state.FLAGS``): an access or DMA that touches a region a DMA
in flight writes, or writes a region one reads (the simulator's data could differ; with
races on, the detector may report it); a wait no DMA in flight can satisfy (a
deadlock); more DMAs in flight than the table holds; a DMA left in flight or bytes left
on a semaphore at the end (a leak).

The DMAs in flight are a ring of ``DMA_SLOTS`` columns: the n-th DMA of the launch takes
column n mod ``DMA_SLOTS`` (a DMA still in flight there raises a flag). A region is kept
as the interval of flat element offsets it spans in its buffer.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from palladium.interpret.compiled import index_math as im
from palladium.interpret.compiled.traced_state import (
    FLAG_CONFLICT,
    FLAG_DEADLOCK,
    FLAG_LEAK,
    FLAG_SLOTS,
    TracedState,
    TraceFacts,
    View,
    flat_span,
)

__all__ = ["DMA_SLOTS", "DmaTable"]

#: DMAs a compiled launch keeps in flight at once (more: the launch runs simulated).
DMA_SLOTS = 32

# The rows of the table: a free column has -1 as its semaphore and buffers (so no wait
# and no access matches it). A DMA is the bytes up to ``end`` of its semaphore's stream:
# ``sems[0]`` counts the bytes issued on each semaphore, ``sems[1]`` the bytes waits took.
_FIELDS = ("sem", "end", "dbuf", "dlo", "dhi", "sbuf", "slo", "shi")
_SEM, _END, _DBUF, _DLO, _DHI, _SBUF, _SLO, _SHI = range(len(_FIELDS))
_MAX_BYTES = np.iinfo(np.int32).max


class DmaTable:
    """``sems`` (per semaphore the bytes DMAs issued on it and the bytes waits took),
    ``rows`` (one int32 row per field, one column per slot: a DMA's start updates one
    column) and ``started`` (how many DMAs the launch started: the ring's next column)."""

    def __init__(self, sems: Any, rows: Any, started: Any) -> None:
        self.sems, self.rows, self.started = sems, rows, started

    @classmethod
    def empty(cls, n_sems: int) -> DmaTable:
        """No DMA in flight, every semaphore at 0."""
        return cls(jnp.zeros((2, max(n_sems, 1)), jnp.int32),
                   jnp.full((len(_FIELDS), DMA_SLOTS), -1, jnp.int32), jnp.int32(0))

    def arrays(self) -> tuple[Any, Any, Any]:
        return (self.sems, self.rows, self.started)

    @classmethod
    def of(cls, arrays: tuple[Any, Any, Any]) -> DmaTable:
        return cls(*arrays)

    def overlaps(self, facts: TraceFacts, buf: int, lo: Any, hi: Any, write: bool) -> Any:
        """Whether ``[lo, hi)`` of ``buf`` overlaps a region a DMA in flight writes (or,
        for a write, reads); only the rows some DMA can match are compared."""
        dst, src = facts.conflicts(buf, write)
        t = self.rows

        def hits(b: int, lo_row: int, hi_row: int) -> Any:
            def row(r: int) -> Any:
                return lax.index_in_dim(t, r, keepdims=False)
            return lax.bitwise_and(lax.bitwise_and(lax.eq(row(b), np.int32(buf)),
                                                   lax.lt(row(lo_row), hi)),
                                   lax.lt(lo, row(hi_row)))

        rows = ([hits(_DBUF, _DLO, _DHI)] if dst else []) + (
            [hits(_SBUF, _SLO, _SHI)] if src else [])
        if not rows:
            return False
        hit = rows[0] if len(rows) == 1 else lax.bitwise_or(*rows)
        return lax.reduce_or(hit, (0,))  # (a free column's buffers are -1)

    def start(self, st: TracedState, src: tuple[int, View], dst: tuple[int, View], sem: Any,
              nbytes: int) -> None:
        """Record a DMA of ``st`` (its data is copied by the caller): the bytes
        ``[issued, issued + nbytes)`` of its semaphore's stream."""
        (sbuf, sview), (dbuf, dview) = src, dst
        st.facts.src_found.add(sbuf)
        st.facts.dst_found.add(dbuf)
        slo, shi = flat_span(st.bufs[sbuf].shape, sview)
        dlo, dhi = flat_span(st.bufs[dbuf].shape, dview)
        # it reads what a DMA in flight writes, or writes what one reads or writes
        st.raise_flag(FLAG_CONFLICT, im.any_of(self.overlaps(st.facts, sbuf, slo, shi, False),
                                               self.overlaps(st.facts, dbuf, dlo, dhi, True)))
        rows = self.rows
        slot = self.started % DMA_SLOTS
        self.started = self.started + 1
        issued = self.sems[0, sem]
        # the ring's column is still in flight, or the stream's count would overflow
        st.raise_flag(FLAG_SLOTS, (rows[_SEM, slot] >= 0) | (issued > _MAX_BYTES - nbytes))
        # (an in-place update of the count, read back for the entry: the executable is
        # ~4% faster than with a scatter and the entry reading the old count; one table of
        # DMAs and counts updated by an elementwise ``where`` per DMA was ~40% slower on
        # paged attention, though it had fewer thunks)
        self.sems = lax.dynamic_update_slice(
            self.sems, (issued + jnp.int32(nbytes)).reshape(1, 1), (jnp.int32(0), sem))
        fields = [sem, self.sems[0, sem], dbuf, dlo, dhi, sbuf, slo, shi]
        column = jnp.stack([jnp.asarray(v, jnp.int32) for v in fields])
        self.rows = lax.dynamic_update_slice(rows, column[:, None], (jnp.int32(0), slot))

    def wait(self, st: TracedState, sem: Any, nbytes: int) -> None:
        """A ``dma_wait`` of ``nbytes`` on semaphore ``sem``. The simulator lands the
        semaphore's DMAs in issue order until their bytes cover the wait and takes the
        bytes: so the wait takes the next ``nbytes`` of the semaphore's stream, and a DMA
        whose bytes are all taken is no longer in flight. Fewer bytes issued than
        taken: a deadlock (no DMA of this core can ever signal it)."""
        issued, taken = self.sems[0, sem], self.sems[1, sem] + nbytes
        st.raise_flag(FLAG_DEADLOCK, issued < taken)
        rows = self.rows
        done = (rows[_SEM] == sem) & (rows[_END] <= taken)
        self.rows = jnp.where(done[None, :], jnp.int32(-1), rows)  # their columns free
        # a drained semaphore starts its stream again at 0 (no entry refers to it)
        drained = issued == taken
        self.sems = lax.dynamic_update_slice(
            self.sems, jnp.where(drained, 0, jnp.stack([issued, taken]))[:, None],
            (jnp.int32(0), sem))

    def finish(self, st: TracedState) -> None:
        """The end of the launch: nothing may be left in flight or on a semaphore."""
        st.raise_flag(FLAG_LEAK, jnp.any(self.rows[_SEM] >= 0)
                      | jnp.any(self.sems[0] != self.sems[1]))
