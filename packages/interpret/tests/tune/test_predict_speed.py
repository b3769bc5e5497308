"""Issue 40, item 4: ``predict`` walks only what can change its answer.

The fast path (the kernel traced and lowered once; no uninitialised-value tracking; grid
steps whose body cannot differ from an earlier one's told to the timeline instead of
walked: ``run/body_memo.py``) must predict what the full walk predicts, on jax's shipped
kernels and on the guide's matmul. Speed is asserted as work avoided (traces, bodies
walked), never as wall time; ``benchmarks/predict_speed.py`` measures the seconds.
"""

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _launch_harness import matmul_kernel
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi
from palladium.interpret.run import body_memo, grid_loop

recorder_module = importlib.import_module("palladium.interpret.perf.recorder")

predict_module = importlib.import_module("palladium.interpret.tune.predict")
evaluator_module = importlib.import_module("palladium.interpret.eval.evaluator")

S = jax.ShapeDtypeStruct
F32, BF16 = jnp.float32, jnp.bfloat16


def guide_matmul(x, y, *, bm, bk, bn):
    """The Pallas TPU matmul guide's kernel: an f32 accumulator zeroed at k == 0 and
    written out at the last k (the body asks only for program_id(2))."""
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        matmul_kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")))(x, y)


def _flash(causal):
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    sizes = fa.BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1)
    return (functools.partial(fa.flash_attention, causal=causal, block_sizes=sizes),
            tuple(S((1, 2, 512, 128), F32) for _ in range(3)))


def _splash():
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    def fn(q, k, v):
        mask = sm.MultiHeadMask([sm.CausalMask((512, 512)) for _ in range(2)])
        sizes = sk.BlockSizes(block_q=256, block_kv=256, block_kv_compute=256)
        return sk.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1)(q, k, v)

    return fn, tuple(S((2, 512, 128), F32) for _ in range(3))


def _paged():
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    rng = np.random.default_rng(1)
    lengths = jnp.asarray([37, 100], jnp.int32)
    indices = jnp.asarray(rng.permutation(16).reshape(2, 8), jnp.int32)
    return (functools.partial(paged_attention, pages_per_compute_block=4),
            (S((2, 2, 128), F32), S((2, 16, 16, 128), F32), S((2, 16, 16, 128), F32),
             lengths, indices))


def _ragged():
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

    rng = np.random.default_rng(0)
    q_lens, kv_lens = np.array([5, 1, 18]), np.array([40, 17, 90, 0])
    cu_q = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens), [q_lens.sum()]]), jnp.int32)
    pages = jnp.asarray(rng.permutation(64)[:32].reshape(4, 8), jnp.int32)
    return (functools.partial(rpa.ragged_paged_attention, num_kv_pages_per_block=4,
                              num_queries_per_block=8),
            (S((32, 8, 128), F32), S((64, 16, 4, 128), F32), jnp.asarray(kv_lens, jnp.int32),
             pages, cu_q, jnp.array([3], jnp.int32)))


def _gmm():
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    return (functools.partial(gmm, tiling=(128, 128, 128)),
            (S((256, 128), F32), S((4, 128, 128), F32),
             jnp.asarray([32, 96, 64, 64], jnp.int32)))


def _matmul():
    from jax.experimental.pallas.ops.tpu.matmul import matmul

    return (functools.partial(matmul, block_shape=(128, 128), block_k=128),
            (S((512, 512), BF16), S((512, 512), BF16)))


KERNELS = {
    "guide matmul": lambda: (functools.partial(guide_matmul, bm=128, bk=128, bn=128),
                             (S((512, 1024), BF16), S((1024, 256), BF16))),
    "jax matmul": _matmul,
    "flash": lambda: _flash(False),
    "flash causal": lambda: _flash(True),
    "splash causal": _splash,
    "paged attention": _paged,
    "ragged paged attention": _ragged,
    "gmm": _gmm,
}


def _full_walk(monkeypatch, fn, args):
    """The prediction as before the fast path: every body walked, shadows tracked."""
    with monkeypatch.context() as m:
        m.setattr(body_memo, "memo_allowed", lambda params: False)
        return pi.predict(fn, *args, compile_check="approximate", uninitialized_reads="on_use",
                          skip_unused_integer_ops=False)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(KERNELS))
