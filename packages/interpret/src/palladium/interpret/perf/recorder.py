"""The timeline's observer: records what each simulated core does, in its own order.

Only the order of each core's own events is kept, never the host's interleaving of
cores, and times are computed afterwards by :mod:`.replay` in simulated time: the
prediction is a function of the kernel and its inputs, whatever the seed or the
threads did.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.context import CoreId
from palladium.interpret.eval.primitive_groups import CALLS
from palladium.interpret.observe.observers import LaunchInfo
from palladium.interpret.perf.chain import (
    Chunk,
    Run,
    chain_operands,
    conditional_cost,
    straight_body,
)
from palladium.interpret.perf.costs import Cost, equation_cost
from palladium.interpret.perf.dma_runs import merge_run
from palladium.interpret.perf.model import ChipModel
from palladium.shared_memory import (
    BlockCopy,
    BufferRef,
    DmaEvent,
    MemorySpace,
    Observer,
    SemaphoreInfo,
    SemaphoreKind,
)

# Event tuples, first item the kind:
#   ("c", seconds)                             compute chunk
#   ("step", step, grid_point)                 grid step begins
#   ("in", step, nbytes, buffer_count, name, local, strided)  pipeline input copy for
#        that step (local: the operand is in VMEM, placed there by XLA; strided: its
#        blocks are pieces of the array)
#   ("body_end", step)                         grid step body done
#   ("out", step, nbytes, buffer_count, name, local, strided)  output copy after it
#   ("dma", DmaEvent)                          a DMA started
#   ("dmas", [DmaEvent, ...])                  a run of DMAs (``dma_runs.merge_run``)
#   ("sig", sem_key, inc)                      a semaphore signal
#   ("wait", sem_key, value, label, is_dma)    a semaphore wait
#   ("bar",)                                   a barrier
#   ("mem", delta_bytes)                       VMEM in use changes


_COND = jc.cond_p


def _has_array(op: Any) -> bool:
    return any(getattr(getattr(v, "aval", None), "shape", ())
               for v in (*op.invars, *op.outvars))


#: The longest run of equations a core keeps unsettled before ``_settle`` (a loop of many
#: iterations between two events: its chain is settled as it goes, in bounded memory).
_RUN_LIMIT = 4096
#: Chunks (runs of equations between two events, from a fresh chain) a recorder keeps.
_CHUNK_LIMIT = 4096


class _Told(list):  # type: ignore[type-arg]
    """Equations told by one ``compute_run`` (its ``body``: their key, ``_body_key``)."""
    __slots__ = ("body",)
    body: tuple[Any, ...]


class TimelineRecorder(Observer):
    """Per-core event lists of one launch (created per launch by the timeline).

    Equations are told in runs: ``compute`` keeps each core's equations since its last
    event, and the run is costed when the next event comes (``_settle``). A run that
    starts a chunk (nothing pending, no chain) leaves the same counts and chain whatever
    the step, so a run of the same equations is costed once per launch and looked up
    after (``memo_chunks``; paged attention's page DMAs: thousands of identical chunks
    between DMA events)."""

    #: Whether identical chunks are costed once (the equation-by-equation costing is
    #: the oracle: ``tests/tune/test_predict_speed.py`` compares the two).
    memo_chunks = True
    #: Whether DMAs started back to back with the same bytes and memory spaces are
    #: recorded as one run (``dma_runs.merge_run``: the replay runs them as one flow of
    #: as many DMAs, with the same times; ``tests/perf/test_dma_runs.py`` compares).
    batch_dmas = True

    def __init__(self, info: LaunchInfo, chip: ChipModel) -> None:
        self.info = info
        self.chip = chip
        self.events: dict[CoreId, list[tuple[Any, ...]]] = defaultdict(list)
        # per core, how often each equation (by id) ran since the core's last event: a
        # count per equation, not its costs added per run (an equation runs thousands of
        # times; its cost is looked up once per chunk); the totals over the launch in
        # ``_counts``, turned into the fields below when the launch ends
        self.pending: dict[CoreId, dict[int, int]] = defaultdict(dict)
        self._counts: dict[int, int] = defaultdict(int)
        self.by_primitive: dict[str, float] = defaultdict(float)
        self.by_unit: dict[str, float] = defaultdict(float)
        self.flops = 0.0
        self.vector_flops = 0.0
        self.transcendentals = 0.0
        self.cores: tuple[CoreId, ...] = ()
        self.finished = False
        self.error: str | None = None  # "Type: first line" of a failed launch
        self._costs: dict[int, tuple[Any, Cost, bool]] = {}
        # per core, the dependent chain of the current compute chunk
        self._chunks: dict[CoreId, Chunk] = {}
        self._chained = bool(chip.dependent_op_seconds)
        # per equation (by id; the equation held): what ``chain_operands`` answers
        self._operands: dict[int, tuple[Any, ...]] = {}
        # per call equation (by id; held): its straight-line body, or None
        self._bodies: dict[int, tuple[Any, Any]] = {}
        # per conditional (by id; held): what it costs the chain (``conditional_cost``)
        self._conds: dict[int, tuple[Any, float, frozenset[int] | None]] = {}
        # per core, the equations told since its last event, not yet costed (``_settle``)
        self._told: dict[CoreId, list[Any]] = {}
        # per run of equations that started a chunk (by their ids; the equations held):
        # the counts and chain it left (read only)
        self._chunk_memo: dict[int | tuple[int, ...], Run] = {}
        # per body told by ``compute_run`` (by id; held): its equations' memo key
        self._body_keys: dict[int, tuple[tuple[Any, ...], tuple[int, ...]]] = {}
        #: ("in", name) / ("out", name) of the operands XLA placed in VMEM: their block
        #: copies are VMEM -> VMEM (``fidelity.xla_placement``; set by the timeline)
        self.local_operands: frozenset[tuple[str, str]] = frozenset()
        #: ("in", name) / ("out", name) of the operands whose blocks are pieces of their
        #: arrays (``BlockSpecInfo.strided``: each copy costs the DMA engine more)
        kernel = info.kernel
        self._strided = frozenset() if kernel is None else frozenset(
            [("in", o.name) for o in kernel.inputs if not o.in_hbm and o.strided]
            + [("out", o.name) for o in kernel.outputs if not o.in_hbm and o.strided])
        # Called once with this recorder when the launch ended (finished or failed): the
        # timeline then keeps what it needs and nothing holds the events any more.
        self.on_done: Callable[[TimelineRecorder], None] | None = None

    def _push(self, core: CoreId, event: tuple[Any, ...]) -> None:
        # The TensorCore is VLIW: MXU, vector ALU, EUP and vector load/store slots issue
        # in parallel, so a compute chunk (the equations between two events) takes as
        # long as its busiest unit (an optimistic, perfectly overlapped schedule).
        told = self._told.pop(core, None)
        entry = None
        if told:
            ran, chunk, entry = self._costed(core, told)
        else:
            ran, chunk = self.pending.pop(core, None), self._chunks.pop(core, None)
        if entry is not None and entry.seconds is not None:  # a chunk pushed before
            entry.repeats += 1  # (its counts: ``_count_repeats``)
            dt = entry.seconds
        else:
            dt = 0.0
            if ran:
                units: dict[str, float] = defaultdict(float)
                costs, counts = self._costs, self._counts
                for key, n in ran.items():
                    cost = costs[key][1]
                    units[cost.unit] += cost.seconds * n
                    counts[key] += n
                dt = max(units.values())
            # ... or as long as its chain of dependent results, where that is longer (a
            # recurrence of one row per loop step waits on latencies, not throughput)
            if chunk is not None:
                dt = max(dt, chunk.settled_end())
            if entry is not None:
                entry.seconds = dt
        events = self.events[core]
        if dt:
            events.append(("c", dt))
        events.append(event)

    # -- the interpreter's events ----------------------------------------------------
    def compute(self, core: CoreId, op: Any) -> None:
        told = self._told.get(core)
        if told is None:
            self._told[core] = [op]
            return
        told.append(op)
        if len(told) >= _RUN_LIMIT:
            self._settle(core)

    def _costed(self, core: CoreId, told: list[Any],
                ) -> tuple[Any, Chunk | None, Run | None]:
        """The counts and chain ``core`` is left with after the equations ``told``,
        taken from ``pending`` and ``_chunks`` (read only: from the memo when the run
        started a chunk and was costed before), and the run's memo entry (None: not a
        run that starts a chunk)."""
        key = None
        if self.memo_chunks and not self.pending.get(core) and core not in self._chunks:
            # (one equation, a DMA's start or wait mostly: its id, no tuple to hash)
            key = (id(told[0]) if len(told) == 1 else self._body_key(told.body)
                   if type(told) is _Told and len(told) == len(told.body)
                   else tuple(map(id, told)))
            hit = self._chunk_memo.get(key)
            if hit is not None:  # (its equations held: their ids are theirs)
                return hit.counts, hit.chain, hit
        tell = self._tell
        for op in told:
            tell(core, op)
        ran, chunk = self.pending.pop(core, None), self._chunks.pop(core, None)
        entry = None
        if key is not None:
            if len(self._chunk_memo) >= _CHUNK_LIMIT:
                self._count_repeats()
                self._chunk_memo.clear()
            entry = self._chunk_memo[key] = Run(tuple(told), ran, chunk)
        return ran, chunk, entry

    def _body_key(self, body: tuple[Any, ...]) -> tuple[int, ...]:
        """``tuple(map(id, body))``, once per body."""
        known = self._body_keys.get(id(body))
        if known is None or known[0] is not body:
            if len(self._body_keys) >= _CHUNK_LIMIT:
                self._body_keys.clear()
            known = self._body_keys[id(body)] = (body, tuple(map(id, body)))
        return known[1]

    def _count_repeats(self) -> None:
        """Add the counts of the chunks pushed again from the memo (each chunk's first
        push counted its equations, in the order they came: the totals' order)."""
        counts = self._counts
        for entry in self._chunk_memo.values():
            if entry.repeats and entry.counts:
                for key, n in entry.counts.items():
                    counts[key] += n * entry.repeats
            entry.repeats = 0

    def _settle(self, core: CoreId) -> None:
        """Cost the equations told since ``core``'s last event into ``pending`` and
        ``_chunks`` (the chunk goes on)."""
        told = self._told.pop(core, None)
        if not told:
            return
        ran, chunk, _ = self._costed(core, told)
        if ran is not None:
            self.pending[core] = dict(ran)
        if chunk is not None:
            self._chunks[core] = chunk.copy()

    def _tell(self, core: CoreId, op: Any) -> None:
        """One equation's cost into ``core``'s pending counts and its chain."""
        ran = self.pending[core]
        key = id(op)
        n = ran.get(key)
        if n is not None:
            ran[key] = n + 1
            known = self._costs[key]
            if known[2]:
                self._on_chain(core, op, known[1])
            return
        hit = self._costs.get(key)
        if hit is None or hit[0] is not op:
            # (holds op: its id stays unique); on the chain only an equation with an
            # array among its operands or results (scalar index arithmetic runs ahead
            # on the scalar unit: most of a page-gather loop's equations)
            hit = (op, equation_cost(op, self.chip),
                   self._chained and (_has_array(op) or op.primitive is _COND))
            self._costs[key] = hit
        if hit[2]:
            self._on_chain(core, op, hit[1])
        if hit[1].seconds:
            ran[key] = 1

    def compute_run(self, core: CoreId, ops: tuple[Any, ...]) -> None:
        """``compute(core, op)`` for each of ``ops`` in order (a grid step's body told
        again: ``run/body_memo.py``): a run that starts a chunk is costed once
        (``_costed``)."""
        told = self._told.get(core)
        if told is None:
            told = self._told[core] = _Told(ops)
            told.body = ops
        else:
            told.extend(ops)
        if len(self._told[core]) >= _RUN_LIMIT:
            self._settle(core)

    def _on_chain(self, core: CoreId, op: Any, cost: Cost) -> None:
        """The equation's place on the chunk's dataflow: each value has the time its
        first vreg is ready and the time all of it is. A vector op streams (its first
        vreg one latency after its operands' first, all of it no sooner than its own
        throughput allows); a dot waits for its weights and its first row block, queues
        for the MXU and gives its rows block by block after its latency; a column spread
        over the lanes waits for the cross-lane unit. An operand made outside the chunk
        (a loop's carry) is ready at the chain's current end, a ref at its last store on
        the chain; a loop's next iteration issues after the last one's last op did,
        plus the chip's per-iteration overhead."""
        st = self._chunks.get(core)
        if st is None:
            st = self._chunks[core] = Chunk()
        if st.predicated is not None:
            # the equation after a predicated conditional: in its DMA branch (taken: a
            # branch's cost) or not (untaken: its DMA starts' issue all the same)
            ids, untaken = st.predicated
            st.predicated = None
            st.block_end(self.chip.branch_seconds if id(op) in ids else untaken)
        if op.primitive is _COND and self.chip.branch_seconds:
            # a basic block ends: what follows issues after everything before it did,
            # its busiest unit's work included (r9/step-forms: two pl.when a grid step
            # cost 14 ns on a v5e); a predicated one's cost waits for the next equation
            cond = self._conds.get(id(op))
            if cond is None or cond[0] is not op:
                cond = self._conds[id(op)] = (op, *conditional_cost(op, self.chip))
            if cond[2] is None:
                st.block_end(cond[1])
            else:
                st.predicated = (cond[2], cond[1])
            return
        key = id(op)
        if key in st.seen:
            if st.anchor is None:
                st.anchor = key
            if st.anchor == key:
                # the next iteration's first bundle issues after the last one's last
                # (stores and long ops still in flight; a value it needs, it waits for)
                st.start = st.issued + self.chip.loop_iteration_seconds
        else:
            st.seen.add(key)
        body = self._body(op)
        if body is not None:
            self._place_call(st, op, body)
        else:
            self._place(st, op, cost)

    def _body(self, op: Any) -> Any:
        """``op``'s straight-line call body (``chain.straight_body``), found once per
        call equation."""
        if op.primitive not in CALLS:
            return None
        hit = self._bodies.get(id(op))
        if hit is None or hit[0] is not op:
            hit = self._bodies[id(op)] = (op, straight_body(op))
        return hit[1]

    def _place_call(self, st: Chunk, op: Any, jaxpr: Any) -> None:
        """A straight-line call's body placed from the call's operands: its values ready
        when its equations' are (each equation marked off the chain when told itself)."""
        ready, chain = st.ready, st.end
        for outer, inner in zip(op.invars, jaxpr.invars):
            if type(outer).__name__ != "Literal":
                ready[inner] = ready.get(outer, (chain, chain))
        for c in jaxpr.constvars:
            ready[c] = (st.start, st.start)
        costs = self._costs
        for eqn in jaxpr.eqns:
            hit = costs.get(id(eqn))
            if hit is None or hit[0] is not eqn:
                hit = costs[id(eqn)] = (eqn, equation_cost(eqn, self.chip), False)
            elif hit[2]:
                costs[id(eqn)] = (eqn, hit[1], False)
            sub = self._body(eqn)
            if sub is not None:
                self._place_call(st, eqn, sub)
            elif _has_array(eqn):
                self._place(st, eqn, hit[1])
        for outer, inner in zip(op.outvars, jaxpr.outvars):
            ready[outer] = (ready.get(inner, (st.start, st.start))
                            if type(inner).__name__ != "Literal" else (st.start, st.start))

    def _place(self, st: Chunk, op: Any, cost: Cost) -> None:
        """One equation's place on the chunk's dataflow (``Chunk.place``)."""
        plan = self._operands.get(id(op))
        if plan is None or plan[0] is not op:
            plan = self._operands[id(op)] = (op, *chain_operands(op))
        st.place(op, cost, plan[1:], self.chip.xlu_latency_seconds)

    def _totals(self) -> None:
        """The launch's costs by primitive and unit, its flops and transcendentals,
        from how often each equation ran (also those after a failed launch's last
        event)."""
        for core in list(self._told):  # (a failed launch's last equations)
            self._settle(core)
        self._count_repeats()
        for ran in self.pending.values():
            for key, n in ran.items():
                self._counts[key] += n
        for key, n in self._counts.items():
            op, cost, _ = self._costs[key]
            self.by_primitive[str(op.primitive)] += cost.seconds * n
            self.by_unit[cost.unit] += cost.seconds * n
            self.flops += cost.flops * n
            self.vector_flops += cost.vector_flops * n
            self.transcendentals += cost.transcendentals * n
        self._counts.clear()

    def grid_step_begin(self, core: CoreId, step: int, grid_point: tuple[int, ...]) -> None:
        self._push(core, ("step", step, grid_point))

    def grid_step_end(self, core: CoreId, step: int, grid_point: tuple[int, ...]) -> None:
        self._push(core, ("body_end", step))

    def block_copy(self, copy: BlockCopy) -> None:
        kind = "in" if copy.direction == "in" else "out"
        key = (kind, copy.operand)
        self._push(copy.core, (kind, copy.step, copy.nbytes, copy.buffer_count, copy.operand,
                               key in self.local_operands, key in self._strided))

    # -- the simulator's events ------------------------------------------------------
    def dma_start(self, dma: DmaEvent) -> None:
        self._push(dma.core, ("dma", dma))
        if self.batch_dmas:
            merge_run(self.events[dma.core])

    def semaphore_signal(self, core: CoreId, sem: SemaphoreInfo, inc: int) -> None:
        self._push(core, ("sig", sem.key, inc))

    def semaphore_wait_begin(self, core: CoreId, sem: SemaphoreInfo, value: int) -> None:
        self._push(core, ("wait", sem.key, value, sem.label, sem.kind is SemaphoreKind.DMA))

    def barrier_begin(self, core: CoreId) -> None:
        self._push(core, ("bar",))

    def allocate(self, buf: BufferRef, nbytes: int, core: CoreId) -> None:
        if buf.space is MemorySpace.VMEM:
            self._push(core, ("mem", nbytes))

    def free(self, buf: BufferRef, nbytes: int, core: CoreId) -> None:
        if buf.space is MemorySpace.VMEM:
            self._push(core, ("mem", -nbytes))

    def run_begin(self, cores: tuple[CoreId, ...]) -> None:
        self.cores = tuple(sorted(cores))

    def run_end(self, cores: tuple[CoreId, ...]) -> None:
        for core in list(dict.fromkeys([*self.pending, *self._told])):
            self._push(core, ("c", 0.0))
        self.finished = True
        self._done()

    def run_failed(self, cores: tuple[CoreId, ...], error: BaseException) -> None:
        lines = str(error).splitlines()
        self.error = f"{type(error).__name__}: {lines[0] if lines else ''}"
        self._done()

    def _done(self) -> None:
        self._totals()
        done, self.on_done = self.on_done, None
        self._chunk_memo.clear()
        if done is not None:
            done(self)
            # (the timeline's record has what it needs: the events, a DMA's and a site's
            # objects each, are freed now, not by the collection that frees the launch)
            self.events = defaultdict(list)
