"""The timeline's performance model, pinned by its structure (never by this machine's
speed): pipelining hides DMAs, big matmul blocks are compute-bound and small ones
overhead-bound, elementwise kernels stream at HBM bandwidth, predictions do not depend
on seeds, jit or skip_floating_point_ops, and the trace file has the promised shape."""

import json

import jax
import jax.numpy as jnp
import pytest
from _launch_harness import matmul_kernel
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi
from palladium.interpret import InterpretParams, LoggingMode
from palladium.interpret.perf import chip_model

V5E = chip_model("v5e")


def matmul(m, n, k, bm, bn, bk, *, dtype=jnp.bfloat16, buffers=None, **params):
    mode = {} if buffers is None else {"pipeline_mode": pl.Buffered(buffers)}
    call = pl.pallas_call(
        matmul_kernel, out_shape=jax.ShapeDtypeStruct((m, n), dtype), grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk), **mode),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j), **mode)],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=InterpretParams(chip="v5e", **params),
    )
    x = jnp.ones((m, k), dtype)
    y = jnp.ones((k, n), dtype)
    return lambda: call(x, y)


def record(fn):
    with pi.timeline() as tl:
        jax.block_until_ready(fn())
    (rec,) = tl.launches
    return rec


def elementwise(rows, block_rows, *, cols=1024, **params):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    spec = pl.BlockSpec((block_rows, cols), lambda i: (i, 0))
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((rows, cols), jnp.float32),
                          grid=(rows // block_rows,), in_specs=[spec, spec], out_specs=spec,
                          interpret=InterpretParams(chip="v5e", **params))
    x = jnp.ones((rows, cols), jnp.float32)
    return lambda: call(x, x)


@pytest.mark.timeout(120)
def test_double_buffering_hides_dma_and_approaches_the_roofline():
    shape = dict(m=1024, n=1024, k=2048, bm=256, bn=256, bk=512, skip_floating_point_ops=True)
    one, two = record(matmul(**shape, buffers=1)), record(matmul(**shape, buffers=2))
    assert two.exposed_dma_seconds < 0.5 * one.exposed_dma_seconds
    assert two.predicted_seconds < one.predicted_seconds
    steps = 4 * 4 * 4
    flops = 2 * 1024 * 1024 * 2048
    compute = flops / V5E.mxu_bf16_flops
    assert two.flops == flops
    dma = two.dma_bytes * V5E.hbm_byte_seconds("in")
    # (each step's blocks are fetched before the step before waits for its own, so two
    # steps' copies are in flight: when the copies are the bound, a step costs its bytes,
    # its overhead and the core's issue of its two copies; the latency is paid once)
    roofline = (max(compute, dma) + V5E.dma_latency("in")
                + steps * (V5E.step_overhead_s + 2 * V5E.block_copy_issue_s))
    assert max(compute, dma) < two.predicted_seconds
    assert abs(two.predicted_seconds - roofline) < 0.2 * roofline
    assert two.bound == "HBM"
    # one buffer: every copy is exposed, time ~ compute + DMA + overheads
    assert one.predicted_seconds > 0.9 * (compute + dma + steps * V5E.step_overhead_s)


def small_blocks(steps, n_in):
    """``n_in`` (128, 128) f32 inputs, a new block each every step, almost no compute and
    the output revisited (no copy out until the end): a pipeline bound by its copies."""
    def kernel(*refs):
        *ins, o_ref = refs
        acc = ins[0][pl.ds(0, 8), :]
        for r in ins[1:]:
            acc = acc + r[pl.ds(0, 8), :]
        o_ref[...] = acc

    spec = pl.BlockSpec((128, 128), lambda i: (i, 0))
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          grid=(steps,), in_specs=[spec] * n_in,
                          out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
                          interpret=InterpretParams(chip="v5e"))
    xs = [jnp.ones((128 * steps, 128), jnp.float32) for _ in range(n_in)]
    return lambda: call(*xs)