def test_the_fast_path_predicts_what_the_full_walk_predicts(monkeypatch, name):
    fn, args = KERNELS[name]()
    fast = pi.predict(fn, *args, compile_check="approximate")
    full = _full_walk(monkeypatch, fn, args)
    assert fast.compiles and full.compiles
    assert fast.predicted_seconds == pytest.approx(full.predicted_seconds, rel=1e-9)
    assert fast.grid_steps == full.grid_steps
    assert fast.dma_bytes == full.dma_bytes
    assert fast.flops == pytest.approx(full.flops, rel=1e-9)
    assert fast.compute_seconds == pytest.approx(full.compute_seconds, rel=1e-9)
    assert fast.bound == full.bound and fast.compute_unit == full.compute_unit
    assert fast.launches[0].by_primitive == pytest.approx(full.launches[0].by_primitive)


class _Counted(body_memo.BodyMemo):
    made: list["_Counted"] = []

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        _Counted.made.append(self)


@pytest.fixture
def counted(monkeypatch):
    _Counted.made = []
    monkeypatch.setattr(grid_loop, "BodyMemo", _Counted)
    return _Counted.made


@pytest.mark.timeout(120)
def test_the_guides_matmul_walks_one_body_per_k_step(counted):
    # grid (4, 2, 8): 64 steps; the body asks only for program_id(2): 8 bodies differ
    fn, args = KERNELS["guide matmul"]()
    p = pi.predict(fn, *args, compile_check="approximate")
    assert p.grid_steps == 64
    [memo] = counted
    assert memo.axes == (2,)
    assert (memo.walked, memo.replayed) == (8, 56)


@pytest.mark.timeout(120)
def test_a_body_with_dmas_is_walked_at_every_step(counted):
    fn, args = KERNELS["paged attention"]()
    p = pi.predict(fn, *args, compile_check="approximate")
    assert counted and all(m.axes is None for m in counted)
    assert sum(m.walked for m in counted) == p.grid_steps
    assert sum(m.replayed for m in counted) == 0


@pytest.mark.timeout(120)
def test_a_body_that_reads_integer_memory_is_walked_at_every_step(counted):
    def kernel(n_ref, x_ref, o_ref):  # a scalar-prefetch value steers the body
        @pl.when(n_ref[pl.program_id(0)] > 2)
        def _():
            o_ref[...] = x_ref[...] * 2.0

    def fn(n, x):
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(4,),
            in_specs=[pl.BlockSpec((8, 128), lambda i, n: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, n: (i, 0)))
        return pl.pallas_call(kernel, grid_spec=spec,
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(n, x)

    pi.predict(fn, jnp.array([3, 1, 5, 0], jnp.int32), S((32, 128), F32),
               compile_check="approximate")
    [memo] = counted
    assert memo.axes is None and memo.walked == 4


@pytest.mark.timeout(120)
def test_a_run_that_computes_values_walks_every_body(counted):
    # (not predict: floating-point values are computed, so every step is walked)
    x, y = (jnp.asarray(np.random.default_rng(0).standard_normal(s), BF16)
            for s in ((256, 512), (512, 256)))
    with pi.force_tpu_interpret_mode(pi.InterpretParams(skip_floating_point_ops=True)):
        guide_matmul(x, y, bm=128, bk=128, bn=128)
    with pi.force_tpu_interpret_mode(pi.InterpretParams()):
        out = guide_matmul(x, y, bm=128, bk=128, bn=128)
    np.testing.assert_allclose(np.float32(out), np.float32(x) @ np.float32(y), rtol=2e-2,
                               atol=0.5)
    assert [m.axes for m in counted] == [None, None]
    assert [(m.walked, m.replayed) for m in counted] == [(16, 0), (16, 0)]


@pytest.mark.timeout(120)
def test_predict_traces_the_kernel_once_and_tracks_no_uninitialised_values(monkeypatch):
    calls = []
    fn, args = KERNELS["guide matmul"]()

    def counted_fn(*a):
        calls.append(1)
        return fn(*a)

    def no_shadows(*a, **kw):
        raise AssertionError("predict tracked uninitialised values")

    monkeypatch.setattr(evaluator_module, "run_shadowed", no_shadows)
    p = pi.predict(counted_fn, *args, compile_check="approximate")
    assert p.compiles and len(calls) == 1


def _skipping_steps():
    """Odd grid steps skip their body (``pl.when``): a DMA and a wait on even steps
    only, the chunks of the two kinds of step differ."""
    def kernel(x_hbm, o_ref, buf, sem):
        @pl.when(pl.program_id(0) % 2 == 0)
        def _():
            copy = pltpu.make_async_copy(x_hbm.at[pl.ds(pl.program_id(0) * 8, 8)], buf, sem)
            copy.start()
            copy.wait()
            o_ref[...] = buf[...] * 2.0

    def fn(x):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((64, 128), F32), grid=(8,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            scratch_shapes=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA])(x)

    return fn, (S((64, 128), F32),)


