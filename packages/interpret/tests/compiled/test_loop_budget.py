"""A compiled launch whose last run was short runs inline, its ``while`` loops given a
budget of iterations (``compiled_launch._inline_budget``): data that makes them run
far longer spends it, and the launch runs again on the worker thread (under the
watchdog) with no budget, to the same results as ever."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams
from palladium.interpret.compiled import compiled_launch
from palladium.interpret.compiled.compiled_launch import INLINE_LOOPS, PAST_BUDGET
from palladium.interpret.run.execution_plan import WHOLE_LAUNCH

pytestmark = pytest.mark.timeout(300)

G, R, C = 4, 8, 128


@pytest.fixture
def always_worth(monkeypatch):
    monkeypatch.setattr(compiled_launch, "MIN_EQUATIONS_PER_LAUNCH", 0)


def _kernel(n_ref, x_ref, o_ref):
    """Adds 1 to the block ``n[0]`` times, in a ``while`` loop (a count known at run
    time only)."""
    def body(c):
        i, acc = c
        return i + 1, acc + 1.0

    _, o_ref[...] = lax.while_loop(lambda c: c[0] < n_ref[0], body, (0, x_ref[...]))


def _call(seed, **params):
    return jax.jit(lambda n, x: pl.pallas_call(
        _kernel, out_shape=jax.ShapeDtypeStruct((G * R, C), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(G,),
            in_specs=[pl.BlockSpec((R, C), lambda g, n: (g, 0))],
            out_specs=pl.BlockSpec((R, C), lambda g, n: (g, 0))),
        interpret=InterpretParams(random_seed=seed, **params))(n, x))


def test_loops_past_the_inline_budget_run_again_threaded_to_the_same_results(always_worth):
    x = np.arange(G * R * C, dtype=np.float32).reshape(G * R, C) % 97
    call = _call(301)
    before = compiled_launch.STATS.copy()
    for _ in range(WHOLE_LAUNCH + 1):  # (the last two compiled: short, so inline)
        np.testing.assert_array_equal(call(np.int32([3]), x), x + 3)
    assert compiled_launch.STATS["compiled"] - before["compiled"] == 2
    assert compiled_launch.STATS[PAST_BUDGET] == before[PAST_BUDGET]
    many = 4 * INLINE_LOOPS  # (G grid steps of it: past twice the last run's and more)
    out = np.asarray(call(np.int32([many]), x))
    assert compiled_launch.STATS[PAST_BUDGET] == before[PAST_BUDGET] + 1
    assert compiled_launch.STATS["compiled"] - before["compiled"] == 3
    np.testing.assert_array_equal(out, x + many)
    simulated = np.asarray(_call(302, compile_segments=False)(np.int32([many]), x))
    np.testing.assert_array_equal(out, simulated)
    np.testing.assert_array_equal(call(np.int32([5]), x), x + 5)