@pytest.mark.timeout(120)
def test_two_steps_of_small_block_copies_are_in_flight_at_once():
    # the next step's blocks are fetched before this step's are waited for (their
    # buffer held the step before's), so on the v5e a step of copies bound by their
    # latency takes about half of it (r4/copies: 230 ns for one 64 KiB block, where one
    # copy's latency and bytes are 437 ns)
    steps = 64
    rec = record(small_blocks(steps, 1))
    nbytes = 128 * 128 * 4
    copy = V5E.dma_latency("in") + nbytes * V5E.hbm_byte_seconds("in")
    per_step = rec.predicted_seconds / steps
    assert 0.5 * copy < per_step < 0.75 * copy
    dmas = {s.name: s for s in rec.spans if s.cat == "dma"}
    for k in range(2, steps - 1):  # step k + 1's copy starts before step k's has ended
        this, nxt = dmas[f"copy refs[0] block (step {k})"], dmas[f"copy refs[0] block (step {k + 1})"]
        assert nxt.start < this.end
    # four blocks a step: their bytes flow one step's after the other's, at the read rate
    four = record(small_blocks(steps, 4)).predicted_seconds / steps
    assert four > 4 * nbytes * V5E.hbm_byte_seconds("in")
    assert four < 4 * nbytes * V5E.hbm_byte_seconds("in") + copy / 2


@pytest.mark.timeout(120)
def test_large_blocks_use_the_mxu_small_blocks_pay_each_dots_fixed_cost():
    large = record(matmul(2048, 2048, 2048, 1024, 1024, 1024, skip_floating_point_ops=True))
    small = record(matmul(512, 512, 512, 128, 128, 128, skip_floating_point_ops=True))
    assert large.bound == "compute"
    assert large.mxu_utilisation > 0.75  # (the v5e's measured MXU rate and per-dot cost)
    # on the v5e a grid step costs 17 ns but a 128^3 dot's fixed cost (fill and drain,
    # 0.108 us) is 5x its flops' time (both measured): small blocks waste the MXU
    assert small.bound == "compute"
    assert small.mxu_utilisation < 0.2
    assert "bound               compute" in large.summary()
    # 1024^2 blocks: x, y (bf16) and out double-buffered + the f32 accumulator = 16 MiB,
    # the v5e's default scoped limit exactly
    assert large.vmem_peak_bytes == 3 * 2 * 2**21 + 2**22
    assert "VMEM peak           16.00 MiB (scoped limit 16.00 MiB, capacity 128.00 MiB)" in (
        large.summary())


@pytest.mark.timeout(120)
def test_elementwise_is_hbm_bound_at_bytes_over_bandwidth():
    rec = record(elementwise(4096, 512, skip_floating_point_ops=True))
    nbytes = 3 * 4096 * 1024 * 4
    assert rec.dma_bytes == nbytes
    assert rec.bound == "HBM"
    ideal = nbytes / V5E.hbm_bytes_per_second
    assert ideal < rec.predicted_seconds < 1.25 * ideal


@pytest.mark.timeout(120)
def test_prediction_is_the_same_eagerly_under_jit_and_without_float_ops():
    eager = record(elementwise(1024, 256))
    jitted = record(jax.jit(elementwise(1024, 256)))
    skipped = record(elementwise(1024, 256, skip_floating_point_ops=True))
    assert eager.predicted_seconds == jitted.predicted_seconds == skipped.predicted_seconds
    assert eager.summary() == skipped.summary()


@pytest.mark.timeout(120)
def test_identical_across_runs_and_seeds_on_two_cores():
    def run(seed):
        rec = record(matmul(512, 512, 512, 128, 128, 256, dtype=jnp.float32, random_seed=seed,
                            num_cores_or_threads=2, dma_order="random"))
        # (the seed permutes the parallel grid points, so step names differ; not times)
        return rec.predicted_seconds, [(s.track, s.cat, s.start, s.end) for s in rec.spans]

    first = run(0)
    assert all(run(seed) == first for seed in (0, 1, 2))
    tracks = {t for t, *_ in first[1]}
    assert {(0, "core 0"), (0, "core 1"), (0, "DMA engine 0")} <= tracks


