"""Compiled segments (eval/segments.py): a loop of small array operations and ref
accesses runs as one XLA executable, with the results of jax's own HLO interpreter (but
for FMA contraction, which the chip does not do: ``eval/chip_arithmetic.py``), and
everything the one-equation path reports (out-of-bounds accesses, races, runaway loops,
the timeline, skip_floating_point_ops) stays exactly as it was."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi
from palladium.interpret import (
    ConfigError,
    DataRaceError,
    InterpretParams,
    OutOfBoundsError,
    UninitializedUseError,
    WatchdogError,
    errors_as_raised,
)
from palladium.interpret.compiled import compiled_launch
from palladium.interpret.eval import segments

ROWS, WIDTH = 64, 128


@pytest.fixture(autouse=True)
def segments_only(monkeypatch):
    """These tests count compiled segments (``STATE.segments.compiled``): no launch is
    compiled whole (its compile would be counted)."""
    monkeypatch.setattr(compiled_launch, "MIN_EQUATIONS_PER_LAUNCH", 1 << 60)


def _scan_kernel(x_ref, a_ref, o_ref, h_ref):
    """h_t = a_t * h_{t-1} + sqrt(1 - a_t^2) * tanh(x_t), one row per loop step."""
    h_ref[...] = jnp.zeros_like(h_ref)

    def step(t, h):
        a = jax.nn.sigmoid(a_ref[pl.ds(t, 1), :])
        h = a * h + jnp.sqrt(jnp.maximum(1.0 - a * a, 0.0)) * jnp.tanh(x_ref[pl.ds(t, 1), :])
        o_ref[pl.ds(t, 1), :] = h
        return h

    h_ref[...] = jax.lax.fori_loop(0, ROWS, step, h_ref[...])


def _scan(params, x, a):
    return pl.pallas_call(
        _scan_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((1, WIDTH), jnp.float32)], interpret=params)(x, a)


def _inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((ROWS, WIDTH), np.float32),
            rng.standard_normal((ROWS, WIDTH), np.float32))


def _reference(x, a):
    x, a = np.float64(x), np.float64(a)
    gate = 1 / (1 + np.exp(-a))
    h, out = np.zeros(WIDTH), np.empty_like(x)
    for t in range(ROWS):
        h = gate[t] * h + np.sqrt(np.maximum(1 - gate[t] ** 2, 0)) * np.tanh(x[t])
        out[t] = h
    return out


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PALLADIUM_CACHE_DIR", str(tmp_path))
    pi.STATE.segments.clear()


def test_a_loop_of_small_operations_is_compiled_and_gives_jax_hlo_interpreters_values():
    x, a = _inputs()
    before = pi.STATE.segments.compiled
    out = np.asarray(_scan(InterpretParams(), x, a))
    assert pi.STATE.segments.compiled == before + 1
    np.testing.assert_allclose(out, _reference(x, a), rtol=1e-5, atol=1e-5)
    # jax's HLO interpreter contracts ``a * h + ...`` into FMAs; the chip does not
    np.testing.assert_allclose(out, np.asarray(_scan(True, x, a)), rtol=1e-6, atol=1e-6)
    # The one-equation path (numpy) agrees to within float32 rounding.
    slow = np.asarray(_scan(InterpretParams(compile_segments=False), x, a))
    np.testing.assert_allclose(out, slow, rtol=1e-6, atol=1e-6)


def test_segments_are_chosen_by_a_static_rule():
    jaxpr = jax.make_jaxpr(lambda x, a: _scan(InterpretParams(), x, a))(*_inputs())
    kernel = next(e for e in jaxpr.eqns if e.primitive.name == "pallas_call").params["jaxpr"]
    runs = segments.find_segments(kernel, lambda prim: prim.name == "program_id")
    assert runs == [(0, len(kernel.eqns), False)]  # the whole body: zeros, loop, store
    assert segments.work(kernel.eqns) >= segments.MIN_WORK
    assert segments.work(kernel.eqns[:1]) < segments.MIN_WORK


def test_a_new_process_loads_the_compiled_segment_from_disk(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import numpy as np
        import palladium.interpret as pi
        from palladium.interpret.compiled import compiled_launch
        from test_compiled_segments import _inputs, _scan
        compiled_launch.MIN_EQUATIONS_PER_LAUNCH = 1 << 60  # (segments only)
        out = np.asarray(_scan(pi.InterpretParams(), *_inputs()))
        print(pi.STATE.segments.compiled, out.sum())
    """)
    env = {**os.environ, "PALLADIUM_CACHE_DIR": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, timeout=240) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    (first, total_1), (second, total_2) = (r.stdout.split() for r in runs)
    assert (first, second) == ("1", "0")
    assert total_1 == total_2
    assert list((tmp_path / "executables").glob("*.entry"))


