"""VMEM and SMEM accounting: a kernel that needs more per core than the simulated TPU
gives it raises ``TpuResourceError`` before it runs; its near twin (a raised
``vmem_limit_bytes``, fewer buffers, smaller blocks) runs."""

import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams, KernelError, LoggingMode, TpuResourceError
from palladium.interpret.observe.observers import add_launch_observer, remove_launch_observer

MiB = 2**20
ROWS = 1024  # (1024, 1024) float32 blocks: 4 MiB each


def _add_call(chip, *, in_buffers=None, vmem_limit_bytes=None, rows=ROWS, check_lowering=True):
    """x + y over a (2, 1) grid of (rows, 1024) float32 blocks: 2 inputs and 1 output,
    each double-buffered unless ``in_buffers``."""

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    mode = {} if in_buffers is None else {"pipeline_mode": pl.Buffered(in_buffers)}
    in_spec = pl.BlockSpec((rows, 1024), lambda i: (i, 0), **mode)
    params = (None if vmem_limit_bytes is None
              else pltpu.CompilerParams(vmem_limit_bytes=vmem_limit_bytes))
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((2 * rows, 1024), jnp.float32), grid=(2,),
        in_specs=[in_spec, in_spec], out_specs=pl.BlockSpec((rows, 1024), lambda i: (i, 0)),
        compiler_params=params,
        interpret=InterpretParams(chip=chip, check_lowering=check_lowering))


@pytest.fixture(scope="module")
def xy():
    x = jnp.arange(2 * ROWS * 1024, dtype=jnp.float32).reshape(2 * ROWS, 1024)
    return x, x * 0.5


@pytest.mark.parametrize("chip", ["v4", "v5e"])
def test_double_buffered_blocks_over_the_default_limit(chip, xy):
    # 3 operands x 2 buffers x 4 MiB = 24 MiB > 16 MiB, XLA's default before v6e.
    with pytest.raises(TpuResourceError) as info:
        _add_call(chip)(*xy)
    msg = str(info.value)
    assert isinstance(info.value, KernelError)
    assert msg.startswith("kernel 'kernel' (pallas_call at test_memory_budget.py:")
    assert (f"needs 24.00 MiB ({24 * MiB} bytes) of VMEM per core on TPU {chip}, more than "
            f"its scoped VMEM limit of 16.00 MiB (XLA's default on {chip})") in msg
    assert 'Ran out of memory in memory space vmem' in msg
    for name in ("x_ref", "y_ref"):
        assert (f"input '{name}' block (1024, 1024) float32: 4.00 MiB x 2 buffers = 8.00 MiB"
                in msg)
    assert "output 'o_ref' block (1024, 1024) float32: 4.00 MiB x 2 buffers" in msg
    if chip == "v4":  # 16 MiB is all the VMEM a v4 core has
        assert "Even the core's whole VMEM (16.00 MiB) is too small" in msg
    else:
        assert f"vmem_limit_bytes=...) to at least {24 * MiB} (up to the core's 128.00 MiB)" in msg
    assert "pl.Buffered(1)" in msg


def test_the_same_kernel_fits_v6e_default_limit(xy):
    x, y = xy
    np.testing.assert_array_equal(_add_call("v6e")(x, y), np.asarray(x + y))


def test_a_raised_vmem_limit_fits(xy):
    x, y = xy
    np.testing.assert_array_equal(_add_call("v5e", vmem_limit_bytes=24 * MiB)(x, y),
                                  np.asarray(x + y))


def test_single_buffered_inputs_fit(xy):
    x, y = xy  # 2 x 4 + 2 x 4 = 16 MiB: exactly the limit
    np.testing.assert_array_equal(_add_call("v5e", in_buffers=1)(x, y), np.asarray(x + y))


def test_three_buffers_count_three(xy):
    # (jax 0.10.2's Mosaic lowers only Buffered(1) and (2) in a BlockSpec: the lowering
    # check would say so first.)
    with pytest.raises(TpuResourceError, match=r"x 3 buffers = 12\.00 MiB"):
        _add_call("v5e", in_buffers=3, check_lowering=False)(*xy)  # 2 x 12 + 8 = 32 MiB


def test_a_vmem_limit_above_capacity_is_capped(xy):
    # v4 has 16 MiB of VMEM per core: asking for 32 MiB does not make 24 MiB fit.
    with pytest.raises(TpuResourceError) as info:
        _add_call("v4", vmem_limit_bytes=32 * MiB)(*xy)
    msg = str(info.value)
    assert ("more than the core's VMEM capacity of 16.00 MiB "
            f"(vmem_limit_bytes={32 * MiB} is more than there is)") in msg
    assert "Even the core's whole VMEM (16.00 MiB) is too small" in msg


@pytest.mark.parametrize("chip", ["v4", "v5e", "v6e"])
def test_huge_scratch_is_an_error_and_small_scratch_runs(chip):
    def call(rows):
        def kernel(x_ref, o_ref, acc_ref):
            acc_ref[0:8] = x_ref[...]
            o_ref[...] = acc_ref[0:8] * 2

        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                              scratch_shapes=[pltpu.VMEM((rows, 128), jnp.float32)],
                              interpret=InterpretParams(chip=chip))

    x = jnp.ones((8, 128), jnp.float32)
    with pytest.raises(TpuResourceError) as info:
        call(512 * 1024)(x)  # 256 MiB
    msg = str(info.value)
    assert f"needs 256.01 MiB ({256 * MiB + 2 * 4096} bytes) of VMEM per core on TPU {chip}" in msg
    assert "scratch 'acc_ref' (524288, 128) float32: 256.00 MiB" in msg
    assert "input 'x_ref' block (8, 128) float32: 4096 bytes" in msg  # no grid: one buffer
    assert "Ran out of memory in memory space vmem" in msg
    np.testing.assert_array_equal(call(1024)(x), 2.0)


