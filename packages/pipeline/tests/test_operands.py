"""Operand kinds: accumulating outputs, input-output refs, trivial windows, aliasing."""

import jax.numpy as jnp
import numpy as np
import pytest
from _pipeline_harness import (
    ALL_MODES,
    MODES,
    accumulating_matmul_body,
    assert_exports,
    call_maker,
    count_dma_starts,
    run,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.pipeline as pp


def matmul_call(m, n, k, bm, bn, bk, *, emit=pp.emit_pipeline, x_count=2, o_count=2):
    def kernel(x_hbm, y_hbm, o_hbm):
        emit(accumulating_matmul_body, grid=(m // bm, n // bn, k // bk),
             in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk),
                                    pipeline_mode=pl.Buffered(x_count)),
                       pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
             out_specs=[pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j),
                                     pipeline_mode=pl.Buffered(o_count))])(x_hbm, y_hbm, o_hbm)

    return call_maker(kernel, (m, n))


@settings(max_examples=8, deadline=None)
@given(nm=st.integers(1, 2), nn=st.integers(1, 2), nk=st.integers(1, 3),
       x_count=st.integers(1, 3), o_count=st.integers(1, 2), mode=st.sampled_from(MODES))
def test_accumulating_output_matches_jnp(nm, nn, nk, x_count, o_count, mode):
    m, n, k = 8 * nm, 128 * nn, 128 * nk
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(m, k)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(k, n)), jnp.float32)
    make_call = matmul_call(m, n, k, 8, 128, 128, x_count=x_count, o_count=o_count)
    np.testing.assert_allclose(run(make_call, mode, x, y), x @ y, rtol=1e-4, atol=1e-4)


def test_matmul_dma_count_and_export():
    x = jnp.zeros((16, 256), jnp.float32)
    y = jnp.zeros((256, 256), jnp.float32)
    ours = matmul_call(16, 256, 256, 8, 128, 128)
    theirs = matmul_call(16, 256, 256, 8, 128, 128, emit=pltpu.emit_pipeline)
    assert count_dma_starts(ours, x, y) == count_dma_starts(theirs, x, y)
    assert_exports(ours, x, y)


def input_output_call(shape, block, grid, counts):
    def kernel(x_hbm, acc_in_hbm, acc_hbm):
        del acc_in_hbm  # aliased with acc_hbm

        def body(x, acc):
            acc[...] += x[...]

        spec = pl.BlockSpec(block, lambda i: (i, 0))

        def with_buffers(allocs):
            pp.emit_pipeline(body, grid=grid)(x_hbm, acc_hbm, allocations=allocs)

        pl.run_scoped(with_buffers, [
            pp.BufferedRef.input(spec, jnp.float32, buffer_count=2),
            pp.BufferedRef.input_output(spec, jnp.float32, buffer_count=counts),
        ])

    return call_maker(kernel, shape, input_output_aliases={1: 0})


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("counts", [2, (2, 1), (2, 2), (3, 2), (1, 3)])
def test_input_output_ref_reads_and_writes_back(mode, counts):
    shape, block = (40, 128), (8, 128)
    x = jnp.arange(40 * 128, dtype=jnp.float32).reshape(shape)
    acc = jnp.full(shape, 3.0, jnp.float32)
    out = run(input_output_call(shape, block, (5,), counts), mode, x, acc)
    np.testing.assert_allclose(out, x + 3.0)


def test_input_output_slots():
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    bref = pp.BufferedRef.input_output(spec, jnp.float32, buffer_count=(3, 2))
    assert (bref.in_buffer_count, bref.out_buffer_count, bref.buffer_count) == (3, 2, 4)
    assert bref.window_ref.shape == (4, 8, 128)
    assert pp.BufferedRef.input_output(spec, jnp.float32, buffer_count=3).buffer_count == 3


def bias_call(shape, bias_shape, emit=pp.emit_pipeline):
    """A bias operand whose block is the whole array: a trivial window."""

    def kernel(x_hbm, b_hbm, o_hbm):
        def body(x, b, o):
            o[...] = x[...] + b[...]

        emit(body, grid=(shape[0] // 8,),
             in_specs=[pl.BlockSpec((8, shape[1]), lambda i: (i, 0)),
                       pl.BlockSpec(bias_shape, lambda i: (0, 0))],
             out_specs=[pl.BlockSpec((8, shape[1]), lambda i: (i, 0))])(x_hbm, b_hbm, o_hbm)

    return call_maker(kernel, shape)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_trivial_window_is_copied_once(mode):
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    b = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128) * 0.5
    make_call = bias_call((32, 128), (8, 128))
    np.testing.assert_allclose(run(make_call, mode, x, b), x + jnp.tile(b, (4, 1)))


def test_trivial_window_dma_count_equals_jax():
    x, b = jnp.zeros((32, 128), jnp.float32), jnp.zeros((8, 128), jnp.float32)
    ours = count_dma_starts(bias_call((32, 128), (8, 128)), x, b)
    theirs = count_dma_starts(bias_call((32, 128), (8, 128), emit=pltpu.emit_pipeline), x, b)
    assert ours == theirs
    assert_exports(bias_call((32, 128), (8, 128)), x, b)


def vmem_source_call(shape, emit=pp.emit_pipeline):
    """The input already lives in VMEM: the pipeline aliases its blocks in place."""

    def kernel(x_vmem, o_hbm):
        def body(x, o):
            o[...] = x[...] - 1.0

        emit(body, grid=(shape[0] // 8,),
             in_specs=[pl.BlockSpec((8, shape[1]), lambda i: (i, 0))],
             out_specs=[pl.BlockSpec((8, shape[1]), lambda i: (i, 0))])(x_vmem, o_hbm)

    return call_maker(kernel, shape, in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)])


@pytest.mark.parametrize("mode", ALL_MODES)
def test_vmem_source_is_aliased(mode):
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    np.testing.assert_allclose(run(vmem_source_call((32, 128)), mode, x), x - 1.0)
    # Only the output is copied: one write-back DMA in the loop, none for the input.
    ours = count_dma_starts(vmem_source_call((32, 128)), x)
    assert ours == count_dma_starts(vmem_source_call((32, 128), emit=pltpu.emit_pipeline), x)
    assert_exports(vmem_source_call((32, 128)), x)


def hbm_block_call(shape):
    """HBM block specs alias HBM slices; the body copies them itself."""

    def kernel(x_hbm, o_hbm):
        def body(x_block_hbm, o_block_hbm):
            pltpu.sync_copy(x_block_hbm, o_block_hbm)

        hbm = pl.BlockSpec((8, shape[1]), lambda i: (i, 0), memory_space=pltpu.HBM)
        pp.emit_pipeline(body, grid=(shape[0] // 8,), in_specs=[hbm],
                         out_specs=[hbm])(x_hbm, o_hbm)

    return call_maker(kernel, shape)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_hbm_block_spec_aliases_hbm_source(mode):
    x = jnp.arange(24 * 128, dtype=jnp.float32).reshape(24, 128)
    np.testing.assert_allclose(run(hbm_block_call((24, 128)), mode, x), x)
    assert_exports(hbm_block_call((24, 128)), x)


def test_hbm_block_spec_from_vmem_source_is_rejected():
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0), memory_space=pltpu.HBM)
    with pytest.raises(pp.PipelineConfigError, match="HBM block spec for a non-HBM source"):
        pp.BufferedRef.input(spec, jnp.float32, source_memory_space=pltpu.VMEM)