def _oob_kernel(n_ref, x_ref, o_ref):
    def step(t, acc):
        return acc + x_ref[pl.ds(t + n_ref[0], 1), :]

    o_ref[...] = jax.lax.fori_loop(0, ROWS, step, jnp.zeros((1, WIDTH), jnp.float32))


def _oob(params, shift):
    x = jnp.ones((ROWS, WIDTH), jnp.float32)
    return pl.pallas_call(
        _oob_kernel, out_shape=jax.ShapeDtypeStruct((1, WIDTH), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec()],
        interpret=params)(jnp.array([shift], jnp.int32), x)


def test_an_out_of_bounds_access_inside_a_compiled_loop_is_reported_as_before():
    np.testing.assert_array_equal(_oob(InterpretParams(), 0), np.full((1, WIDTH), ROWS))
    messages = []
    for compiled in (True, False):
        with pytest.raises(OutOfBoundsError) as info, errors_as_raised():
            _oob(InterpretParams(compile_segments=compiled), 3)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "[64:65, 0:128]" in messages[0] and "test_compiled_segments.py:" in messages[0]


def _forever_kernel(x_ref, o_ref):
    def cond(c):
        return c[0] >= 0  # never false

    o_ref[...] = jax.lax.while_loop(cond, lambda c: (c[0] + 1, c[1] * 0.5),
                                    (jnp.int32(0), x_ref[...]))[1]


@pytest.mark.timeout(120)
def test_a_loop_that_never_ends_is_still_a_watchdog_error():
    x = jnp.ones((8, WIDTH), jnp.float32)
    call = pl.pallas_call(_forever_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=InterpretParams(watchdog_timeout=3.0))
    with pytest.raises(WatchdogError, match="test_compiled_segments.py:"), errors_as_raised():
        call(x)