def test_f32_precision_costs_passes():
    def cost(dtype, precision):
        def kernel(x_ref, o_ref):
            o_ref[...] = jnp.dot(x_ref[...], x_ref[...], precision=precision,
                                 preferred_element_type=jnp.float32)

        x = jnp.ones((256, 256), dtype)
        f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32),
                           interpret=InterpretParams(chip="v5e", skip_floating_point_ops=True))
        rec = record(lambda: f(x))
        return rec.by_primitive["dot_general"]

    # the MXU's time: flops and 4 (128,128) weight tiles (a dot's fixed cost is latency
    # on the chain, not the MXU's time: the next independent dot goes in meanwhile)
    fixed = 2 * 2 * V5E.mxu_weight_tile_seconds
    bf16 = cost(jnp.bfloat16, None)
    assert bf16 == pytest.approx(2 * 256**3 / V5E.mxu_bf16_flops + fixed)
    assert cost(jnp.float32, None) == pytest.approx(bf16)  # Mosaic's default: bf16 rate
    assert cost(jnp.float32, jax.lax.Precision.HIGHEST) == pytest.approx(
        V5E.f32_highest_passes * (bf16 - fixed) + fixed)
    assert V5E.f32_highest_passes == pytest.approx(6, abs=0.1)  # measured: 6.0 passes


@pytest.mark.timeout(120)
def test_trace_json_has_tracks_spans_and_vmem_counters(tmp_path):
    with pi.timeline() as tl:
        jax.block_until_ready(elementwise(1024, 256)())
    path = tmp_path / "trace.json"
    tl.save(str(path))
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(names.values()) >= {"core 0", "DMA engine 0"}
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and (e["pid"], e["tid"]) in names for e in spans)
    cats = {e["cat"] for e in spans}
    assert {"step", "compute", "dma", "overhead"} <= cats
    steps = [e for e in spans if e["cat"] == "step"]
    assert len(steps) == 4 and all(names[(e["pid"], e["tid"])] == "core 0" for e in steps)
    dmas = [e for e in spans if e["cat"] == "dma"]
    assert len(dmas) == 12 and all(e["args"]["bytes"] == 256 * 1024 * 4 for e in dmas)
    assert {(e["args"]["src"], e["args"]["dst"]) for e in dmas} == {
        ("HBM", "x_ref"), ("HBM", "y_ref"), ("o_ref", "HBM")}
    counters = [e for e in events if e["ph"] == "C"]
    peak = max(e["args"]["bytes"] for e in counters)
    assert peak == 2 * 3 * 256 * 1024 * 4  # three blocked operands, double-buffered
    end = max(e["ts"] + e["dur"] for e in spans)
    assert end == pytest.approx(tl.launches[0].predicted_seconds * 1e6)
    assert doc["otherData"]["launches"][0]["bound"] == "HBM"


@pytest.mark.timeout(60)
def test_semaphore_waits_carry_the_semaphore_name():
    def kernel(x_ref, o_ref, sem):
        copy = pltpu.make_async_copy(x_ref, o_ref, sem)
        copy.start()
        copy.wait()

    x = jnp.ones((512, 1024), jnp.float32)
    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                       in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                       out_specs=pl.BlockSpec(memory_space=pl.ANY),
                       scratch_shapes=[pltpu.SemaphoreType.DMA],
                       interpret=InterpretParams(chip="v5e"))
    rec = record(lambda: f(x))
    (wait,) = [s for s in rec.spans if s.cat == "wait"]
    assert "sem" in wait.args["semaphore"]
    (dma,) = [s for s in rec.spans if s.cat == "dma"]
    assert dma.args["bytes"] == x.size * 4
    assert dma.end - dma.start == pytest.approx(
        V5E.dma_latency("hbm") + x.size * 4 * V5E.hbm_byte_seconds("hbm"))
    assert rec.bound == "HBM"


