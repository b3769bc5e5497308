"""``dma_order="random"`` explores completion order across semaphores: two DMAs into the
same buffer on different semaphores may complete in either order whichever is waited for
first (as on hardware), so ``dma_order_trials`` catches a kernel depending on it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import DmaOrderDependenceError, InterpretParams, errors_as_raised

ANY = pl.BlockSpec(memory_space=pl.ANY)


def _two_dmas_one_buffer(params, wait_order=(0, 1)):
    def kernel(a_ref, b_ref, o_ref, sems):
        copies = [pltpu.make_async_copy(a_ref, o_ref, sems.at[0]),
                  pltpu.make_async_copy(b_ref, o_ref, sems.at[1])]
        for c in copies:
            c.start()
        for i in wait_order:
            copies[i].wait()

    a = jnp.zeros((8, 128), jnp.float32)
    b = jnp.ones((8, 128), jnp.float32)
    return np.asarray(pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[ANY, ANY], out_specs=ANY,
        scratch_shapes=[pltpu.SemaphoreType.DMA((2,))], interpret=params)(a, b))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("wait_order", [(0, 1), (1, 0)])
def test_random_order_gives_both_outcomes_over_seeds(wait_order):
    outcomes = {
        float(_two_dmas_one_buffer(InterpretParams(dma_order="random", random_seed=s),
                                   wait_order)[0, 0])
        for s in range(20)
    }
    assert outcomes == {0.0, 1.0}


@pytest.mark.timeout(120)
def test_issue_order_is_deterministic():
    outs = {float(_two_dmas_one_buffer(InterpretParams(random_seed=s))[0, 0]) for s in range(5)}
    assert outs == {1.0}  # issue order: the second DMA lands last


@pytest.mark.timeout(120)
def test_dma_order_trials_report_the_cross_semaphore_dependence():
    with pytest.raises(DmaOrderDependenceError, match=r"output 'o_ref' on device 0") as info, \
            errors_as_raised():
        _two_dmas_one_buffer(InterpretParams(dma_order="random", dma_order_trials=8))
    assert "a_ref->o_ref" in str(info.value) and "b_ref->o_ref" in str(info.value)
