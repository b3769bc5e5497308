"""Issue 42, item 5: a launch computes its grid points per step, not its whole schedule
before the first one: a 10^9-point grid starts at once (its watchdog and progress
reports with it) and holds no per-point memory."""

import os
import time
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams, WatchdogError, errors_as_raised
from palladium.interpret.run import grid_points as gp
from palladium.interpret.run.grid_order import parallel_orders

pytestmark = pytest.mark.timeout(120)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 5000), seed=st.integers(0, 2**31 - 1), dim=st.integers(0, 3))
def test_a_feistel_order_is_a_permutation_reproducible_from_the_seed(n, seed, dim):
    order = gp.FeistelOrder(n, seed, dim)
    values = [order[i] for i in range(n)]
    assert sorted(values) == list(range(n))
    assert values == [gp.FeistelOrder(n, seed, dim)[i] for i in range(n)]


def test_feistel_orders_differ_by_seed_and_dimension():
    n = 1000
    base = [gp.FeistelOrder(n, 1, 0)[i] for i in range(n)]
    assert base != [gp.FeistelOrder(n, 2, 0)[i] for i in range(n)]
    assert base != [gp.FeistelOrder(n, 1, 1)[i] for i in range(n)]
    assert base != list(range(n))


@pytest.mark.parametrize("grid, parallel, cores", [
    ((6, 5), (True, False), 1), ((7, 3, 2), (True, True, False), 2), ((9,), (False,), 1)])
def test_lazy_points_equal_the_eager_ones(monkeypatch, grid, parallel, cores):
    """Past ``EAGER_POINTS`` the points are computed per index: the same points."""
    eager = gp.grid_points(grid, parallel, 7, cores, shuffle=True)
    monkeypatch.setattr(gp, "EAGER_POINTS", 0)
    lazy = gp.grid_points(grid, parallel, 7, cores, shuffle=True)
    assert all(isinstance(p, gp.GridPoints) for p in lazy)
    assert [list(p) for p in lazy] == eager
    assert [[p[i] for i in range(len(p))] for p in lazy] == eager
    # jax's order of each small parallel dimension, as before
    orders = parallel_orders(tuple(n for n, p in zip(grid, parallel) if p), 7)
    if orders:
        assert eager[0][0][0] == int(orders[0][0])


def test_a_billion_point_grid_fails_its_watchdog_at_once_with_little_memory():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    n = int(os.environ.get("GRID_POINTS_TEST_N", 10**9))
    call = jax.jit(lambda x: pl.pallas_call(
        kernel, grid=(n,), in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=InterpretParams(watchdog_timeout=2.0))(x))
    x = np.zeros((8, 128), np.float32)
    jax.block_until_ready(call.lower(x).compile())  # (jax's tracing and compiling apart)
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(WatchdogError), errors_as_raised():
            call(x).block_until_ready()
        took = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"{n} points: watchdog after {took:.2f} s, peak {peak / 2**20:.1f} MiB traced")
    assert took < 6.0, took
    assert peak < 64 << 20, peak  # (a 10^9 schedule: gigabytes)