def _uneven_paged():
    """Paged attention, scalar-prefetched page table, lengths far apart (one sequence
    ends within its first compute block)."""
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    rng = np.random.default_rng(3)
    lengths = jnp.asarray([5, 128, 61], jnp.int32)
    indices = jnp.asarray(rng.permutation(24).reshape(3, 8), jnp.int32)
    return (functools.partial(paged_attention, pages_per_compute_block=2),
            (S((3, 2, 128), F32), S((2, 24, 16, 128), F32), S((2, 24, 16, 128), F32),
             lengths, indices))


CHUNKED = {
    "paged attention, uneven lengths": _uneven_paged,
    "pl.when-skipped steps": _skipping_steps,
    "revisited output block (guide matmul)": KERNELS["guide matmul"],
    "flash causal": KERNELS["flash causal"],
}


def _numbers(p):
    r = p.launches[0]
    return (p.predicted_seconds, p.compute_seconds, p.exposed_dma_seconds,
            p.overhead_seconds, p.flops, p.dma_bytes, p.bound, p.compute_unit,
            dict(r.by_primitive), dict(r.by_unit), r.vector_flops, r.transcendentals,
            [(s.track, s.name, s.cat, s.start, s.end) for s in r.spans])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(CHUNKED))
def test_chunks_costed_once_predict_what_costing_each_equation_predicts(monkeypatch, name):
    # the recorder's memo of chunks (a run of equations between two events, from a
    # fresh chain) against costing every equation told; and runs settled as they go
    # (a run longer than _RUN_LIMIT: here 3 equations)
    fn, args = CHUNKED[name]()
    memo = pi.predict(fn, *args, compile_check="approximate")
    with monkeypatch.context() as m:
        m.setattr(recorder_module.TimelineRecorder, "memo_chunks", False)
        each = pi.predict(fn, *args, compile_check="approximate")
    with monkeypatch.context() as m:
        m.setattr(recorder_module, "_RUN_LIMIT", 3)
        settled = pi.predict(fn, *args, compile_check="approximate")
    assert memo.compiles
    assert _numbers(memo) == _numbers(each) == _numbers(settled)  # (exactly: same floats)


@pytest.mark.timeout(120)
def test_the_recorder_costs_each_kind_of_chunk_once(monkeypatch):
    told = []
    tell = recorder_module.TimelineRecorder._tell
    monkeypatch.setattr(recorder_module.TimelineRecorder, "_tell",
                        lambda self, core, op: told.append(op) or tell(self, core, op))
    fn, args = _uneven_paged()
    pi.predict(fn, *args, compile_check="approximate")
    memoised = len(told)
    told.clear()
    monkeypatch.setattr(recorder_module.TimelineRecorder, "memo_chunks", False)
    pi.predict(fn, *args, compile_check="approximate")
    assert 0 < memoised < len(told) / 3  # (556 of 1,759 equations costed)


@pytest.mark.timeout(120)
def test_a_failed_launch_counts_its_chunks_costed_once_as_each_equation(monkeypatch):
    # a leak at the end: the launch fails after its steps' chunks (repeats of one)
    # and the equations after its last event; its totals still count every one
    def kernel(x_hbm, o_ref, buf, sem):
        o_ref[...] = buf[...] * 2.0 + 1.0

        @pl.when(pl.program_id(0) == 3)
        def _():
            pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sem).start()  # never waited
            o_ref[...] = jnp.exp(buf[...])

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((32, 128), F32), grid=(4,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        scratch_shapes=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA],
        interpret=pi.InterpretParams(uninitialized_reads="off"))

    def failed(memo):
        with monkeypatch.context() as m:
            m.setattr(recorder_module.TimelineRecorder, "memo_chunks", memo)
            with pi.timeline(keep_failed=True) as tl, pytest.raises(pi.SemaphoreLeakError), \
                    pi.errors_as_raised():
                jax.block_until_ready(call(jnp.ones((32, 128), F32)))
        (record,) = tl.launches
        assert record.failed
        return record.by_primitive, record.flops, record.vector_flops, record.transcendentals

    memo, each = failed(True), failed(False)
    assert memo == each and memo[0]["mul"] > 0 and memo[0]["exp"] > 0
