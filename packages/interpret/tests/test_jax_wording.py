"""Errors keep palladium's details and also contain the phrase jax's TPU interpreter
uses for the same condition (tests written against jax match it); kernels that are wrong
whatever their inputs fail when they are prepared, with a ValueError, as in jax."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _launch_harness import blocked_call, out_of_bounds_block_call, revisit_call
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import (
    InterpretParams,
    InvalidKernelError,
    KernelError,
    OutOfBoundsError,
    RevisitError,
    errors_as_raised,
)

P = InterpretParams()
X = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)


def copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def test_out_of_bounds_input_block_names_the_block_index_as_jax_does():
    with pytest.raises(OutOfBoundsError) as info, errors_as_raised():
        out_of_bounds_block_call(copy_kernel, P)(X[:8])
    msg = str(info.value)
    assert re.search(r'Out-of-bounds block index \(5, 0\) for input "x_ref" in iteration \(0,\)',
                     msg), msg
    assert "kernel 'copy_kernel'" in msg and "'x_ref (HBM)'" in msg and "[40:48, 0:128]" in msg


def test_out_of_bounds_output_block_names_the_block_index_as_jax_does():
    call = blocked_call(copy_kernel, rows=8, grid=(1,), in_map=lambda i: (0, 0),
                        out_map=lambda i: (3, 0), interpret=P)
    with pytest.raises(OutOfBoundsError) as info, errors_as_raised():
        call(X[:8])
    assert 'Out-of-bounds block index (3, 0) for output "o_ref" in iteration (0,)' in str(
        info.value)


def test_revisit_names_output_number_block_and_iteration_as_jax_does():
    with pytest.raises(RevisitError) as info, errors_as_raised():
        revisit_call(copy_kernel, P)(X)
    msg = str(info.value)
    assert "Revisited block (0, 0) of output 0 in iteration (1, 0)" in msg, msg
    assert "output 'o_ref' block (0, 0) is revisited at grid point (1, 0)" in msg


@pytest.mark.parametrize("start, phrase", [(12, "Out-of-bounds read of 'x_ref'"),
                                           (-1, "Out-of-bounds read of 'x_ref'")])
def test_out_of_bounds_ref_read_says_out_of_bounds_read(start, phrase):
    def kernel(s_ref, x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(s_ref[0], 8), :]

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec((16, 128), lambda: (0, 0))],
        interpret=P)
    with pytest.raises(OutOfBoundsError, match=re.escape(phrase)), errors_as_raised():
        call(jnp.array([start], jnp.int32), X)


def test_out_of_bounds_dma_write_says_out_of_bounds_write_by_a_dma():
    def kernel(s_ref, x_hbm, o_ref, buf, sem):
        pltpu.async_copy(x_hbm, buf.at[pl.ds(s_ref[0], 16)], sem).wait()
        o_ref[...] = buf[...]

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        interpret=P)
    with pytest.raises(OutOfBoundsError) as info, errors_as_raised():
        call(jnp.array([4], jnp.int32), X)
    assert "Out-of-bounds write by a DMA: DMA write of 'buf' (VMEM, device 0 core 0): region " \
        "[4:20, 0:128]" in str(info.value), str(info.value)


def test_out_of_bounds_masked_store_says_out_of_bounds_masked_swap():
    def kernel(s_ref, x_ref, o_ref):
        mask = jnp.arange(16)[:, None] + jnp.zeros((16, 128), jnp.int32) < 14
        pltpu.store(o_ref.at[pl.ds(s_ref[0], 16)], x_ref[...], mask=mask)

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec((16, 128), lambda: (0, 0))],
        interpret=P)
    with pytest.raises(OutOfBoundsError, match="Out-of-bounds masked swap of 'o_ref'"), \
            errors_as_raised():
        call(jnp.array([4], jnp.int32), X)


@pytest.mark.parametrize("space", [pl.ANY, pltpu.HBM])
@pytest.mark.parametrize("side, prim", [("read", "get_p"), ("write", "swap_p"),
                                        ("load", "load_p"), ("store", "swap_p")])
def test_direct_hbm_access_fails_at_trace_time_with_a_value_error(space, side, prim):
    def kernel(in_ref, o_ref):
        if side == "read":
            o_ref[...] = in_ref[...]
        elif side == "load":
            o_ref[...] = pltpu.load(in_ref)
        elif side == "write":
            o_ref[...] = in_ref[...] * 2
        else:
            pltpu.store(o_ref, in_ref[...])

    hbm_in = side in ("read", "load")
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=space if hbm_in else pltpu.VMEM)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM if hbm_in else space),
        interpret=P)
    # jax.jit(...).lower runs palladium's lowering, which prepares the kernel: no launch.
    with pytest.raises(InvalidKernelError) as info:
        jax.jit(call).lower(X)
    msg = str(info.value)
    name = "in_ref" if hbm_in else "o_ref"
    assert isinstance(info.value, ValueError) and isinstance(info.value, KernelError)
    assert f"of '{name}', which lives in HBM" in msg and "kernel 'kernel'" in msg
    assert "test_jax_wording.py:" in msg
    assert (f"{prim}: Buffers with a memory space of HBM or ANY cannot be referenced directly. "
            f"Instead, use `pltpu.sync_copy` or `pltpu.async_copy`.") in msg


def test_direct_hbm_access_inside_control_flow_is_found_and_named():
    def kernel(in_ref, o_ref):
        @pl.when(o_ref[0, 0] >= 0)
        def _():
            o_ref[...] = in_ref[...]

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)], interpret=P)
    with pytest.raises(ValueError, match="read of 'in_ref', which lives in HBM"):
        call(X)


@pytest.mark.parametrize("space", [pl.ANY, pltpu.HBM])
def test_hbm_allocation_in_run_scoped_fails_at_trace_time_unless_allowed(space):
    def kernel(x_ref, o_ref):
        def body(tmp, sem):
            pltpu.async_copy(x_ref, tmp, sem).wait()
            pltpu.async_copy(tmp, o_ref, sem).wait()

        pl.run_scoped(body, space((16, 128), jnp.float32), pltpu.SemaphoreType.DMA)

    def call(params):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY), interpret=params)

    with pytest.raises(InvalidKernelError) as info:
        jax.jit(call(P)).lower(X)
    msg = str(info.value)
    assert "run_scoped allocates 'tmp' in HBM" in msg and "kernel 'kernel'" in msg
    assert "allow_hbm_allocation_in_run_scoped=True" in msg
    assert "Cannot allocate HBM in `run_scoped`." in msg
    np.testing.assert_array_equal(
        call(InterpretParams(allow_hbm_allocation_in_run_scoped=True))(X), X)
