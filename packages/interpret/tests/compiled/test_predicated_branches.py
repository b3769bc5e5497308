"""A ``pl.when`` whose branch holds no control flow and starts no DMA runs
unconditionally in a compiled launch (``traced_eval._predicated``), its stores, DMA
waits and flags conditioned on the branch; one that starts a DMA stays a ``lax.cond``
(here: the two prefetch branches; the wait-and-add branch is predicated). Either way:
results bit-equal to the simulator's, nothing flagged by a branch not taken (its DMA
from a negative row), and a branch taken that goes out of bounds reported as the
simulator reports it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams, OutOfBoundsError, errors_as_raised
from palladium.interpret.compiled import compiled_launch
from palladium.interpret.run.execution_plan import WHOLE_LAUNCH

pytestmark = pytest.mark.timeout(300)

STEPS, ROWS, C = 8, 8, 128


@pytest.fixture
def always_worth(monkeypatch):
    monkeypatch.setattr(compiled_launch, "MIN_EQUATIONS_PER_LAUNCH", 0)


def _kernel(idx_ref, src_hbm, o_ref, buf, acc, sem):
    """Step g copies row ``idx[g]`` of the source into slot g % 2 (started at step g - 1,
    or at step 0 for itself), waits for it, and adds it in; ``idx[g] < 0``: no copy."""
    g = pl.program_id(0)

    def copy(step):
        return pltpu.make_async_copy(src_hbm.at[pl.ds(idx_ref[step], 1)],
                                     buf.at[pl.ds(step % 2, 1)], sem.at[step % 2])

    @pl.when(g == 0)
    def _():
        acc[...] = jnp.zeros_like(acc)
        copy(0).start()

    @pl.when((g + 1 < STEPS) & (idx_ref[jnp.minimum(g + 1, STEPS - 1)] >= 0))
    def _():
        copy(g + 1).start()

    @pl.when(idx_ref[g] >= 0)
    def _():
        copy(g).wait()
        acc[...] += buf[pl.ds(g % 2, 1)] * (g + 1).astype(jnp.float32)

    o_ref[...] = jnp.broadcast_to(acc[...], (ROWS, C))


def _call(seed, **params):
    def f(idx, src):
        return pl.pallas_call(
            _kernel, out_shape=jax.ShapeDtypeStruct((STEPS * ROWS, C), jnp.float32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(STEPS,),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec((ROWS, C), lambda g, idx: (g, 0)),
                scratch_shapes=[pltpu.VMEM((2, C), jnp.float32), pltpu.VMEM((1, C), jnp.float32),
                                pltpu.SemaphoreType.DMA((2,))]),
            interpret=InterpretParams(random_seed=seed, **params))(idx, src)
    return jax.jit(f)


def _expected(idx, src):
    acc, out = np.zeros(C), []
    for g, i in enumerate(idx):
        if i >= 0:
            acc = acc + np.float64(src[i]) * (g + 1)
        out.append(np.broadcast_to(acc, (ROWS, C)))
    return np.concatenate(out)


def test_branches_not_taken_flag_nothing_and_results_are_the_simulators(always_worth):
    src = np.random.default_rng(0).standard_normal((16, C)).astype(np.float32)
    idx = np.asarray([3, -1, 15, 0, -7, -1, 9, 2], np.int32)  # (negative: no copy)
    call = _call(201)
    before = compiled_launch.STATS.copy()
    outs = [np.asarray(call(idx, src)) for _ in range(WHOLE_LAUNCH + 1)]
    assert compiled_launch.STATS["compiled"] - before["compiled"] == 2
    assert sum(compiled_launch.STATS.values()) - sum(before.values()) == 2  # no flag
    simulated = np.asarray(_call(202, compile_segments=False)(idx, src))
    for out in outs:
        np.testing.assert_array_equal(out, simulated)
    np.testing.assert_allclose(simulated, _expected(idx, src), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad, error, flag", [
    (16, OutOfBoundsError, "an access out of bounds"),
])
def test_a_branch_taken_out_of_bounds_is_the_simulators_error(always_worth, bad, error, flag):
    src = np.random.default_rng(1).standard_normal((16, C)).astype(np.float32)
    idx = np.asarray([3, 1, 15, 0, 4, 5, 9, 2], np.int32)
    call = _call(203)
    for _ in range(WHOLE_LAUNCH):
        call(idx, src).block_until_ready()
    before = compiled_launch.STATS.copy()
    idx[5] = bad  # started at step 4, in the prefetch branch
    with pytest.raises(error), errors_as_raised():
        call(idx, src).block_until_ready()
    assert compiled_launch.STATS[flag] == before[flag] + 1
    assert compiled_launch.STATS["compiled"] == before["compiled"]