def test_logging_mode_timeline_logs_the_summary(caplog):
    with caplog.at_level("DEBUG", logger="palladium.interpret"):
        elementwise(512, 256, logging_mode=LoggingMode.TIMELINE)()
    assert "timeline of kernel" in caplog.text
    assert "predicted time" in caplog.text and "bound               HBM" in caplog.text


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    with pi.timeline() as tl:
        jax.block_until_ready(elementwise(512, 256)())
    path = tmp_path / "timeline.png"
    tl.plot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(60)
def test_a_failed_launch_is_not_recorded():
    def kernel(x_ref, o_ref, sem):
        pltpu.make_async_copy(x_ref, o_ref, sem).start()  # never waited: a leak

    x = jnp.ones((16, 128), jnp.float32)
    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                       in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                       out_specs=pl.BlockSpec(memory_space=pl.ANY),
                       scratch_shapes=[pltpu.SemaphoreType.DMA], interpret=InterpretParams())
    with pi.timeline() as tl, pytest.raises(pi.SemaphoreLeakError), pi.errors_as_raised():
        jax.block_until_ready(f(x))
    assert tl.launches == []
    assert tl.predicted_seconds == 0.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module", ["perf", "perf.model", "perf.timeline", "observe.observers"])
def test_docstring_examples(module):
    import doctest
    import importlib

    mod = importlib.import_module(f"palladium.interpret.{module}")
    failures, tried = doctest.testmod(mod)
    assert tried > 0 and failures == 0


def _leaky_call():
    def leaky_kernel(x_ref, o_ref, sem):
        pltpu.make_async_copy(x_ref, o_ref, sem).start()  # never waited: a leak

    x = jnp.ones((16, 128), jnp.float32)
    f = pl.pallas_call(leaky_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                       in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                       out_specs=pl.BlockSpec(memory_space=pl.ANY),
                       scratch_shapes=[pltpu.SemaphoreType.DMA], interpret=InterpretParams())
    return lambda: f(x)


def _live_recorders():
    import gc

    from palladium.interpret.perf.recorder import TimelineRecorder

    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, TimelineRecorder)]


@pytest.mark.timeout(120)
def test_failed_launches_leave_nothing_in_the_timeline():
    """A timeline used to keep the recorder (every event) of each failed launch."""
    run = _leaky_call()
    with pi.timeline() as tl:
        for _ in range(20):
            with pytest.raises(pi.SemaphoreLeakError), pi.errors_as_raised():
                jax.block_until_ready(run())
        assert _live_recorders() == []
    assert tl.launches == []


@pytest.mark.timeout(120)
def test_failed_launches_are_recorded_when_asked():
    run = _leaky_call()
    with pi.timeline(keep_failed=True) as tl:
        with pytest.raises(pi.SemaphoreLeakError), pi.errors_as_raised():
            jax.block_until_ready(run())
        jax.block_until_ready(elementwise(64, 32)())
    failed, ok = tl.launches
    assert (failed.kernel_name, failed.failed, ok.failed) == ("leaky_kernel", True, False)
    assert failed.error == "SemaphoreLeakError: semaphores with a non-zero count at kernel exit:"
    assert failed.summary().endswith(": FAILED (SemaphoreLeakError: semaphores with a non-zero "
                                     "count at kernel exit:)")
    assert _live_recorders() == []


