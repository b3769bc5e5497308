"""Scheduling points and the watchdog: a core polling a DMA's destination or semaphore
sees the DMA land (pending DMAs progress at ``pl.delay`` and semaphore reads, seeded, as
DMA engines run on their own on hardware); a launch that loops forever fails with
``WatchdogError`` naming each core's state and line; sites name device and core.

The polling kernels hung in the default ``on_wait`` mode before (the DMA's write waited
for someone to wait on its receive semaphore). A hang inside XLA cannot be interrupted by
a signal, so those tests time out by thread.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _launch_harness import core_map_call
from _multi_device_harness import mesh, on_devices, sharded
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams, WatchdogError, errors_as_raised
from palladium.interpret.eval.site import Site


def _ring_poll(x_ref, o_ref, send, recv, count, *, n, poll):
    """Send x to the right neighbour's o, wait only for the send, then poll for the
    neighbour's DMA into o: its destination (with pl.delay) or its semaphore."""
    me = jax.lax.axis_index("x")
    o_ref[...] = jnp.zeros_like(o_ref)
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=((me + 1) % n,),
                                        device_id_type=pl.DeviceIdType.MESH)
    copy.start()
    copy.wait_send()
    if poll == "destination":
        def spin(i):
            pl.delay(10)
            return i + 1

        count[0] = jax.lax.while_loop(lambda i: o_ref[0, 0] == 0, spin, 0)
    else:
        count[0] = jax.lax.while_loop(lambda i: pl.semaphore_read(recv) == 0,
                                      lambda i: i + 1, 0)
    copy.wait_recv()


@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("dma_order", ["issue", "random"])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("poll", ["destination", "semaphore"])
def test_polling_sees_a_dma_nobody_waits_for(poll, seed, dma_order):
    n = 2
    params = InterpretParams(random_seed=seed, dma_order=dma_order, rendezvous_timeout=30,
                             watchdog_timeout=30)

    def f(x):
        return pl.pallas_call(
            functools.partial(_ring_poll, n=n, poll=poll),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.SemaphoreType.DMA] * 2 + [pltpu.SMEM((1,), jnp.int32)],
            interpret=params)(x)

    x = jnp.arange(n * 8 * 128, dtype=jnp.float32).reshape(n * 8, 128) + 1
    out = np.asarray(on_devices(f, n)(sharded(x, mesh(n))))
    expected = np.roll(np.asarray(x).reshape(n, 8, 128), 1, axis=0).reshape(x.shape)
    np.testing.assert_array_equal(out, expected)


def _spin_and_wait(params, *, delay):
    """core 0 loops forever (with or without pl.delay), core 1 waits on a semaphore
    nobody signals."""

    def kernel(x_ref, o_ref):
        c = jax.lax.axis_index("core")

        def scoped(sem, count):
            @pl.when(c == 0)
            def _():
                def spin(n):
                    if delay:
                        pl.delay(10)  # delay line
                    return n + 1

                count[0] = jax.lax.while_loop(lambda n: n >= 0, spin, 0)  # spin line

            @pl.when(c == 1)
            def _():
                pl.semaphore_wait(sem, 1)  # wait line
                o_ref[...] = x_ref[...]

        pl.run_scoped(scoped, pltpu.SemaphoreType.REGULAR, pltpu.SMEM((1,), jnp.int32))

    f = core_map_call(kernel, params)

    return f(jnp.ones((8, 128), jnp.float32))


def _line_of(marker):
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if line.rstrip().endswith(marker) and "_line_of" not in line:
                return i
    raise AssertionError(marker)


@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("delay", [True, False])
def test_watchdog_reports_a_looping_core_and_a_blocked_one(delay):
    with pytest.raises(WatchdogError) as info, errors_as_raised():
        _spin_and_wait(InterpretParams(watchdog_timeout=0.5), delay=delay)
    text = str(info.value)
    assert "watchdog: the run is still going after 0.5 s" in text
    # The loop's line, or (whichever the watchdog fired at) the pl.delay's inside it.
    lines = [_line_of("# spin line")] + ([_line_of("# delay line")] if delay else [])
    wait = _line_of("# wait line")
    assert "device 0 core 0 is looping at kernel 'kernel'" in text
    assert any(f"(test_scheduling_points.py:{line})" in text for line in lines)
    assert ("device 0 core 1 is blocked: waits on semaphore 'sem' (id 1) for 1, count 0 at "
            "kernel 'kernel'") in text
    assert f"(test_scheduling_points.py:{wait})" in text
    assert "InterpretParams(watchdog_timeout=...)" in text


def test_watchdog_timeout_is_validated():
    assert InterpretParams().watchdog_timeout == 300.0
    assert InterpretParams(watchdog_timeout=None).watchdog_timeout is None
    for bad in (0, -1.0, float("nan"), float("inf"), True, "10"):
        with pytest.raises(ValueError, match="watchdog_timeout"):
            InterpretParams(watchdog_timeout=bad)


def test_site_names_device_and_core_on_every_device():
    for device in (0, 1):
        text = str(Site(kernel="k", core=(device, 0), grid_point=(2,), source_info="k.py:3"))
        assert text == f"kernel 'k', grid point (2,), device {device} core 0 (k.py:3)"
