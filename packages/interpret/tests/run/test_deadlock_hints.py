"""A deadlock whose waiting core waits on a semaphore nothing ever reached (no DMA
started on it, no signal) says so, naming the semaphore and the wait's line; a wait
that something did reach gets no such hint."""

import inspect

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi

pytestmark = pytest.mark.timeout(120)

X = jnp.ones((8, 128), jnp.float32)


def _line(fn, text):
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def wait_without_start(x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.wait()  # BUG: never started
    o_ref[...] = buf[...]


def _dma_call(kernel):
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        interpret=pi.InterpretParams())


@pytest.mark.parametrize("call_number", [1, 3])  # 3: a compiled launch's deadlock flag
def test_a_dma_wait_whose_copy_was_never_started(call_number):
    call = _dma_call(wait_without_start)
    for _ in range(call_number - 1):
        with pytest.raises(pi.DeadlockError):
            call(X)
    with pytest.raises(pi.DeadlockError) as info:
        call(X)
    first, *rest = str(info.value).splitlines()
    assert first == "deadlock: every core is blocked and no DMA can make progress."
    line = _line(wait_without_start, "copy.wait()")
    assert rest == [
        f"  device 0 core 0 waits on DMA semaphore 'sem' (id 1) for 4096 bytes, count 0 "
        f"bytes at kernel 'wait_without_start', grid point (), device 0 core 0 "
        f"(test_deadlock_hints.py:{line}); no DMA was ever started on 'sem' and nothing "
        f"signalled it: start the copy (.start()) before its .wait()"]


def test_a_regular_semaphore_nobody_signals():
    def lonely_kernel(x_ref, o_ref, sems):
        pl.semaphore_wait(sems.at[1], 1)
        o_ref[...] = x_ref[...]

    call = pl.pallas_call(lonely_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          scratch_shapes=[pltpu.SemaphoreType.REGULAR((2,))],
                          interpret=pi.InterpretParams())
    with pytest.raises(pi.DeadlockError) as info:
        call(X)
    assert str(info.value).splitlines()[1].endswith(
        "; nothing ever signalled 'sems[1]' (no semaphore_signal, remote signal or DMA "
        "reached it)")


def test_a_wait_for_more_than_was_signalled_gets_no_such_hint():
    def short_kernel(x_ref, o_ref, sem):
        pl.semaphore_signal(sem, 1)
        pl.semaphore_wait(sem, 2)  # one signal short: nothing says "never signalled"
        o_ref[...] = x_ref[...]

    call = pl.pallas_call(short_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          scratch_shapes=[pltpu.SemaphoreType.REGULAR],
                          interpret=pi.InterpretParams())
    with pytest.raises(pi.DeadlockError) as info:
        call(X)
    text = str(info.value)
    assert "waits on semaphore 'sem' (id 1) for 2, count 1" in text
    assert "never" not in text and "nothing ever" not in text