def _scoped_call(nested):
    """Two 10 MiB run_scoped buffers, one after the other or one inside the other."""

    def kernel(x_ref, o_ref):
        def inner(b):
            b[0:8] = x_ref[...]
            o_ref[...] += b[0:8]

        def outer(a):
            a[0:8] = x_ref[...]
            o_ref[...] += a[0:8]
            if nested:
                pl.run_scoped(inner, pltpu.VMEM((20 * 1024, 128), jnp.float32))

        o_ref[...] = jnp.zeros_like(o_ref)
        pl.run_scoped(outer, pltpu.VMEM((20 * 1024, 128), jnp.float32))
        if not nested:
            pl.run_scoped(inner, pltpu.VMEM((20 * 1024, 128), jnp.float32))

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          interpret=InterpretParams(chip="v5e"))


def test_run_scoped_counts_its_peak_nesting():
    x = jnp.ones((8, 128), jnp.float32)
    np.testing.assert_array_equal(_scoped_call(nested=False)(x), 2.0)  # 10 MiB at a time
    with pytest.raises(TpuResourceError) as info:
        _scoped_call(nested=True)(x)  # 20 MiB at once
    msg = str(info.value)
    assert msg.count("run_scoped '") == 2, msg
    assert re.search(r"run_scoped '\S+' \(20480, 128\) float32: 10\.00 MiB", msg)


@pytest.mark.parametrize("chip", ["v4", "v5e", "v6e"])
def test_smem_scalar_prefetch_over_capacity(chip):
    def call(n):
        def kernel(s_ref, x_ref, o_ref):
            o_ref[...] = x_ref[...] + s_ref[n - 1].astype(jnp.float32)

        spec = pl.BlockSpec((8, 128), lambda i, s: (0, 0))
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,),
                                                   in_specs=[spec], out_specs=spec),
            interpret=InterpretParams(chip=chip))

    x = jnp.zeros((8, 128), jnp.float32)
    n = 512 * 1024  # 2 MiB of int32: more than SMEM's 1 MiB
    with pytest.raises(TpuResourceError) as info:
        call(n)(jnp.ones((n,), jnp.int32), x)
    msg = str(info.value)
    assert f"of SMEM per core on TPU {chip}, more than the core's SMEM capacity" in msg
    assert "Ran out of memory in memory space smem" in msg
    assert "scalar prefetch 's_ref' (524288,) int32: 2.00 MiB" in msg
    np.testing.assert_array_equal(call(16)(jnp.full((16,), 3, jnp.int32), x), 3.0)


def test_each_launch_exposes_its_memory_use():
    seen = []

    def factory(info):
        seen.append(info.memory)

    def kernel(x_ref, o_ref, acc_ref, s_ref):
        acc_ref[...] = jnp.zeros_like(acc_ref)
        s_ref[0] = 1
        o_ref[...] = x_ref[...] + 1

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32), grid=(2,),
        in_specs=[spec], out_specs=spec,
        scratch_shapes=[pltpu.VMEM((3, 5), jnp.float32), pltpu.SMEM((4,), jnp.int32)],
        interpret=InterpretParams(chip="v6e"))
    add_launch_observer(factory)
    try:
        call(jnp.zeros((16, 128), jnp.float32))
    finally:
        remove_launch_observer(factory)
    [use] = seen
    # 2 blocks x 2 buffers x 4096 bytes, and the (3, 5) scratch padded to (4, 128).
    assert use.vmem.peak_bytes == 4 * 4096 + 4 * 128 * 4
    assert use.vmem.limit_bytes == 32 * MiB and use.vmem.capacity_bytes == 128 * MiB
    # The (4,) int32 SMEM scratch: one 512-byte unit of the compiler's SMEM allocation.
    assert use.smem.peak_bytes == 512 and use.chip == "v6e"
    assert [(b.kind, b.name, b.count) for b in use.vmem.buffers] == [
        ("input", "x_ref", 2), ("output", "o_ref", 2), ("scratch", "acc_ref", 1)]


def test_large_intermediates_are_reported_not_raised(caplog):
    def kernel(x_ref, o_ref):
        big = jnp.ones((4096, 1024), jnp.float32) * x_ref[0, 0]  # 16 MiB value
        o_ref[...] = big[0:8, 0:128]

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          interpret=InterpretParams(chip="v5e", logging_mode=LoggingMode.LAUNCH))
    with caplog.at_level(logging.DEBUG, logger="palladium.interpret"):
        out = call(jnp.full((8, 128), 2.0, jnp.float32))
    np.testing.assert_array_equal(out, 2.0)
    [line] = [r.getMessage() for r in caplog.records if "VMEM" in r.getMessage()]
    assert "VMEM 8192 bytes of 16.00 MiB" in line
    assert re.search(r"intermediates up to (1[6-9]|[2-9]\d)\.\d\d MiB", line), line