def _race_kernel(x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()

    def step(t, acc):  # reads the DMA's destination before waiting for it
        return acc + buf[pl.ds(t, 1), :]

    o_ref[...] = jax.lax.fori_loop(0, ROWS, step, jnp.zeros((1, WIDTH), jnp.float32))
    copy.wait()


def test_with_races_on_a_kernel_that_starts_dmas_runs_equation_by_equation():
    x = jnp.ones((ROWS, WIDTH), jnp.float32)
    call = pl.pallas_call(
        _race_kernel, out_shape=jax.ShapeDtypeStruct((1, WIDTH), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((ROWS, WIDTH), jnp.float32), pltpu.SemaphoreType.DMA],
        interpret=InterpretParams(detect_races=True))
    with pytest.raises(DataRaceError, match="test_compiled_segments.py:"), errors_as_raised():
        call(x)


def test_skip_floating_point_ops_and_the_timeline_see_every_equation():
    x, a = _inputs()
    skipped = np.asarray(_scan(InterpretParams(skip_floating_point_ops=True), x, a))
    assert np.isinf(skipped).all()
    with pi.timeline() as tl:
        _scan(InterpretParams(compile_segments=False), x, a)
    with pi.timeline() as tl_compiled:
        _scan(InterpretParams(), x, a)
    (one,), (other,) = tl.launches, tl_compiled.launches
    assert one.summary() == other.summary()


@pytest.mark.timeout(300)
def test_every_device_of_a_multi_device_launch_runs_the_compiled_loop():
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n = 4
    mesh = jax.make_mesh((n,), ("x",), devices=jax.devices()[:n])
    x, a = _inputs()
    shard = NamedSharding(mesh, P("x"))
    xs, as_ = (jax.device_put(np.concatenate([v * (i + 1) for i in range(n)]), shard)
               for v in (x, a))
    f = jax.jit(jax.shard_map(lambda x, a: _scan(InterpretParams(), x, a), mesh=mesh,
                              in_specs=(P("x"), P("x")), out_specs=P("x"), check_vma=False))
    out = np.asarray(f(xs, as_))
    for i in range(n):
        expected = np.asarray(_scan(InterpretParams(), x * (i + 1), a * (i + 1)))
        np.testing.assert_array_equal(out[i * ROWS:(i + 1) * ROWS], expected)


def _dma_then_loop_kernel(x_hbm, o_ref, buf, sem, *, wait_first):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    if wait_first:
        copy.wait()

    def step(t, acc):
        return acc + jnp.tanh(buf[pl.ds(t, 1), :]) * jax.nn.sigmoid(buf[pl.ds(t, 1), :])

    o_ref[...] = jax.lax.fori_loop(0, ROWS, step, jnp.zeros((1, WIDTH), jnp.float32))
    if not wait_first:
        copy.wait()


def _dma_then_loop(params, x, wait_first):
    import functools

    return pl.pallas_call(
        functools.partial(_dma_then_loop_kernel, wait_first=wait_first),
        out_shape=jax.ShapeDtypeStruct((1, WIDTH), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((ROWS, WIDTH), jnp.float32), pltpu.SemaphoreType.DMA],
        interpret=params,
    )(x)


def test_with_races_on_a_dma_kernels_loop_runs_compiled_and_its_accesses_are_replayed():
    x, _ = _inputs()
    before = pi.STATE.segments.compiled
    raced = np.asarray(_dma_then_loop(InterpretParams(detect_races=True), x, True))
    assert pi.STATE.segments.compiled == before + 1  # the variant that logs its accesses
    plain = np.asarray(_dma_then_loop(InterpretParams(), x, True))
    np.testing.assert_array_equal(raced, plain)  # races on or off: the same bits
    expected = (np.tanh(x) / (1 + np.exp(-x))).sum(0, keepdims=True)
    np.testing.assert_allclose(raced, expected, rtol=1e-5, atol=1e-4)
    reports = []
    for compiled in (True, False):
        # (the loop reads the DMA's destination before its wait: a race, and data
        # that is not there yet, which uninitialized_reads would report at the output)
        params = InterpretParams(detect_races=True, on_race="collect",
                                 compile_segments=compiled, uninitialized_reads="off")
        with pi.collect_race_reports() as got:
            _dma_then_loop(params, x, False)
        reports.append([str(r) for r in got])
    assert reports[0] == reports[1] and reports[0]
    assert "test_compiled_segments.py:" in reports[0][0]


def test_a_body_without_loops_is_compiled_when_its_grid_is_large():
    def body(x_ref, o_ref):
        x = x_ref[...]
        y = jnp.tanh(x) * 0.5 + jnp.exp(-x * x) - jax.nn.sigmoid(x) * x
        o_ref[...] = jnp.maximum(y, -1.0) + jnp.sqrt(jnp.abs(y) + 1.0)

    kernel_jaxpr = jax.make_jaxpr(
        lambda x: pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                                 interpret=InterpretParams())(x))(np.ones((8, 128), np.float32))
    kernel = next(e for e in kernel_jaxpr.eqns if e.primitive.name == "pallas_call")
    eqns = kernel.params["jaxpr"]
    w = segments.work(eqns.eqns)
    assert w < segments.MIN_WORK
    few = -(-segments.MIN_WORK_PER_LAUNCH // w) - 1
    # under both thresholds: compiled only when hot (from the kernel's HOT_LAUNCH-th launch)
    assert w >= segments.HOT_MIN_WORK
    assert segments.find_segments(eqns, lambda p: False, runs=few) == [(0, len(eqns.eqns), True)]
    assert segments.find_segments(eqns, lambda p: False, runs=few + 1) == [
        (0, len(eqns.eqns), False)]

    def call(params, x):
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              grid=(x.shape[0] // 8,),
                              in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                              interpret=params)(x)

    x = np.random.default_rng(1).standard_normal(((few + 1) * 8, 128), np.float32)
    before = pi.STATE.segments.compiled
    out = np.asarray(call(InterpretParams(), x))
    assert pi.STATE.segments.compiled == before + 1
    slow = np.asarray(call(InterpretParams(compile_segments=False), x))
    np.testing.assert_allclose(out, slow, rtol=1e-6, atol=1e-6)
    # jax's HLO interpreter (which contracts products into FMAs, as the chip does not)
    np.testing.assert_allclose(out, np.asarray(call(True, x)), rtol=1e-6, atol=1e-6)


def test_a_small_segment_is_compiled_from_the_kernels_third_launch_on():
    """A segment not worth compiling for one call runs equation by equation in the first
    two launches and compiled from the third (nothing compiles beside the second):
    a fixed launch, whatever the timing; the same values as the one-equation path."""
    def body(x_ref, o_ref):
        x = x_ref[...]
        y = jnp.tanh(x) * 0.5 + jnp.exp(-x * x) - jax.nn.sigmoid(x) * x
        o_ref[...] = jnp.maximum(y, -1.0) + jnp.sqrt(jnp.abs(y) + 1.0)

    # a shape no other test uses: the segment's text is new to this process
    call = jax.jit(lambda x: pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=InterpretParams())(x))
    x = np.random.default_rng(7).standard_normal((24, 128), np.float32)
    ran = []
    real = segments.Segment.__call__

    def spy(self, ev, eqn, invals):
        ran.append((ev.launch_number, self.hot))
        return real(self, ev, eqn, invals)

    compiled = pi.STATE.segments.compiled
    segments.Segment.__call__ = spy
    try:
        outs = [np.asarray(call(x)) for _ in range(4)]
    finally:
        segments.Segment.__call__ = real
    first = ran[0][0]
    assert ran == [(first + i, True) for i in range(4)]
    # compiled once, by the third launch (or found on disk)
    assert pi.STATE.segments.compiled - compiled <= 1
    slow = np.asarray(jax.jit(lambda x: pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=InterpretParams(compile_segments=False))(x))(x))
    for out in outs[:2]:
        np.testing.assert_array_equal(out, slow)  # the one-equation path
    np.testing.assert_array_equal(outs[3], outs[2])
    np.testing.assert_allclose(outs[2], slow, rtol=1e-6, atol=1e-6)
    # launches 3 and 4 ran XLA's code: jax's HLO interpreter's values (it contracts
    # products into FMAs, as the chip does not: ``eval/chip_arithmetic.py``)
    hlo = np.asarray(pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                    interpret=True)(x))
    np.testing.assert_allclose(outs[2], hlo, rtol=1e-6, atol=1e-6)


