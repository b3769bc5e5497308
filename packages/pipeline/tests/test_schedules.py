"""Megacore splits, block-dim kinds, lookahead, allocations, prefetch, PipelineStep,
no_pipelining, output_wait_read_only, nested pipelines and dynamic grids."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _pipeline_harness import (
    ALL_MODES,
    CHIP,
    MODES,
    assert_exports,
    call_maker,
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


def copy_body(x, o):
    o[...] = x[...] + 1.0


def megacore_call(rows, num_cores, semantics):
    shape = (rows * 8, 128)

    def kernel(x_hbm, o_hbm):
        spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
        pp.emit_pipeline(copy_body, grid=(rows, 1), in_specs=[spec], out_specs=[spec],
                         core_axis=0, dimension_semantics=semantics)(x_hbm, o_hbm)

    return call_maker(kernel, shape, grid=(num_cores,), dimension_semantics=("parallel",)), shape


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("rows", [4, 5, 3])  # divisible, uneven, fewer than 2 per core
def test_megacore_split_covers_the_grid_once(mode, rows):
    make_call, shape = megacore_call(rows, 2, (pp.PARALLEL, pp.ARBITRARY))
    x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
    np.testing.assert_allclose(run(make_call, mode, x), x + 1.0)


def test_megacore_exports():
    make_call, shape = megacore_call(5, 2, (pp.PARALLEL, pp.ARBITRARY))
    assert_exports(make_call, jnp.zeros(shape, jnp.float32))


def test_partition_grid_shares():
    # Divisible: even split of the first divisible parallel dim.
    grid, offsets = pp.grid.partition_grid((3, 4), (pp.PARALLEL, pp.PARALLEL), 2, 1)
    assert grid == (3, 2) and int(offsets[1]) == 2 and offsets[0] == 0
    # Uneven: the first 5 % 2 cores get one more step.
    sizes = [int(pp.grid.partition_grid((5,), (pp.PARALLEL,), 2, c)[0][0]) for c in (0, 1)]
    starts = [int(pp.grid.partition_grid((5,), (pp.PARALLEL,), 2, c)[1][0]) for c in (0, 1)]
    assert sizes == [3, 2] and starts == [0, 3]
    # Dynamic: the single dynamic parallel dim is split.
    sizes = [int(pp.grid.partition_grid((jnp.int32(7),), (pp.PARALLEL,), 3, c)[0][0])
             for c in range(3)]
    assert sizes == [3, 2, 2]
    with pytest.raises(pp.PipelineNotImplementedError, match="without parallel grid"):
        pp.grid.partition_grid((4,), (pp.ARBITRARY,), 2, 0)
    with pytest.raises(pp.PipelineNotImplementedError, match="dynamic number of cores"):
        pp.grid.partition_grid((4,), (pp.PARALLEL,), jnp.int32(2), 0)


def block_kind_call(shape, block_shape, index_map, grid, out_block, out_map):
    def kernel(x_hbm, o_hbm):
        pp.emit_pipeline(copy_body, grid=grid,
                         in_specs=[pl.BlockSpec(block_shape, index_map)],
                         out_specs=[pl.BlockSpec(out_block, out_map)])(x_hbm, o_hbm)

    return call_maker(kernel, shape)


BLOCK_KINDS = {
    "int": ((8, 128), lambda i: (i, 0)),
    "blocked": ((pl.Blocked(8), pl.Blocked(128)), lambda i: (i, 0)),
    "element": ((pl.Element(8), 128), lambda i: (i * 8, 0)),
    "bounded_slice": ((pl.BoundedSlice(8), 128), lambda i: (pl.ds(i * 8, 8), 0)),
}


# Element and BoundedSlice windows are clamped at the end of the array, so their DMAs
# have a traced size; jax's interpret=True (state discharge) cannot slice by a traced
# size, so they run under the TPU interpreter only.
KIND_MODES = [(kind, mode) for kind in sorted(BLOCK_KINDS) for mode in ALL_MODES
              if mode != "interpret_true" or kind in ("int", "blocked")]


@pytest.mark.parametrize("kind,mode", KIND_MODES)
def test_block_dim_kinds(kind, mode):
    block, imap = BLOCK_KINDS[kind]
    make_call = block_kind_call((32, 128), block, imap, (4,), (8, 128), lambda i: (i, 0))
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    np.testing.assert_allclose(run(make_call, mode, x), x + 1.0)
    assert_exports(make_call, x)


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("squeezed", [None, pl.Squeezed()])
def test_squeezed_dims(mode, squeezed):
    def kernel(x_hbm, o_hbm):
        spec = pl.BlockSpec((squeezed, 8, 128), lambda b, i: (b, i, 0))

        def body(x, o):
            assert x.shape == (8, 128)
            o[...] = x[...] * 3.0

        pp.emit_pipeline(body, grid=(3, 2), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

    make_call = call_maker(kernel, (3, 16, 128))

    x = jnp.arange(3 * 16 * 128, dtype=jnp.float32).reshape(3, 16, 128)
    np.testing.assert_allclose(run(make_call, mode, x), x * 3.0)


@needs_padded_buffer_bounds
@pytest.mark.parametrize("mode", ["tpu_interpret", CHIP])
def test_ragged_element_block_is_clamped_and_rounded(mode):
    # 20 rows, 8-row Element windows at offsets 0, 8, 16: the last reads rows 16:24
    # (rounded to the 8-row tile), of which 16:20 are real.
    make_call = block_kind_call((20, 128), (pl.Element(8), 128), lambda i: (i * 8, 0), (3,),
                                (8, 128), lambda i: (i, 0))
    x = jnp.arange(20 * 128, dtype=jnp.float32).reshape(20, 128)
    np.testing.assert_allclose(run(make_call, mode, x, padded=True), x + 1.0)


def lookahead_call(shape, repeat, emit=pp.emit_pipeline, mode_cls=pp.Buffered):
    steps = shape[0] // 8 * repeat

    def kernel(x_hbm, o_hbm):
        # Each input block is used for `repeat` consecutive steps.
        def body(x, o):
            o[...] = x[...] * 2.0

        emit(body, grid=(steps,),
             in_specs=[pl.BlockSpec((8, 128), lambda i: (i // repeat, 0),
                                    pipeline_mode=mode_cls(2, use_lookahead=True))],
             out_specs=[pl.BlockSpec((8, 128), lambda i: (i // repeat, 0))])(x_hbm, o_hbm)

    return call_maker(kernel, shape)


@settings(max_examples=6, deadline=None)
@given(blocks=st.integers(1, 4), repeat=st.integers(1, 3), mode=st.sampled_from(MODES))
def test_lookahead_matches_jnp(blocks, repeat, mode):
    shape = (blocks * 8, 128)
    x = jnp.asarray(np.random.default_rng(3).normal(size=shape), jnp.float32)
    np.testing.assert_allclose(run(lookahead_call(shape, repeat), mode, x), x * 2.0)


def test_lookahead_dma_count_equals_jax():
    x = jnp.zeros((32, 128), jnp.float32)
    ours = count_dma_starts(lookahead_call((32, 128), 2), x)
    theirs = count_dma_starts(
        lookahead_call((32, 128), 2, emit=pltpu.emit_pipeline, mode_cls=pl.Buffered), x)
    assert ours == theirs
    assert_exports(lookahead_call((32, 128), 2), x)


def allocations_call(shape):
    """One set of buffers, allocated once, reused by two pipeline invocations."""
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))

    def kernel(x_hbm, y_hbm, o_hbm, p_hbm):
        pipeline, make_allocations = pp.emit_pipeline_with_allocations(
            copy_body, grid=(shape[0] // 8,), in_specs=[spec], out_specs=[spec])

        def with_buffers(allocs):
            pipeline(x_hbm, o_hbm, allocations=allocs)
            pipeline(y_hbm, p_hbm, allocations=allocs)

        pl.run_scoped(with_buffers, make_allocations(x_hbm, o_hbm))

    def make_call(interpret):
        out = jax.ShapeDtypeStruct(shape, jnp.float32)
        return hbm_call(kernel, (out, out), interpret=interpret)

    return make_call


@pytest.mark.parametrize("mode", ALL_MODES)
def test_allocations_are_reusable(mode):
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    o, p = run(allocations_call((32, 128)), mode, x, -x)
    np.testing.assert_allclose(o, x + 1.0)
    np.testing.assert_allclose(p, -x + 1.0)
    assert_exports(allocations_call((32, 128)), x, x)


def prefetch_call(shape, prefetched):
    """The caller fetched the first ``prefetched`` blocks itself before the pipeline."""
    steps = shape[0] // 8

    def kernel(x_hbm, o_hbm):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0),
                            pipeline_mode=pp.Buffered(2, prefetched_count=prefetched))
        out_spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        pipeline, make_allocations = pp.emit_pipeline_with_allocations(
            copy_body, grid=(steps,), in_specs=[spec], out_specs=[out_spec])

        def with_buffers(window, allocs):
            for b in range(prefetched):
                pltpu.sync_copy(x_hbm.at[pl.ds(b * 8, 8)], window.at[b])
            (x_alloc,) = allocs
            pipeline(x_hbm, o_hbm, allocations=[x_alloc.with_window_ref(window)])

        (x_bref, _) = make_allocations(x_hbm, o_hbm)
        pl.run_scoped(with_buffers, pltpu.VMEM((2, 8, 128), jnp.float32), [x_bref])

    return call_maker(kernel, shape)


# Under interpret=True, jax 0.10.2's partial discharge of the grid scan fails on the
# caller's window ref ("Attempting to pass a Ref ... to a primitive: dynamic_slice"),
# so prefetched inputs are checked under the TPU interpreter.
@pytest.mark.parametrize("mode", ["tpu_interpret", CHIP])
@pytest.mark.parametrize("prefetched", [1, 2])
def test_prefetched_inputs(mode, prefetched):
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    np.testing.assert_allclose(run(prefetch_call((32, 128), prefetched), mode, x), x + 1.0)


def test_prefetched_input_needs_a_window():
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0),
                        pipeline_mode=pp.Buffered(2, prefetched_count=1))
    bref = pp.BufferedRef.input(spec, jnp.float32, prefetched_count=1)
    with pytest.raises(pp.PipelineConfigError, match="with_window_ref"):
        bref.initialize_slots()
    with pytest.raises(pp.PipelineConfigError, match="prefetched_count must be at most"):
        pp.BufferedRef.input(spec, jnp.float32, buffer_count=2, prefetched_count=3)


def pipeline_step_call(grid, core_split=False):
    shape = (grid[0] * 8, grid[1] * 128)

    def kernel(x_hbm, o_hbm):
        def body(step, x, o):
            o[...] = x[...] + (step.index[0] * 100 + step.index[1] * 10
                               + step.local_index).astype(jnp.float32)

        spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
        pp.emit_pipeline(body, grid=grid, in_specs=[spec], out_specs=[spec],
                         _explicit_indices=True)(x_hbm, o_hbm)

    return call_maker(kernel, shape), shape


@pytest.mark.parametrize("mode", ALL_MODES)
def test_pipeline_step_indices(mode):
    make_call, shape = pipeline_step_call((3, 2))
    x = jnp.zeros(shape, jnp.float32)
    out = np.asarray(run(make_call, mode, x))
    for i in range(3):
        for j in range(2):
            assert np.all(out[i * 8:(i + 1) * 8, j * 128:(j + 1) * 128] == i * 100 + j * 10
                          + i * 2 + j)
    assert_exports(make_call, x)


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("option", ["no_pipelining", "output_wait_read_only"])
def test_debug_and_read_only_modes(mode, option):
    def kernel(x_hbm, o_hbm):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        out_spec = pl.BlockSpec((8, 128), lambda i: (i, 0), pipeline_mode=pp.Buffered(2))
        pp.emit_pipeline(copy_body, grid=(5,), in_specs=[spec], out_specs=[out_spec],
                         **{option: True})(x_hbm, o_hbm)

    make_call = call_maker(kernel, (40, 128))

    x = jnp.arange(40 * 128, dtype=jnp.float32).reshape(40, 128)
    np.testing.assert_allclose(run(make_call, mode, x), x + 1.0)
    assert_exports(make_call, x)


def nested_call(shape):
    """An outer pipeline over HBM slices runs an inner pipeline over VMEM blocks."""

    def kernel(x_hbm, o_hbm):
        def outer_body(x_slice, o_slice):
            inner = pl.BlockSpec((8, 128), lambda i: (i, 0))
            pp.emit_pipeline(copy_body, grid=(2,), in_specs=[inner],
                             out_specs=[inner])(x_slice, o_slice)

        outer = pl.BlockSpec((16, 128), lambda i: (i, 0), memory_space=pltpu.HBM)
        pp.emit_pipeline(outer_body, grid=(shape[0] // 16,), in_specs=[outer],
                         out_specs=[outer])(x_hbm, o_hbm)

    return call_maker(kernel, shape)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_nested_pipelines(mode):
    x = jnp.arange(48 * 128, dtype=jnp.float32).reshape(48, 128)
    np.testing.assert_allclose(run(nested_call((48, 128)), mode, x), x + 1.0)
    assert_exports(nested_call((48, 128)), x)


def dynamic_grid_call(shape):
    """The number of steps is read at run time from a scalar-prefetch operand."""

    def kernel(n_ref, x_hbm, o_hbm):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        pp.emit_pipeline(copy_body, grid=(n_ref[0],), in_specs=[spec],
                         out_specs=[spec])(x_hbm, o_hbm)

    return call_maker(kernel, shape, num_scalar_prefetch=1, input_output_aliases={1: 0})


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("n", [1, 3])
def test_dynamic_grid(mode, n):
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    out = run(dynamic_grid_call((32, 128)), mode, jnp.array([n], jnp.int32), x)
    expected = x.at[: n * 8].add(1.0)
    np.testing.assert_allclose(out, expected)
    assert_exports(dynamic_grid_call((32, 128)), jnp.array([n], jnp.int32), x)
