"""A multi-device launch's HBM outputs live in one block per output, kept with the kernel
and reused by its next launch only when nothing refers to it (``run.output_blocks``)."""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _multi_device_harness import ANY, run_on_devices
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams
from palladium.interpret.run import output_blocks
from palladium.interpret.run.output_blocks import KEPT, kept_blocks, output_storage


class _Kernel:  # a stand-in for a PreparedKernel: anything weakly referable
    pass


def test_slices_of_one_block_reused_once_nothing_refers_to_it():
    kernel = _Kernel()
    first = output_storage(kernel, (4, 8), np.float32, 3)
    assert [a.shape for a in first] == [(4, 8)] * 3
    assert all(a.dtype == np.float32 and a.flags.writeable and a.flags.c_contiguous
               for a in first)
    block = first[0].base
    assert all(a.base is block for a in first) and block.shape == (3, 4, 8)
    for d, a in enumerate(first):  # each device's slice is its own part of the block
        a[...] = d
    np.testing.assert_array_equal(block, np.arange(3)[:, None, None] * np.ones((4, 8)))
    block_ref = weakref.ref(block)
    del a, first
    again = output_storage(kernel, (4, 8), np.float32, 3)
    assert again[0].base is not block  # this test still holds it
    del again, block
    again = output_storage(kernel, (4, 8), np.float32, 3)
    assert again[0].base is block_ref()
    assert kept_blocks(kernel) == 2  # the one made while the test held the first


def test_a_block_still_referred_to_is_not_handed_out():
    kernel = _Kernel()
    first = output_storage(kernel, (2,), np.int32, 2)
    kept = first[1][1:]  # a view of a view of the block, as a result would be
    del first
    second = output_storage(kernel, (2,), np.int32, 2)
    assert second[0].base is not kept.base
    third = output_storage(kernel, (2,), np.int32, 2)  # both kept blocks in use
    assert third[0].base is not kept.base and third[0].base is not second[0].base
    assert kept_blocks(kernel) == KEPT
    del second, third
    # the first block is still referred to: the second one comes back
    fourth = output_storage(kernel, (2,), np.int32, 2)
    assert fourth[0].base is not kept.base


def test_other_shapes_and_single_devices_get_their_own_arrays():
    kernel = _Kernel()
    a = output_storage(kernel, (2,), np.int32, 2)[0].base
    assert output_storage(kernel, (3,), np.int32, 2)[0].base is not a
    assert output_storage(kernel, (2,), np.float32, 2)[0].base is not a
    assert output_storage(kernel, (2,), np.int32, 4)[0].base is not a
    single = output_storage(kernel, (2,), np.int32, 1)
    assert single[0].base is None and single[0].shape == (2,)
    assert kept_blocks(kernel) == 4  # the single device's array is not kept
    zero_d = output_storage(kernel, (), np.float32, 2)
    assert [z.shape for z in zero_d] == [(), ()] and zero_d[0].base is zero_d[1].base


def test_the_blocks_go_with_the_kernel():
    kernel = _Kernel()
    output_storage(kernel, (2,), np.int32, 2)
    assert kept_blocks(kernel) == 1
    del kernel
    gc.collect()
    assert not any(isinstance(k, _Kernel) for k in list(output_blocks._BLOCKS))


def _half_written(x, *, n):
    """Each device writes the first half of its (2, 8, 128) output: the second half is
    whatever uninitialised HBM holds (the fill value)."""

    def kernel(x_ref, o_ref, sem):
        pltpu.make_async_copy(x_ref, o_ref.at[0], sem).start()
        pltpu.make_async_copy(x_ref, o_ref.at[0], sem).wait()

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((2, *x.shape), x.dtype),
        in_specs=[ANY], out_specs=ANY, scratch_shapes=[pltpu.SemaphoreType.DMA(())],
        interpret=InterpretParams(uninitialized_reads="off"),
    )(x)


@pytest.mark.timeout(120)
def test_every_launch_sees_fresh_uninitialised_outputs():
    # The second launch reuses the first one's block (written with data): the part
    # nothing writes must read the fill value again, the rest the new data.
    n = 2
    for step in range(3):
        x = jnp.arange(n * 8 * 128, dtype=jnp.float32).reshape(n * 8, 128) + 1000 * step
        out = run_on_devices(_half_written, n, x)
        assert out.shape == (n * 2, 8, 128)
        for d in range(n):
            np.testing.assert_array_equal(out[2 * d], np.asarray(x)[8 * d:8 * (d + 1)])
            assert np.isnan(out[2 * d + 1]).all()