def test_static_keeps_a_small_segment_equation_by_equation_on_every_call():
    def body(x_ref, o_ref):
        x = x_ref[...]
        o_ref[...] = jnp.exp(-x * x) * 0.25 + jnp.tanh(x) - jax.nn.sigmoid(x) * x

    def call(params):
        return jax.jit(lambda x: pl.pallas_call(
            body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=params)(x))

    x = np.random.default_rng(8).standard_normal((40, 128), np.float32)
    static = call(InterpretParams(compile_segments="static"))
    hot, compiles = [], []
    real_call, real_compile = segments.Segment.__call__, segments.Segment._compile

    def spy_call(self, ev, eqn, invals):
        hot.append(self.hot)
        return real_call(self, ev, eqn, invals)

    def spy_compile(self, log):
        compiles.append(log)
        return real_compile(self, log)

    segments.Segment.__call__, segments.Segment._compile = spy_call, spy_compile
    try:
        outs = [np.asarray(static(x)) for _ in range(4)]
    finally:
        segments.Segment.__call__, segments.Segment._compile = real_call, real_compile
    assert hot == [True] * 4 and compiles == []  # a hot segment, never compiled
    slow = np.asarray(call(InterpretParams(compile_segments=False))(x))
    for out in outs:
        np.testing.assert_array_equal(out, slow)


def test_compile_segments_takes_a_bool_or_static():
    with pytest.raises(ConfigError, match=r"^InterpretParams\.compile_segments must be "
                       r"True, False or 'static', got 'hot'\.$"):
        InterpretParams(compile_segments="hot")


def _accumulate_kernel(x_ref, o_ref, acc_ref, *, zero):
    if zero:
        @pl.when(pl.program_id(0) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

    def step(t, acc):
        return acc + jnp.tanh(x_ref[pl.ds(t, 1), :]) * 0.5

    acc_ref[...] = jax.lax.fori_loop(0, ROWS, step, acc_ref[...])

    @pl.when(pl.program_id(0) == pl.num_programs(0) - 1)
    def _():
        o_ref[...] = acc_ref[...]


def _accumulate(params, x, zero):
    import functools

    return pl.pallas_call(
        functools.partial(_accumulate_kernel, zero=zero),
        out_shape=jax.ShapeDtypeStruct((1, WIDTH), jnp.float32), grid=(3,),
        in_specs=[pl.BlockSpec((ROWS, WIDTH), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((1, WIDTH), lambda i: (0, 0)),
        scratch_shapes=[pltpu.VMEM((1, WIDTH), jnp.float32)], interpret=params)(x)


def test_a_segment_storing_into_an_unwritten_output_block_runs_compiled_by_default():
    """``uninitialized_reads="on_use"``: the output block holds no data until the last
    step stores it, the scratch until the first step zeroes it; the segment runs as the
    variant that tracks which elements they hold, compiled, with XLA's bits."""
    x = np.random.default_rng(3).standard_normal((3 * ROWS, WIDTH), np.float32)
    before = pi.STATE.segments.compiled
    out = np.asarray(_accumulate(InterpretParams(), x, True))
    assert pi.STATE.segments.compiled > before
    np.testing.assert_array_equal(out, np.asarray(_accumulate(InterpretParams(
        uninitialized_reads="off"), x, True)))
    np.testing.assert_allclose(out, (np.tanh(x) * 0.5).sum(0, keepdims=True), rtol=1e-5,
                               atol=1e-4)


def test_a_compiled_segment_reading_an_unzeroed_accumulator_is_reported_on_every_call():
    x = np.random.default_rng(3).standard_normal((3 * ROWS, WIDTH), np.float32)
    f = jax.jit(lambda x: _accumulate(InterpretParams(), x, False))
    for _ in range(4):
        with pytest.raises(UninitializedUseError, match=r"derived from 'acc_ref' \(VMEM, "
                           r"device 0 core 0\) region \[0:1, 0:128\] read at kernel "
                           r"'_accumulate_kernel', grid point \(0,\)"), errors_as_raised():
            np.asarray(f(x))
