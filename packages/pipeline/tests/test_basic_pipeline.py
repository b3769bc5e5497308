"""emit_pipeline on elementwise kernels: N-buffering, index maps, ragged blocks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _pipeline_harness import (
    MODES,
    assert_exports,
    count_dma_starts,
    hbm_call,
    needs_padded_buffer_bounds,
    run,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.pipeline as pp

ORDERS = {
    "row_major": lambda i, j: (i, j),
    "reversed": None,  # filled per grid
}


def affine_kernel(emit, grid, block, in_map, out_map, in_mode=None, out_mode=None, **kw):
    def kernel(x_hbm, o_hbm):
        def body(x, o):
            o[...] = x[...] * 2.0 + 1.0

        emit(body, grid=grid,
             in_specs=[pl.BlockSpec(block, in_map, pipeline_mode=in_mode)],
             out_specs=[pl.BlockSpec(block, out_map, pipeline_mode=out_mode)], **kw)(x_hbm, o_hbm)

    return kernel


def make_affine(shape, **kw):
    def make_call(interpret, emit=pp.emit_pipeline):
        return hbm_call(affine_kernel(emit, **kw), jax.ShapeDtypeStruct(shape, jnp.float32),
                        interpret=interpret)
    return make_call


def index_map(order, grid):
    gi, gj = grid
    return {
        "row_major": lambda i, j: (i, j),
        "reversed": lambda i, j: (gi - 1 - i, gj - 1 - j),
        "transposed": lambda i, j: (j, i),
    }[order]


@settings(max_examples=12, deadline=None)
@given(
    rows=st.integers(1, 3), cols=st.integers(1, 2), br=st.sampled_from([8, 16]),
    bc=st.sampled_from([128, 256]), in_count=st.integers(1, 3), out_count=st.integers(1, 3),
    order=st.sampled_from(["row_major", "reversed", "transposed"]),
    mode=st.sampled_from(MODES),
)
def test_elementwise_matches_jnp(rows, cols, br, bc, in_count, out_count, order, mode):
    grid = (rows, cols) if order != "transposed" else (cols, rows)
    imap = index_map(order, (rows, cols) if order != "transposed" else (cols, rows))
    shape = (rows * br, cols * bc)
    x = jnp.asarray(np.random.default_rng(0).normal(size=shape), jnp.float32)
    make_call = make_affine(shape, grid=grid, block=(br, bc), in_map=imap, out_map=imap,
                            in_mode=pp.Buffered(in_count), out_mode=pp.Buffered(out_count))
    np.testing.assert_allclose(run(make_call, mode, x), x * 2 + 1, rtol=1e-6)


@needs_padded_buffer_bounds
@settings(max_examples=8, deadline=None)
@given(rows=st.integers(2, 4), extra=st.integers(1, 7), in_count=st.integers(1, 3),
       out_count=st.integers(1, 2))
def test_ragged_last_block_reads_tile_padding(rows, extra, in_count, out_count):
    # The last block has `extra` real rows; its DMA is rounded up to 8 rows.
    shape = ((rows - 1) * 16 + extra, 256)
    x = jnp.asarray(np.random.default_rng(1).normal(size=shape), jnp.float32)
    make_call = make_affine(shape, grid=(rows, 2), block=(16, 128),
                            in_map=lambda i, j: (i, j), out_map=lambda i, j: (i, j),
                            in_mode=pp.Buffered(in_count), out_mode=pp.Buffered(out_count))
    out = run(make_call, "tpu_interpret", x, padded=True)
    np.testing.assert_allclose(out, x * 2 + 1, rtol=1e-6)


@pytest.mark.parametrize("in_count,out_count", [(1, 1), (2, 2), (3, 2), (4, 1)])
def test_dma_count_equals_jax_emit_pipeline(in_count, out_count):
    shape = (64, 256)
    x = jnp.zeros(shape, jnp.float32)
    kw = dict(grid=(4, 2), block=(16, 128), in_map=lambda i, j: (i, j),
              out_map=lambda i, j: (i, j))
    ours = make_affine(shape, in_mode=pp.Buffered(in_count),
                       out_mode=pp.Buffered(out_count), **kw)
    theirs = make_affine(shape, in_mode=pl.Buffered(in_count),
                         out_mode=pl.Buffered(out_count), **kw)
    n_ours = count_dma_starts(ours, x)
    n_jax = count_dma_starts(lambda interpret: theirs(interpret, emit=pltpu.emit_pipeline), x)
    assert n_ours == n_jax


@pytest.mark.parametrize("in_count,out_count", [(2, 2), (3, 3), (1, 1)])
def test_exports_for_every_tpu(in_count, out_count):
    shape = (40, 256)  # ragged: the last 16-row block has 8 rows
    x = jnp.zeros(shape, jnp.float32)
    make_call = make_affine(shape, grid=(3, 2), block=(16, 128),
                            in_map=lambda i, j: (i, j), out_map=lambda i, j: (i, j),
                            in_mode=pp.Buffered(in_count), out_mode=pp.Buffered(out_count))
    assert_exports(make_call, x)


def test_jax_buffered_is_accepted():
    shape = (32, 128)
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(shape)
    make_call = make_affine(shape, grid=(4, 1), block=(8, 128), in_map=lambda i, j: (i, j),
                            out_map=lambda i, j: (i, j), in_mode=pl.Buffered(3),
                            out_mode=pl.Buffered(1))
    np.testing.assert_allclose(run(make_call, "interpret_true", x), x * 2 + 1)


def test_grid_loop_is_not_unrolled():
    shape = (8 * 64, 128)
    x = jnp.zeros(shape, jnp.float32)
    small = make_affine((8 * 4, 128), grid=(4, 1), block=(8, 128),
                        in_map=lambda i, j: (i, j), out_map=lambda i, j: (i, j))
    large = make_affine(shape, grid=(64, 1), block=(8, 128),
                        in_map=lambda i, j: (i, j), out_map=lambda i, j: (i, j))
    assert count_dma_starts(small, x[:32]) == count_dma_starts(large, x)