@pytest.mark.timeout(300)
def test_a_long_launch_keeps_its_summary_and_drops_detail_past_the_limit(tmp_path):
    """A 10^5-step launch used to hold its every event (+168 MiB) as long as the
    timeline lived. Its recorder is dropped when it ends; the spans past
    ``detail_limit`` are dropped too, the summary stays, and ``trace_file`` streams
    every launch's trace as it ends."""
    run = elementwise(4096, 8, cols=128)  # 512 grid steps
    with pi.timeline() as full:
        jax.block_until_ready(run())
    trace = tmp_path / "trace.json"
    with pi.timeline(detail_limit=100, trace_file=str(trace)) as tl:
        jax.block_until_ready(run())
        jax.block_until_ready(run())
        assert _live_recorders() == []
    (kept,) = full.launches
    first, second = tl.launches
    assert first.detail_dropped and second.detail_dropped and not kept.detail_dropped
    assert first.summary() == second.summary() == kept.summary()
    assert first.to_dict() == kept.to_dict()
    with pytest.raises(pi.ConfigError, match=r"^the spans of kernel 'kernel' \(launch #0\) were "
                                             r"dropped: the timeline keeps at most 100 spans "
                                             r"\(detail_limit\)"):
        _ = first.spans
    with pytest.raises(pi.ConfigError, match=r"were dropped"):
        tl.save(str(tmp_path / "again.json"))
    streamed = json.loads(trace.read_text())["traceEvents"]
    expected = full.trace()["traceEvents"]
    assert len([e for e in streamed if e["ph"] == "X"]) == 2 * len(
        [e for e in expected if e["ph"] == "X"])


@pytest.mark.timeout(120)
def test_spans_are_made_when_first_read_sorted_and_summing_to_the_totals():
    """The replay keeps its spans as tuples; a record makes the Span objects (sorted by
    track, start, the longer first) when ``spans`` is first read: what it reads, and the
    DMA totals summed before, are as when every span was made up front."""
    rec = record(matmul(256, 256, 512, 128, 128, 128, skip_floating_point_ops=True))
    n = rec.num_spans
    spans = rec.spans
    assert rec.spans is spans and n == rec.num_spans == len(spans) > 0
    assert spans == sorted(spans, key=lambda s: (s.track, s.start, -s.end))
    dmas = [s for s in spans if s.cat == "dma"]
    assert dmas and rec.dma_seconds == sum(s.end - s.start for s in dmas)
    assert rec.dma_bytes == sum(s.args["bytes"] for s in dmas) > 0
    assert rec.predicted_seconds >= max(s.end for s in spans)
    # every span has its own args dict (a DMA's a copy of its event's)
    assert len({id(s.args) for s in spans}) == len(spans)
    assert {s.cat for s in spans} >= {"step", "compute", "dma", "overhead"}


def _accumulate(steps, when):
    def kernel(x_ref, o_ref, acc):
        k = pl.program_id(0)
        if when:
            @pl.when(k == 0)
            def _():
                acc[...] = jnp.zeros(acc.shape, acc.dtype)

        acc[...] += x_ref[...]
        if when:
            @pl.when(k == steps - 1)
            def _():
                o_ref[...] = acc[...]
        else:
            o_ref[0:8, :] = acc[0:8, :]

    fixed = pl.BlockSpec((128, 128), lambda i: (0, 0))
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32),
                          grid=(steps,), in_specs=[fixed], out_specs=fixed,
                          scratch_shapes=[pltpu.VMEM((128, 128), jnp.float32)],
                          interpret=InterpretParams(chip="v5e", skip_floating_point_ops=True,
                                                    uninitialized_reads="off"))
    x = jnp.ones((128, 128), jnp.float32)
    return lambda: call(x)


