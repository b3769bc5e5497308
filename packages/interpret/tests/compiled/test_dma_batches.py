"""The DMA table's batches (``compiled/dma_table.py``): DMAs started one after the other
enter the table as one vector update, waits one after the other are taken at once. The
oracle: the table's rules one operation at a time, in numpy (a DMA checked against the
DMAs in flight, its column of the ring, its semaphore's stream; a wait taking the next
bytes of its stream, freeing the DMAs it covers, a drained semaphore starting again at
0). Random runs of starts, waits and accesses, out-of-range semaphores and counts that
overflow included: the same flags and the same table, to the bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from palladium.interpret.compiled import dma_table
from palladium.interpret.compiled.dma_table import DMA_SLOTS, DmaTable
from palladium.interpret.compiled.traced_state import (
    FLAG_CONFLICT,
    FLAG_DEADLOCK,
    FLAG_LEAK,
    FLAG_SLOTS,
    TracedState,
    TraceFacts,
    View,
)

pytestmark = pytest.mark.timeout(300)

N_SEMS, N_BUFS, SIZE = 3, 3, 64
MAX = np.iinfo(np.int32).max


def _norm(sem):
    """The column indexing and ``dynamic_update_slice`` reach for semaphore ``sem``."""
    return min(max(sem + N_SEMS if sem < 0 else sem, 0), N_SEMS - 1)


class _Oracle:
    """The table's rules, one operation at a time (int32 counts wrap)."""

    def __init__(self):
        self.sems = np.zeros((2, N_SEMS), np.int32)
        self.rows = np.full((8, DMA_SLOTS), -1, np.int32)
        self.started, self.flag = 0, 0

    def _hits(self, buf, lo, hi, write):
        r = self.rows
        hit = (r[2] == buf) & (r[3] < hi) & (lo < r[4])
        if write:
            hit |= (r[5] == buf) & (r[6] < hi) & (lo < r[7])
        return bool(hit.any())

    def start(self, sbuf, slo, shi, dbuf, dlo, dhi, sem, nbytes):
        if self._hits(sbuf, slo, shi, False) or self._hits(dbuf, dlo, dhi, True):
            self.flag |= FLAG_CONFLICT
        slot = self.started % DMA_SLOTS
        self.started += 1
        c = _norm(sem)
        issued = self.sems[0, c]
        if self.rows[0, slot] >= 0 or int(issued) > MAX - nbytes:
            self.flag |= FLAG_SLOTS
        with np.errstate(over="ignore"):
            self.sems[0, c] = issued + np.int32(nbytes)
        self.rows[:, slot] = [sem, self.sems[0, c], dbuf, dlo, dhi, sbuf, slo, shi]

    def wait(self, sem, nbytes):
        c = _norm(sem)
        with np.errstate(over="ignore"):
            issued, taken = self.sems[0, c], self.sems[1, c] + np.int32(nbytes)
        if issued < taken:
            self.flag |= FLAG_DEADLOCK
        done = (self.rows[0] == sem) & (self.rows[1] <= taken)
        self.rows[:, done] = -1
        self.sems[:, c] = (0, 0) if issued == taken else (issued, taken)

    def access(self, buf, lo, hi, write):
        if self._hits(buf, lo, hi, write):
            self.flag |= FLAG_CONFLICT

    def finish(self):
        if (self.rows[0] >= 0).any() or (self.sems[0] != self.sems[1]).any():
            self.flag |= FLAG_LEAK


def _program(seed, n):
    """``n`` operations: (kind, static part, traced values), runs of starts and of waits
    likelier than not, a few out-of-range semaphores and huge counts."""
    rng = np.random.default_rng(seed)
    ops, kind = [], "start"
    for _ in range(n):
        if rng.random() < 0.35:
            kind = str(rng.choice(["start", "wait", "access"], p=[0.5, 0.4, 0.1]))
        sem = int(rng.choice([0, 1, 2, -1, 3, -5], p=[0.4, 0.3, 0.2, 0.04, 0.03, 0.03]))
        nbytes = int(rng.choice([4, 8, 16, 1 << 30, 0], p=[0.4, 0.3, 0.22, 0.04, 0.04]))
        size = int(rng.integers(1, 9))
        if kind == "start":
            sbuf, dbuf = (int(b) for b in rng.choice(N_BUFS, 2, replace=False))
            ops.append(("start", (sbuf, dbuf, size, nbytes),
                        [int(rng.integers(0, SIZE - size)), int(rng.integers(0, SIZE - size)), sem]))
        elif kind == "wait":
            ops.append(("wait", (nbytes,), [sem]))
        else:
            ops.append(("access", (int(rng.integers(N_BUFS)), size, bool(rng.random() < 0.5)),
                        [int(rng.integers(0, SIZE - size))]))
    return ops


