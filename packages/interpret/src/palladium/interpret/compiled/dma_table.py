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

from typing import Any, NamedTuple

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
#: The most DMAs entered into the table at once (``DmaTable.flush``).
_BATCH = 16


class _Pending(NamedTuple):
    """A started DMA not yet in the table: its semaphore, bytes and regions."""

    sem: Any
    nbytes: int
    dbuf: int
    dlo: Any
    dhi: Any
    sbuf: int
    slo: Any
    shi: Any


class DmaTable:
    """``sems`` (per semaphore the bytes DMAs issued on it and the bytes waits took),
    ``rows`` (one int32 row per field, one column per slot: a DMA's start updates one
    column) and ``started`` (how many DMAs the launch started: the ring's next column)."""

    def __init__(self, sems: Any, rows: Any, started: Any) -> None:
        self.sems, self.rows, self.started = sems, rows, started
        self.pending: list[_Pending] = []  # started, not yet in the table (``flush``)
        self.waits: list[tuple[Any, int]] = []  # waited for, not yet taken (``flush``)

    @classmethod
    def empty(cls, n_sems: int) -> DmaTable:
        """No DMA in flight, every semaphore at 0."""
        return cls(jnp.zeros((2, max(n_sems, 1)), jnp.int32),
                   jnp.full((len(_FIELDS), DMA_SLOTS), -1, jnp.int32), jnp.int32(0))

    def arrays(self) -> tuple[Any, Any, Any]:
        if self.pending or self.waits:
            raise AssertionError("the DMA table's arrays read with DMAs pending (flush first)")
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
        ``[issued, issued + nbytes)`` of its semaphore's stream. Its entry waits in
        ``pending`` with the DMAs started right before it: ``flush`` enters them at once."""
        if self.waits:
            self.flush(st)
        (sbuf, sview), (dbuf, dview) = src, dst
        st.facts.src_found.add(sbuf)
        st.facts.dst_found.add(dbuf)
        slo, shi = flat_span(st.bufs[sbuf].shape, sview)
        dlo, dhi = flat_span(st.bufs[dbuf].shape, dview)
        self.pending.append(_Pending(sem, nbytes, dbuf, dlo, dhi, sbuf, slo, shi))
        if len(self.pending) >= _BATCH:
            self.flush(st)

    def flush(self, st: TracedState) -> None:
        """Enter the pending DMAs, or take the pending waits (only one kind waits)."""
        if self.waits:
            self._take(st)
        else:
            self._enter(st)

    def _enter(self, st: TracedState) -> None:
        """Enter the pending DMAs (started one after the other, nothing read the table
        between them) into the table as one vector update, raising the flags each start
        raises in turn: DMA ``i`` is checked against the table's columns no earlier DMA
        of the batch took and against those earlier DMAs (one update per DMA, ~6 fused
        operations and copies each, made paged attention's executable ~2x slower)."""
        batch, self.pending = self.pending, []
        if not batch:
            return
        k, rows, i32 = len(batch), self.rows, jnp.int32

        def vec(field: str) -> Any:
            return jnp.stack([jnp.asarray(getattr(d, field), i32) for d in batch])

        sem, slo, shi, dlo, dhi = (vec(f) for f in ("sem", "slo", "shi", "dlo", "dhi"))
        nb = np.asarray([d.nbytes for d in batch], np.int32)
        sbuf, dbuf = np.asarray([d.sbuf for d in batch]), np.asarray([d.dbuf for d in batch])
        # per DMA, the buffer each check compares (-2: none, statically): what it reads
        # against the writes in flight; what it writes against the writes, and the reads
        read = np.asarray([d.sbuf if st.facts.conflicts(d.sbuf, False)[0] else -2 for d in batch])
        both = [st.facts.conflicts(d.dbuf, True) for d in batch]
        write_w = np.asarray([d.dbuf if w else -2 for d, (w, _) in zip(batch, both)])
        write_r = np.asarray([d.dbuf if r else -2 for d, (_, r) in zip(batch, both)])
        # the table's column c is taken by the batch's DMA ``offset[c]`` (if < k)
        offset = (jnp.arange(DMA_SLOTS, dtype=i32) - self.started) % DMA_SLOTS
        visible = offset[None, :] >= np.arange(k)[:, None]  # [i, c]: no DMA j < i took c

        def in_table(ids: Any, lo: Any, hi: Any, b: int, lo_row: int, hi_row: int) -> Any:
            return ((rows[b][None, :] == ids[:, None]) & (rows[lo_row][None, :] < hi[:, None])
                    & (lo[:, None] < rows[hi_row][None, :]))

        earlier = np.tri(k, k, -1, bool)  # [i, j]: j < i

        def in_batch(ids: Any, bufs: Any, lo: Any, hi: Any, jlo: Any, jhi: Any) -> Any:
            match = earlier & (bufs[None, :] == ids[:, None])  # static
            if not match.any():
                return None
            return match & (jlo[None, :] < hi[:, None]) & (lo[:, None] < jhi[None, :])

        hits = [in_table(ids, lo, hi, *r) for ids, lo, hi, r in (
            (read, slo, shi, (_DBUF, _DLO, _DHI)), (write_w, dlo, dhi, (_DBUF, _DLO, _DHI)),
            (write_r, dlo, dhi, (_SBUF, _SLO, _SHI))) if (ids >= 0).any()]
        pairs = [h for h in (in_batch(read, dbuf, slo, shi, dlo, dhi),
                             in_batch(write_w, dbuf, dlo, dhi, dlo, dhi),
                             in_batch(write_r, sbuf, dlo, dhi, slo, shi)) if h is not None]
        conflict: Any = False
        for h in hits:
            conflict = im.any_of(conflict, jnp.any(h & visible))
        for h in pairs:
            conflict = im.any_of(conflict, jnp.any(h))
        st.raise_flag(FLAG_CONFLICT, conflict)
        # the semaphores' column, as indexing reads it and ``dynamic_update_slice``
        # writes it (a negative index counts from the end; out of range: the nearest)
        n = self.sems.shape[1]
        col = jnp.clip(jnp.where(sem < 0, sem + n, sem), 0, n - 1)
        same = earlier & (col[:, None] == col[None, :])
        issued = self.sems[0][col] + jnp.sum(jnp.where(same, nb[None, :], 0), axis=1, dtype=i32)
        end = issued + nb  # (int32 sums wrap as the one-by-one updates do)
        taken = offset < k
        # a column the batch takes is still in flight, or a stream's count would overflow
        st.raise_flag(FLAG_SLOTS, jnp.any(taken & (rows[_SEM] >= 0))
                      | jnp.any(issued > _MAX_BYTES - nb))
        onto = col[:, None] == jnp.arange(n, dtype=i32)[None, :]
        self.sems = self.sems.at[0].add(jnp.sum(jnp.where(onto, nb[:, None], 0), axis=0,
                                                dtype=i32))
        entries = jnp.stack([sem, end, jnp.asarray(dbuf, i32), dlo, dhi,
                             jnp.asarray(sbuf, i32), slo, shi])  # [field, i]
        self.rows = jnp.where(taken[None, :], jnp.take(entries, jnp.minimum(offset, k - 1),
                                                       axis=1), rows)
        self.started = self.started + k

    def wait(self, st: TracedState, sem: Any, nbytes: int) -> None:
        """A ``dma_wait`` of ``nbytes`` on semaphore ``sem``. The simulator lands the
        semaphore's DMAs in issue order until their bytes cover the wait and takes the
        bytes: so the wait takes the next ``nbytes`` of the semaphore's stream, and a DMA
        whose bytes are all taken is no longer in flight. Fewer bytes issued than
        taken: a deadlock (no DMA of this core can ever signal it). It waits in
        ``waits`` with the waits right before it: ``flush`` takes them at once."""
        if self.pending:
            self.flush(st)
        self.waits.append((sem, nbytes))
        if len(self.waits) >= _BATCH:
            self.flush(st)

    def _take(self, st: TracedState) -> None:
        """The pending waits, one after the other, as a few vector operations: each
        wait's counts are the ones the last earlier wait on its column left (else the
        table's); the columns they free are those any of them frees in the table (a
        wait only frees columns: the ones an earlier wait freed match nothing more)."""
        batch, self.waits = self.waits, []
        n, rows, i32 = self.sems.shape[1], self.rows, jnp.int32
        sem = jnp.stack([jnp.asarray(s, i32) for s, _ in batch])
        nb = np.asarray([b for _, b in batch], np.int32)
        col = jnp.clip(jnp.where(sem < 0, sem + n, sem), 0, n - 1)  # (as indexing reads)
        issued, held = self.sems[0][col], self.sems[1][col]
        left: list[tuple[Any, Any]] = []  # each wait's counts after it
        dead: Any = False
        takens = []
        for i in range(len(batch)):
            s0, s1 = issued[i], held[i]
            for j in range(i):
                same = col[j] == col[i]
                s0, s1 = jnp.where(same, left[j][0], s0), jnp.where(same, left[j][1], s1)
            taken = s1 + nb[i]
            takens.append(taken)
            dead = im.any_of(dead, s0 < taken)
            drained = s0 == taken  # a drained semaphore starts its stream again at 0
            left.append((jnp.where(drained, 0, s0), jnp.where(drained, 0, taken)))
        st.raise_flag(FLAG_DEADLOCK, dead)
        taken_v = jnp.stack(takens)
        done = jnp.any((rows[_SEM][None, :] == sem[:, None])
                       & (rows[_END][None, :] <= taken_v[:, None]), axis=0)
        self.rows = jnp.where(done[None, :], jnp.int32(-1), rows)  # their columns free
        sems = self.sems
        at = jnp.arange(n, dtype=i32)
        for j, (s0, s1) in enumerate(left):
            sems = jnp.where((at == col[j])[None, :], jnp.stack([s0, s1])[:, None], sems)
        self.sems = sems

    def finish(self, st: TracedState) -> None:
        """The end of the launch: nothing may be left in flight or on a semaphore."""
        self.flush(st)
        st.raise_flag(FLAG_LEAK, jnp.any(self.rows[_SEM] >= 0)
                      | jnp.any(self.sems[0] != self.sems[1]))
