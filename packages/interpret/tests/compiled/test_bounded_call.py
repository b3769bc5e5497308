"""Issue 42, item 4: a compiled launch honours ``watchdog_timeout``, ``progress_interval``
and Ctrl-C. Its executable cannot be stopped; it runs on a worker thread while the
launch waits for it under the watchdog (before: a 5 s watchdog returned after 35.9 s,
when the executable ended)."""

import logging
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams, WatchdogError, errors_as_raised
from palladium.interpret.compiled import bounded_call, compiled_launch
from palladium.interpret.run.execution_plan import WHOLE_LAUNCH
from palladium.interpret.run.interrupts import LaunchInterrupted

G, R, C = 16, 8, 128


@pytest.fixture
def always_worth(monkeypatch):
    monkeypatch.setattr(compiled_launch, "MIN_EQUATIONS_PER_LAUNCH", 0)


def _spinning_call(**params):
    """Each grid step iterates ``n[0]`` times (a ``while`` on an SMEM count): from about
    10 us per launch (n = 1) to about a minute (n = 2**20 - 2, under the compiled loop's
    limit)."""
    def kernel(n_ref, x_ref, o_ref):
        def body(c):
            i, v = c
            return i + 1, jnp.sin(v) * 0.5 + jnp.cos(v) * 0.25

        _, v = jax.lax.while_loop(lambda c: c[0] < n_ref[0], body, (0, x_ref[...]))
        o_ref[...] = v

    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(G,), in_specs=[pl.BlockSpec((R, C), lambda g, n: (g, 0))],
        out_specs=pl.BlockSpec((R, C), lambda g, n: (g, 0)))
    return jax.jit(lambda n, x: pl.pallas_call(
        kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((G * R, C), jnp.float32),
        interpret=InterpretParams(**params))(n, x))


def _reference(x, n):
    v = np.float32(x)
    for _ in range(n):
        v = (np.sin(v) * np.float32(0.5) + np.cos(v) * np.float32(0.25)).astype(np.float32)
    return v


@pytest.mark.timeout(120)
def test_a_compiled_launch_past_its_watchdog_raises_within_the_watchdog(always_worth):
    x = np.random.default_rng(0).standard_normal((G * R, C)).astype(np.float32)
    call = _spinning_call(watchdog_timeout=2.0, random_seed=4240)
    before = compiled_launch.STATS["compiled"]
    for n in range(WHOLE_LAUNCH):  # the last compiled
        out = np.asarray(call(np.array([3], np.int32), x))
        np.testing.assert_allclose(out, _reference(x, 3), rtol=2e-6, atol=2e-6, err_msg=f"{n}")
    assert compiled_launch.STATS["compiled"] == before + 1
    start = time.monotonic()
    with pytest.raises(WatchdogError, match=r"kernel 'kernel' is still running after 2 s"), \
            errors_as_raised():
        call(np.array([2**20 - 2], np.int32), x).block_until_ready()
    took = time.monotonic() - start
    assert took < 3.5, took
    assert compiled_launch.STATS["compiled"] == before + 1


@pytest.mark.timeout(120)
def test_a_long_compiled_launch_reports_its_progress(always_worth, caplog):
    x = np.random.default_rng(1).standard_normal((G * R, C)).astype(np.float32)
    call = _spinning_call(progress_interval=0.5, random_seed=4241)
    for _ in range(3):
        call(np.array([1], np.int32), x).block_until_ready()
    n = 40_000  # about 1-2 s compiled
    with caplog.at_level(logging.WARNING, logger="palladium.interpret"):
        out = np.asarray(call(np.array([n], np.int32), x))
    assert any("running compiled (one XLA executable)" in r.getMessage() for r in caplog.records)
    assert np.isfinite(out).all()


@pytest.mark.timeout(60)
def test_ctrl_c_stops_the_wait_for_a_compiled_launch():
    """``interrupt_all`` (what the jax hook's Ctrl-C handler calls) makes the waiting
    launch raise the interrupt at its next look (every 50 ms)."""
    release = threading.Event()
    stop = LaunchInterrupted("launch cancelled by Ctrl-C")
    threading.Timer(0.3, bounded_call.interrupt_all, (stop,)).start()
    start = time.monotonic()
    with pytest.raises(LaunchInterrupted):
        bounded_call.bounded_call(lambda: release.wait(30), kernel_name="k",
                                  params=InterpretParams(), inline=False)
    assert time.monotonic() - start < 1.5
    release.set()


@pytest.mark.timeout(60)
def test_a_short_fixed_length_launch_runs_inline_after_its_first_run(always_worth, monkeypatch):
    """No ``while`` loop and a short last run: the next runs on the launch's thread. The
    first compiled launch, whose executable has no last run, runs on the worker thread;
    every later one inline."""
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.tanh(x_ref[...]) * 2.0 + 1.0

    x = np.random.default_rng(2).standard_normal((G * R, C)).astype(np.float32)
    call = jax.jit(lambda x: pl.pallas_call(
        kernel, grid=(G,), in_specs=[pl.BlockSpec((R, C), lambda g: (g, 0))],
        out_specs=pl.BlockSpec((R, C), lambda g: (g, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=InterpretParams(random_seed=4242))(x))
    seen = []
    real = bounded_call.bounded_call

    def spy(fn, *, kernel_name, params, inline):
        seen.append(inline)
        return real(fn, kernel_name=kernel_name, params=params, inline=inline)

    monkeypatch.setattr(compiled_launch, "bounded_call", spy)
    monkeypatch.setattr(compiled_launch, "INLINE_SECONDS", 10.0)  # (whatever the load)
    for _ in range(5):
        np.testing.assert_allclose(np.asarray(call(x)), np.tanh(x) * 2 + 1, rtol=1e-6, atol=1e-6)
    assert seen == [False] + [True] * (5 - WHOLE_LAUNCH)  # (compiled: launches 3-5)