def _tidy(seed, rounds):
    """Rounds of DMAs to disjoint regions, then their waits, in another order: no flag,
    unless one round (``seed``'s choice) overlaps a destination, waits once too often,
    leaves a DMA in flight or starts more DMAs than the ring holds."""
    rng = np.random.default_rng(seed)
    fault = seed % 5  # 0: none, 1: overlap, 2: a wait too many, 3: leak, 4: ring
    ops = []
    for r in range(rounds):
        k = DMA_SLOTS + 1 if fault == 4 and r == 1 else int(rng.integers(1, 7))
        sems = [int(s) for s in rng.integers(0, N_SEMS, k)]
        for i, sem in enumerate(sems):
            at = 1 + i % 8 * 7 if not (fault == 1 and r == 1 and i == 1) else 2
            ops.append(("start", (0, 1 + i // 8 % 2, 2, 8), [int(rng.integers(0, 60)), at, sem]))
        if fault == 3 and r == rounds - 1:
            sems = sems[1:]
        if fault == 2 and r == 1:
            sems = [*sems, sems[0]]
        ops += [("wait", (8,), [sem]) for sem in rng.permutation(sems).tolist()]
        ops.append(("access", (1, 4, True), [int(rng.integers(0, 60))]))
    return ops


def _run(ops, facts):
    """The traced program of ``ops`` over ``facts``."""
    def run(values):
        bufs = [jnp.zeros(SIZE, jnp.float32) for _ in range(N_BUFS)]
        st = TracedState(bufs, jnp.int32(0), facts, DmaTable.empty(N_SEMS))
        at = 0
        for kind, fixed, vals in ops:
            v = [values[at + i] for i in range(len(vals))]
            at += len(vals)
            if kind == "start":
                sbuf, dbuf, size, nbytes = fixed
                st.dma.start(st, (sbuf, View([v[0]], [size], [1], [False])),
                             (dbuf, View([v[1]], [size], [1], [False])), v[2], nbytes)
            elif kind == "wait":
                st.dma.wait(st, v[0], fixed[0])
            else:
                buf, size, write = fixed
                st.check_access(buf, View([v[0]], [size], [1], [False]), write=write)
        st.dma.finish(st)
        return st.flag, *st.dma.arrays()

    return run, np.asarray([x for _, _, vals in ops for x in vals], np.int32)


def _traced(ops):
    run, values = _run(ops, TraceFacts())
    return [np.asarray(x) for x in jax.jit(run)(values)]


def _oracle(ops):
    o = _Oracle()
    for kind, fixed, v in ops:
        if kind == "start":
            sbuf, dbuf, size, nbytes = fixed
            o.start(sbuf, v[0], v[0] + size, dbuf, v[1], v[1] + size, v[2], nbytes)
        elif kind == "wait":
            o.wait(v[0], fixed[0])
        else:
            buf, size, write = fixed
            o.access(buf, v[0], v[0] + size, write)
    o.finish()
    return [np.int32(o.flag), o.sems, o.rows, np.int32(o.started)]


@pytest.mark.parametrize("seed", range(12))
def test_batched_starts_and_waits_give_the_one_by_one_tables_flags_and_state(seed):
    ops = _program(seed, 60)
    for got, want in zip(_traced(ops), _oracle(ops)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", range(10))
def test_tidy_runs_raise_no_flag_and_each_fault_its_own(seed):
    ops = _tidy(seed, 4)
    got, want = _traced(ops), _oracle(ops)
    # (a wait too many leaves its bytes owed at the end; the ring's 33 DMAs overlap too)
    assert int(want[0]) == [0, FLAG_CONFLICT, FLAG_DEADLOCK | FLAG_LEAK, FLAG_LEAK,
                            FLAG_CONFLICT | FLAG_SLOTS][seed % 5]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_a_batch_is_cut_at_its_largest_size():
    """More DMAs in a row than a batch holds (``_BATCH``) enter in several batches."""
    k = dma_table._BATCH + 5
    ops = [("start", (0, 1, 1, 4), [i, i, 0]) for i in range(k)]
    ops += [("wait", (4,), [0]) for _ in range(k)]
    got, want = _traced(ops), _oracle(ops)
    assert int(want[0]) == 0
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_a_first_trace_finds_the_dmas_buffers_without_tracing_their_checks():
    # (the whole launch's first trace only finds which buffers DMAs reach; its program
    # is never compiled, so it need not trace a conflict check)
    conflicting = [ops for ops in map(lambda seed: _program(seed, 60), range(40))
                   if _oracle(ops)[0] & FLAG_CONFLICT][:3]
    assert conflicting
    for ops in conflicting:
        every, gathering = TraceFacts(), TraceFacts(gathering=True)
        run, values = _run(ops, every)
        checked = jax.make_jaxpr(run)(values)
        assert int(jax.jit(run)(values)[0]) & FLAG_CONFLICT
        run, values = _run(ops, gathering)
        found = jax.make_jaxpr(run)(values)
        assert not int(jax.jit(run)(values)[0]) & FLAG_CONFLICT
        assert (gathering.dst_found, gathering.src_found) == (every.dst_found, every.src_found)
        assert gathering.dst_found and gathering.src_found
        assert len(found.eqns) < len(checked.eqns)