@pytest.mark.timeout(120)
def test_a_conditional_ends_a_basic_block():
    # on the v5e two pl.when a grid step cost 14 ns beside a 16-vreg accumulation
    # (r9/step-forms): what follows a conditional issues after what came before it
    # issued, and after the block's busiest unit's work
    steps = 8
    plain = record(_accumulate(steps, False))
    when = record(_accumulate(steps, True))
    assert V5E.branch_seconds == pytest.approx(7.1e-9, rel=0.05)

    def steady(rec):  # a middle step's compute chunk
        return [s.end - s.start for s in rec.spans if s.cat == "compute"][3]

    # 16 loads of x, 16 of acc and 16 stores between the two conditionals (neither
    # body runs at this step)
    block = 48 * V5E.vmem_seconds_per_vreg()
    assert steady(when) == pytest.approx(2 * V5E.branch_seconds + block, rel=1e-6)
    assert steady(plain) < steady(when) - V5E.branch_seconds
    assert when.predicted_seconds > plain.predicted_seconds + (steps - 2) * V5E.branch_seconds


def _two_blocks(strided, steps=32):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    if strided:  # (128, 128) pieces of 2048-wide arrays
        shape, spec = (128 * steps // 16, 2048), pl.BlockSpec((128, 128), lambda i: (i // 16, i % 16))
    else:  # whole 128-wide rows
        shape, spec = (128 * steps, 128), pl.BlockSpec((128, 128), lambda i: (i, 0))
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(shape, jnp.float32),
                          grid=(steps,), in_specs=[spec, spec], out_specs=spec,
                          interpret=InterpretParams(chip="v5e", skip_floating_point_ops=True))
    x = jnp.ones(shape, jnp.float32)
    return lambda: call(x, x)


@pytest.mark.timeout(120)
def test_a_strided_block_copy_costs_the_dma_engine_more():
    # round 8 on the v5e: two (128, 128) f32 blocks a step, as pieces of 2048-wide arrays,
    # 11-16 ns a copy more than as whole rows of 128-wide ones
    contiguous, strided = record(_two_blocks(False)), record(_two_blocks(True))
    assert V5E.strided_copy_seconds == pytest.approx(13.8e-9, rel=0.05)
    assert contiguous.dma_bytes == strided.dma_bytes
    per_step = (strided.predicted_seconds - contiguous.predicted_seconds) / 32
    # two input copies a step, served one after the other, and part of the output's:
    # 64 KiB input and output copies do not mix (``mixed_copy_limit_bytes``: the next
    # inputs wait for the output copy's issue), so it is no longer all beside them
    assert 2 * V5E.strided_copy_seconds <= per_step <= 3 * V5E.strided_copy_seconds


def _revisited(dynamic, steps=64):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] += x_ref[...] + y_ref[...]

    imap = (lambda i: (jnp.minimum(i, 0), 0)) if dynamic else (lambda i: (0, 0))
    spec = pl.BlockSpec((8, 128), imap)
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          grid=(steps,), in_specs=[spec, spec],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
                          interpret=InterpretParams(chip="v5e", skip_floating_point_ops=True,
                                                    uninitialized_reads="off"))
    x = jnp.ones((8, 128), jnp.float32)
    return lambda: call(x, x)


@pytest.mark.timeout(120)
def test_an_index_map_computed_at_every_step_costs_the_step_more():
    # round 12 on the v5e: two inputs whose maps come to block 0 through a min take 41 ns
    # a step, three constant ones 21: the block index is computed and compared every step
    steps = 64
    constant, dynamic = record(_revisited(False, steps)), record(_revisited(True, steps))
    assert constant.dma_bytes == dynamic.dma_bytes  # the same block every step: no copies
    per_step = (dynamic.predicted_seconds - constant.predicted_seconds) / steps
    assert per_step == pytest.approx(2 * V5E.dynamic_operand_step_seconds, rel=0.02)
    assert V5E.dynamic_operand_step_seconds == pytest.approx(10.5e-9, rel=0.05)


