"""A remote DMA into a peer core's ``run_scoped`` buffer before the peer entered the scope.

Scoped VMEM/SMEM has a static address on a TPU, so the DMA lands where the buffer will be
and the peer's scope holds those bytes when it enters it. palladium models that: the
peer's allocation at that position adopts the buffer the DMA wrote. Before, 6 of 10 seeds
failed with a bare ``KernelError: no buffer corresponding to 'flag' on device 0 core 1``.
A peer whose allocation at that position is a different buffer is a full ``KernelError``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _launch_harness import core_map_call
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams, KernelError, errors_as_raised

MESH_ID = pl.DeviceIdType.MESH


def _copy(x_ref, flag, send, recv):
    return pltpu.make_async_remote_copy(x_ref, flag, send, recv, device_id={"core": 1},
                                        device_id_type=MESH_ID)


def _run(kernel, params, x):
    with errors_as_raised():
        return np.asarray(core_map_call(kernel, params)(x))


def _send_into_peer_scope(x_ref, o_ref):
    """core 0 sends x into core 1's scoped 'flag' (waiting only for the send); core 1
    waits for the receive and copies 'flag' out. Which core enters the scope first is up
    to the seed."""
    c = jax.lax.axis_index("core")

    def scoped(flag, send, recv):
        @pl.when(c == 0)
        def _():
            copy = _copy(x_ref, flag, send, recv)
            copy.start()
            copy.wait_send()

        @pl.when(c == 1)
        def _():
            _copy(x_ref, flag, send, recv).wait_recv()
            pltpu.sync_copy(flag, o_ref)

    pl.run_scoped(scoped, pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA,
                  pltpu.SemaphoreType.DMA)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dma_order", ["issue", "random"])
def test_dma_into_a_scope_the_peer_has_not_entered_lands(dma_order):
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128) + 1
    for seed in range(10):
        params = InterpretParams(random_seed=seed, dma_order=dma_order, detect_races=True,
                                 watchdog_timeout=60)
        np.testing.assert_array_equal(_run(_send_into_peer_scope, params, x), np.asarray(x),
                                      err_msg=f"seed {seed}")


def _peer_allocates_something_else(x_ref, o_ref):
    """core 0 sends into core 1's 'flag' and then tells core 1 to go on; core 1 then
    allocates a differently shaped buffer at that position."""
    c = jax.lax.axis_index("core")

    def outer(go):
        @pl.when(c == 0)
        def _():
            def scoped(flag, send, recv):
                copy = _copy(x_ref, flag, send, recv)
                copy.start()
                copy.wait_send()
                pl.semaphore_signal(go, 1, device_id={"core": 1}, device_id_type=MESH_ID)

            pl.run_scoped(scoped, pltpu.VMEM((8, 128), jnp.float32),
                          pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA)

        @pl.when(c == 1)
        def _():
            pl.semaphore_wait(go, 1)

            def other(buf):
                buf[...] = jnp.zeros_like(buf)
                pltpu.sync_copy(buf.at[pl.ds(0, 8)], o_ref)

            pl.run_scoped(other, pltpu.VMEM((16, 128), jnp.float32))

    pl.run_scoped(outer, pltpu.SemaphoreType.REGULAR)


@pytest.mark.timeout(120)
def test_peer_allocating_a_different_buffer_there_is_a_kernel_error():
    x = jnp.ones((8, 128), jnp.float32)
    with pytest.raises(KernelError) as info:
        _run(_peer_allocates_something_else, InterpretParams(watchdog_timeout=60), x)
    text = str(info.value)
    assert ("a remote DMA wrote 'flag' (float32[8, 128]) on device 0 core 1 before that "
            "core allocated it, but the core's allocation at that position is 'buf' "
            "(float32[16, 128])") in text
    assert "test_early_remote_dma.py" in text
