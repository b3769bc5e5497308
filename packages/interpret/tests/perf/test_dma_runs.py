"""Issue 40, item 4: DMAs started back to back are recorded as one run and replayed as one
flow (``TimelineRecorder.batch_dmas``), and the replay's shortcuts (engine lanes from heaps,
a page's plan from the first page's) change no number.

Every prediction here is compared with the one made DMA by DMA: the same floats (==, not
approximately) and the same spans, on kernels where runs form (paged attention's pages;
same-sized DMAs on different semaphores while another DMA flows) and where they must stop
(DMAs of differing sizes, a wait on another semaphore between starts). Speed is measured
by ``benchmarks/predict_speed.py``, never here.
"""

import functools
import importlib
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi
from palladium.interpret.eval import rules_dma
from palladium.interpret.perf.model import chip_model
from palladium.shared_memory.regions import resolve

recorder_module = importlib.import_module("palladium.interpret.perf.recorder")
record_module = importlib.import_module("palladium.interpret.perf.record")
replay_module = importlib.import_module("palladium.interpret.perf.replay")
dma_runs = importlib.import_module("palladium.interpret.perf.dma_runs")

S = jax.ShapeDtypeStruct
F32 = jnp.float32


def _uneven_paged():
    """Paged attention: a scalar-prefetched page table, lengths far apart."""
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    rng = np.random.default_rng(5)
    lengths = jnp.asarray([5, 128, 61, 97], jnp.int32)
    indices = jnp.asarray(rng.permutation(32).reshape(4, 8), jnp.int32)
    return (functools.partial(paged_attention, pages_per_compute_block=4),
            (S((4, 2, 128), F32), S((2, 32, 16, 128), F32), S((2, 32, 16, 128), F32),
             lengths, indices))


def _call(kernel, scratch, rows=64, parallel=False):
    def fn(x):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((64 if parallel else 32, 128), F32),
            grid=(2,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((32, 128), lambda i: (i, 0) if parallel else (0, 0)),
            scratch_shapes=scratch,
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel" if parallel else "arbitrary",)))(x)

    return fn, (S((rows, 128), F32),)


def _differing_sizes(parallel=False):
    """Five DMAs on one semaphore, started back to back: 8, 8, 16, 8 and 8 rows."""
    parts = ((0, 8), (8, 8), (16, 16), (32, 8), (40, 8))

    def kernel(x_hbm, o_ref, buf, sem):
        copies = [pltpu.make_async_copy(x_hbm.at[pl.ds(r, n)], buf.at[pl.ds(r, n)], sem)
                  for r, n in parts]
        for c in copies:
            c.start()
        for c in copies:
            c.wait()
        o_ref[...] = buf[pl.ds(0, 32), :] * 2.0

    return _call(kernel, [pltpu.VMEM((64, 128), F32), pltpu.SemaphoreType.DMA],
                 parallel=parallel)


def _interrupted():
    """Two same-sized DMAs, a wait on another semaphore's DMA, two more."""
    def kernel(x_hbm, o_ref, buf, other, sem_a, sem_b):
        b = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 32)], other, sem_b)
        b.start()
        a = [pltpu.make_async_copy(x_hbm.at[pl.ds(8 * i, 8)], buf.at[pl.ds(8 * i, 8)], sem_a)
             for i in range(4)]
        a[0].start()
        a[1].start()
        b.wait()
        a[2].start()
        a[3].start()
        for c in a:
            c.wait()
        o_ref[...] = buf[...] + other[...]

    return _call(kernel, [pltpu.VMEM((32, 128), F32), pltpu.VMEM((32, 128), F32),
                          pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])


def _two_semaphores():
    """A large DMA in flight while four same-sized ones, on two semaphores, start back to
    back; their waits in another order."""
    def kernel(x_hbm, o_ref, buf, big, sems, sem_big):
        g = pltpu.make_async_copy(x_hbm, big, sem_big)
        g.start()
        c = [pltpu.make_async_copy(x_hbm.at[pl.ds(8 * i, 8)], buf.at[pl.ds(8 * i, 8)],
                                   sems.at[i % 2]) for i in range(4)]
        for x in c:
            x.start()
        for i in (0, 2, 1, 3):
            c[i].wait()
        g.wait()
        o_ref[...] = buf[...] + big[pl.ds(0, 32), :]

    return _call(kernel, [pltpu.VMEM((32, 128), F32), pltpu.VMEM((256, 128), F32),
                          pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA],
                 rows=256)