def _in_out(rows, n_in, out, steps=64):
    """Per grid step: ``n_in`` (rows, 128) f32 input blocks copied in, and an output
    block of that size copied out (``out``) or kept resident."""
    def kernel(*refs):
        o_ref = refs[-1]
        acc = sum((r[...] for r in refs[:-1]), jnp.full((rows, 128), 1.0, jnp.float32))
        if out:
            o_ref[...] = acc
        else:
            o_ref[...] += acc

    spec = pl.BlockSpec((rows, 128), lambda i: (i, 0))
    shape = (rows * steps, 128)
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(shape if out else (rows, 128), jnp.float32),
        grid=(steps,), in_specs=[spec] * n_in,
        out_specs=spec if out else pl.BlockSpec((rows, 128), lambda i: (0, 0)),
        interpret=InterpretParams(chip="v5e", skip_floating_point_ops=True,
                                  uninitialized_reads="off"))
    xs = [jnp.ones(shape, jnp.float32) for _ in range(n_in)]
    return record(lambda: call(*xs)).predicted_seconds / steps


@pytest.mark.timeout(120)
def test_large_input_and_output_block_copies_do_not_mix():
    # round 5 on the v5e: a step's 64 KiB input and output copies take about the two
    # apart added (389 ns against 236 + 169), 32 KiB ones overlap (262 against 212 + 144)
    assert V5E.mixed_copy_limit_bytes == 32 * 1024
    for rows, mixes in ((64, True), (128, False)):  # 32 and 64 KiB blocks
        both, alone = _in_out(rows, 1, True), _in_out(rows, 1, False) + _in_out(rows, 0, True)
        if mixes:
            assert both < 0.85 * alone
        else:
            assert both == pytest.approx(alone, rel=0.1)


def _copy_pipeline(steps):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    spec = pl.BlockSpec((128, 1024), lambda i: (i, 0))
    shape = (128 * steps, 1024)
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(shape, jnp.float32),
                          grid=(steps,), in_specs=[spec], out_specs=spec,
                          interpret=InterpretParams(chip="v5e", skip_floating_point_ops=True,
                                                    uninitialized_reads="off"))
    x = jnp.ones(shape, jnp.float32)
    return lambda: call(x)


@pytest.mark.timeout(300)
def test_a_pipeline_whose_blocks_move_pays_a_fixed_part_at_its_ends(monkeypatch):
    # round 22 on the v5e: copies of (128, 1024) blocks over 2 to 16 steps take the
    # model's per-step time and 0.3-0.6 us more (launch_overhead_seconds, 0.18 us at
    # each end); a kernel of one step (vpu/*) or of one block (grid/revisit) does not.
    # The two ends lie outside the pipeline (before its first copy is issued, after its
    # last is waited for): they add exactly twice the constant and move nothing else
    # (placed between the first copies and the first step, 0.19 us turned the two-block
    # copy of _two_blocks from 60.2 into 49.4 us at 128 steps)
    import dataclasses
    import importlib

    assert V5E.launch_overhead_s == pytest.approx(0.18e-6, rel=0.05)
    timeline = importlib.import_module("palladium.interpret.perf.timeline")

    def predicted(make, launch):
        model = dataclasses.replace(V5E, launch_overhead_s=launch)
        monkeypatch.setattr(timeline, "chip_model", lambda chip: model)
        return record(make()).predicted_seconds

    for make in (lambda: _copy_pipeline(4), lambda: _two_blocks(False, steps=128)):
        base = predicted(make, 0.0)
        for launch in (0.1e-6, 0.19e-6, 0.3e-6):
            assert predicted(make, launch) - base == pytest.approx(2 * launch, rel=1e-6)
    resident = lambda: _revisited(False, 16)  # noqa: E731 (one block, never moved)
    assert predicted(resident, 0.3e-6) == predicted(resident, 0.0)


