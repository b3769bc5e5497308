"""An HBM buffer that the cores of a core_map allocate in ``run_scoped`` is one buffer of
the device, alive until every core has left the scope."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _launch_harness import core_map_call
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams


def _handoff(first, mode, space, seed=0):
    """Core ``first`` copies x into the scoped HBM buffer and leaves the scope, then signals
    the other core, which only then copies the buffer into the output."""
    second = 1 - first
    params = InterpretParams(detect_races=True, allow_hbm_allocation_in_run_scoped=True,
                             dma_execution_mode=mode, random_seed=seed)

    def kernel(x_ref, o_ref):
        c = jax.lax.axis_index("core")

        def with_flag(flag):
            @pl.when(c == second)
            def _():
                pl.semaphore_wait(flag, 1)

            def scoped(shared):
                @pl.when(c == first)
                def _():
                    pltpu.sync_copy(x_ref, shared)

                @pl.when(c == second)
                def _():
                    pltpu.sync_copy(shared, o_ref)

            pl.run_scoped(scoped, space(x_ref.shape, x_ref.dtype))

            @pl.when(c == first)
            def _():
                pl.semaphore_signal(flag, 1, core_index=second)

        pl.run_scoped(with_flag, pltpu.SemaphoreType.REGULAR)

    return core_map_call(kernel, params)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("space", [pltpu.HBM, pl.ANY])
@pytest.mark.parametrize("mode", ["eager", "on_wait"])
@pytest.mark.parametrize("first", [0, 1])
def test_scoped_hbm_buffer_outlives_the_first_core_to_leave(first, mode, space):
    x = jnp.arange(16 * 128, dtype=jnp.int32).reshape(16, 128)
    np.testing.assert_array_equal(_handoff(first, mode, space)(x), x)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", range(4))
def test_scoped_hbm_buffer_is_shared_whichever_core_is_scheduled_first(seed):
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128) / 7
    np.testing.assert_array_equal(_handoff(0, "on_wait", pltpu.HBM, seed)(x), x)