def _ring():
    """A ring of DMAs with compute between (a store between each start): no run."""
    def kernel(x_hbm, o_ref, buf, sem):
        for i in range(4):
            pltpu.make_async_copy(x_hbm.at[pl.ds(8 * i, 8)], buf.at[pl.ds(8 * i, 8)],
                                  sem).start()
            o_ref[pl.ds(8 * i, 8), :] = jnp.full((8, 128), 1.0, F32)
        for i in range(4):
            pltpu.make_async_copy(x_hbm.at[pl.ds(8 * i, 8)], buf.at[pl.ds(8 * i, 8)],
                                  sem).wait()
        o_ref[...] += buf[...]

    return _call(kernel, [pltpu.VMEM((32, 128), F32), pltpu.SemaphoreType.DMA])


#: name -> (make, the DMA events of the first grid step as recorded: "dma" or the size
#: of a run)
KERNELS = {
    "paged attention, uneven lengths": (_uneven_paged, None),
    "DMAs of differing sizes": (_differing_sizes, [2, "dma", 2]),
    "a wait on another semaphore between starts": (_interrupted, ["dma", 2, 2]),
    "two semaphores, a large DMA in flight": (_two_semaphores, ["dma", 4]),
    "a store between starts": (_ring, None),
    # (two cores start DMAs in turn: a run holds consecutive DMA numbers only)
    "two cores": (lambda: _differing_sizes(parallel=True), None),
}


@pytest.fixture
def recorded(monkeypatch):
    """The DMA events each replay was given: per launch, "dma" or a run's size."""
    seen = []

    class Recorded(replay_module.Replay):
        def __init__(self, events, *a, **kw):
            seen.append([ev[0] if ev[0] == "dma" else len(ev[1])
                         for evs in events.values() for ev in evs if ev[0] in ("dma", "dmas")])
            super().__init__(events, *a, **kw)

    monkeypatch.setattr(record_module, "Replay", Recorded)
    return seen


def _numbers(p):
    return (p.predicted_seconds, p.compute_seconds, p.exposed_dma_seconds,
            p.overhead_seconds, p.dma_bytes, p.bound,
            [(r.predicted_seconds, r.dma_seconds, r.dma_bytes, r.critical_core,
              r.busy_seconds("hbm"), r.vmem_peak_bytes,
              {c: (st.end, st.compute, st.overhead, dict(st.exposed), st.steps)
               for c, st in r.core_stats.items()},
              [(s.track, s.name, s.cat, s.start, s.end, s.args) for s in r.spans])
             for r in p.launches])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(KERNELS))
def test_dmas_recorded_as_runs_predict_what_dma_by_dma_predicts(monkeypatch, recorded, name):
    make, first_step = KERNELS[name]
    fn, args = make()
    params = {"num_cores_or_threads": 2} if name == "two cores" else {}
    runs = pi.predict(fn, *args, compile_check="approximate", **params)
    batched = recorded.pop()
    with monkeypatch.context() as m:
        m.setattr(recorder_module.TimelineRecorder, "batch_dmas", False)
        each = pi.predict(fn, *args, compile_check="approximate", **params)
    assert runs.compiles and runs.predicted_seconds > 0
    assert _numbers(runs) == _numbers(each)  # (exactly: the same floats, spans, lanes)
    assert all(kind == "dma" for kind in recorded.pop())
    if first_step is not None:
        assert batched[:len(first_step)] == first_step
    if name == "a store between starts":
        assert all(kind == "dma" for kind in batched)
    if name == "two cores":
        assert len(runs.launches[0].core_stats) == 2 and 2 in batched
    if name.startswith("paged"):  # runs of a compute block's pages (4), k's and v's
        assert 4 in batched or 8 in batched


def _lanes_scanning(dmas):
    """The engine lanes as first written: each DMA (by start, number) on the lowest lane
    whose last DMA ended by its start."""
    lanes: dict[int, list[float]] = {}
    out = []
    for d in sorted(dmas, key=lambda d: (d.start, d.id)):
        free = lanes.setdefault(d.device, [])
        lane = next((i for i, end in enumerate(free) if end <= d.start), len(free))
        if lane == len(free):
            free.append(0.0)
        free[lane] = d.end
        out.append(((d.device, f"DMA engine {lane}"), d.name, "dma", d.start, d.end, d.args))
    return out