def _page_burst(pages: int, steps: int = 8) -> float:
    """Predicted seconds of ``steps`` grid steps, each starting ``pages`` 8 KiB page DMAs
    together (one burst) and then waiting for them."""
    def kernel(x_hbm, o_ref, buf, sem):
        copies = [pltpu.make_async_copy(x_hbm.at[pl.program_id(0) * pages + j], buf.at[j], sem)
                  for j in range(pages)]
        for c in copies:
            c.start()
        for c in copies:
            c.wait()
        o_ref[...] = buf[0][None]

    x = jnp.ones((pages * steps, 16, 128), jnp.float32)
    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((steps, 16, 128), jnp.float32), grid=(steps,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((1, 16, 128), lambda i: (i, 0, 0)),
        scratch_shapes=[pltpu.VMEM((pages, 16, 128), jnp.float32), pltpu.SemaphoreType.DMA(())],
        interpret=InterpretParams(chip="v5e", skip_floating_point_ops=True,
                                  uninitialized_reads="off"))
    return record(lambda: f(x)).predicted_seconds


@pytest.mark.timeout(300)
def test_a_deep_burst_of_small_dmas_holds_the_engine_less_from_its_16th_dma_on():
    # round 26 on the v5e: 8 KiB page DMAs started together take 23.8 ns a page up to
    # 16 a burst and 13.7 ns from 32 to 64 (their bytes alone 11 ns): jax's paged
    # attention at 16 pages a block (32 page DMAs a burst) was 8-11% over with 21 ns each
    assert V5E.dma_burst_depth == 16
    assert V5E.dma_min_deep_seconds == pytest.approx(13.8e-9, rel=0.05)
    steps = 8
    t = {p: _page_burst(p, steps) for p in (8, 16, 32, 64)}
    shallow = (t[16] - t[8]) / (8 * steps)
    deep = (t[64] - t[32]) / (32 * steps)
    assert shallow == pytest.approx(V5E.dma_min_seconds, rel=0.05)
    assert deep == pytest.approx(V5E.dma_min_deep_seconds, rel=0.05)


def _two_reads(gap: bool):
    """Two 256 KiB reads into VMEM, the second started right after the first (one
    burst) or after a vector op (``gap``); waited for in order. Their DMA spans."""
    def kernel(x_hbm, y_ref, o_ref, a, b, sems):
        first = pltpu.make_async_copy(x_hbm.at[0], a, sems.at[0])
        first.start()
        if gap:
            o_ref[...] = y_ref[...] * 2.0
        second = pltpu.make_async_copy(x_hbm.at[1], b, sems.at[1])
        second.start()
        first.wait()
        second.wait()
        o_ref[...] = a[pl.ds(0, 8), :] + b[pl.ds(0, 8), :]

    x = jnp.ones((2, 64, 1024), jnp.float32)
    y = jnp.ones((8, 1024), jnp.float32)
    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 1024), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pltpu.VMEM)],
        scratch_shapes=[pltpu.VMEM((64, 1024), jnp.float32),
                        pltpu.VMEM((64, 1024), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
        interpret=InterpretParams(chip="v5e", uninitialized_reads="off"))
    rec = record(lambda: f(x, y))
    return sorted((s for s in rec.spans if s.cat == "dma" and s.args["bytes"] == 64 * 1024 * 4),
                  key=lambda s: s.start)


@pytest.mark.timeout(120)
def test_a_kernels_dmas_are_served_one_burst_at_a_time_in_issue_order():
    # a ring of two 256 KiB reads in flight runs at the engine's rate on a v5e (100.5 us
    # against 134 with the engine shared and 90 in order, dma/in/262144B/k2)
    latency, move = V5E.dma_latency("in"), 64 * 1024 * 4 * V5E.hbm_byte_seconds("in")
    first, second = _two_reads(gap=True)
    assert second.start > first.start
    assert first.end == pytest.approx(first.start + latency + move)  # as if alone
    assert second.end == pytest.approx(first.end + move)  # then the second
    # DMAs started together share the engine and end together
    first, second = _two_reads(gap=False)
    assert second.start == first.start
    assert first.end == second.end == pytest.approx(first.start + latency + 2 * move)