@pytest.mark.timeout(60)
def test_engine_lanes_from_heaps_are_the_lanes_of_a_scan():
    rng = random.Random(0)
    replay = replay_module.Replay({}, ((0, 0),), chip_model("v5e"), 1)
    for i in range(2000):
        start = rng.choice([0.0, 1.0, 2.0, rng.random() * 50])  # (ties: by number)
        end = start + rng.choice([0.0, 0.5, 1.0, rng.random() * 5])
        d = replay_module._Dma(i, f"d{i}", rng.randrange(2), ("hbm", 0), 8, [], start,
                               {"i": i})
        d.end = end
        replay.dmas.append(d)
    expected = _lanes_scanning(replay.dmas)
    dma_runs.assign_lanes(replay.dmas, replay.raw_spans.append)
    assert replay.raw_spans == expected


@pytest.mark.timeout(60)
def test_a_pages_plan_from_the_first_pages_is_the_plan_resolve_makes():
    # a page (head h, page p) of a (4, 16, 16, 128) buffer: the index dims vary with the
    # operands at positions 0 and 1; pages out of bounds (and negative) are resolved
    logical = bound = (4, 16, 16, 128)

    class Sim:
        def plan(self, buffer, region):
            return resolve(region, logical, bound)

    dims = ((0, ((0, 1),), None, 1), (0, ((1, 1),), None, 1), slice(0, 16, None),
            slice(0, 128, None))
    paged: dict = {}
    keys = [(h, p) for h in (0, 3, 1, 4, -1) for p in (5, 0, 15, 16, -2, 7)]
    for key in keys:
        plan = rules_dma._side_plan(Sim(), None, dims, key, paged, "structure")
        want = resolve(rules_dma._placed_region(dims, key), logical, bound)
        assert [getattr(plan, f) for f in type(plan).__slots__] == \
            [getattr(want, f) for f in type(want).__slots__], key
    assert paged["structure"][0] is not None  # (the first page's plan was kept)


def _scalar_chain_call():
    """A body whose scalar index arithmetic (a flat run of ten equations, a segment run
    one by one under the timeline) reads out of bounds at the last grid step."""
    def kernel(n_ref, x_ref, o_ref):
        a = n_ref[pl.program_id(0)]
        b = a * 3 + 1
        c = b * 5 - 2
        e = c + a * 7 - b + 3
        o_ref[...] = x_ref[...] + n_ref[e].astype(F32)

    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i, n: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, n: (i, 0)))
    call = pl.pallas_call(kernel, grid_spec=spec,
                          out_shape=jax.ShapeDtypeStruct((32, 128), F32),
                          interpret=pi.InterpretParams(uninitialized_reads="off"))
    n = jnp.zeros((64,), jnp.int32).at[3].set(9)
    return call, (n, jnp.ones((32, 128), F32))


@pytest.mark.timeout(120)
def test_a_flat_segment_told_as_one_run_counts_what_one_by_one_counts(monkeypatch):
    # the evaluator tells a flat segment's equations after they ran, as one run
    # (run_program); a launch that fails inside one counts those up to the failing one
    evaluator_module = importlib.import_module("palladium.interpret.eval.evaluator")
    told_after = []
    run_after = evaluator_module.CoreEvaluator._run_told_after

    def counted(self, prog, args, tell):
        told_after.append(len(prog.eqns))
        try:
            return run_after(self, prog, args, tell)
        except Exception:
            told_after.append("raised")
            raise

    monkeypatch.setattr(evaluator_module.CoreEvaluator, "_run_told_after", counted)
    call, args = _scalar_chain_call()

    def failed(one_by_one):
        with monkeypatch.context() as m:
            if one_by_one:
                m.setattr(evaluator_module.CoreEvaluator, "run_program",
                          lambda self, prog, a: self._run(prog, [], a))
            with pi.timeline(keep_failed=True) as tl, pytest.raises(pi.PalladiumError), \
                    pi.errors_as_raised():
                jax.block_until_ready(call(*args))
        (record,) = tl.launches
        assert record.failed
        return (record.by_primitive, record.flops, record.vector_flops,
                [ev for ev in record.core_stats])

    runs = failed(False)
    assert "raised" in told_after and max(n for n in told_after if n != "raised") >= 8
    told_after.clear()
    assert failed(True) == runs and not told_after
    assert runs[0]["mul"] > 0
