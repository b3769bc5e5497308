"""palladium.pipeline kernels run by palladium.interpret with race detection on.

A correct pipeline reports no race whatever its buffering, DMA execution mode or core
split; a kernel that reuses a buffer the pipeline still owns is reported.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi
import palladium.pipeline as pp

ROWS, COLS, BLOCK = 64, 256, (8, 128)


def _grid():
    return (ROWS // BLOCK[0], COLS // BLOCK[1])


def _spec(buffers=None):
    mode = {} if buffers is None else {"pipeline_mode": pp.Buffered(buffers)}
    return pl.BlockSpec(BLOCK, lambda i, j: (i, j), **mode)


def _call(kernel, *args, params, n_out=1):
    shape = jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32)
    return pl.pallas_call(
        kernel,
        out_shape=shape if n_out == 1 else [shape] * n_out,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * len(args),
        out_specs=pl.BlockSpec(memory_space=pl.ANY)
        if n_out == 1
        else [pl.BlockSpec(memory_space=pl.ANY)] * n_out,
        interpret=params,
    )(*args)


@pytest.fixture(scope="module")
def xy():
    x = jax.random.normal(jax.random.key(0), (ROWS, COLS), jnp.float32)
    y = jax.random.normal(jax.random.key(1), (ROWS, COLS), jnp.float32)
    return x, y


@pytest.mark.parametrize("mode", ["on_wait", "eager"])
@pytest.mark.parametrize("in_buffers,out_buffers", [(1, 1), (2, 2), (3, 2), (2, 1)])
def test_correct_pipeline_has_no_race(xy, mode, in_buffers, out_buffers):
    x, y = xy

    def kernel(x_hbm, y_hbm, o_hbm):
        def body(x, y, o):
            o[...] = x[...] * y[...] + 1.0

        pp.emit_pipeline(
            body,
            grid=_grid(),
            in_specs=[_spec(in_buffers), _spec(in_buffers)],
            out_specs=[_spec(out_buffers)],
        )(x_hbm, y_hbm, o_hbm)

    params = pi.InterpretParams(detect_races=True, dma_execution_mode=mode)
    with pi.errors_as_raised():
        out = _call(kernel, x, y, params=params)
    np.testing.assert_allclose(out, x * y + 1.0, rtol=1e-6)


def test_accumulating_output_has_no_race(xy):
    """An output block revisited over the last grid axis (a reduction) is not a race."""
    x, _ = xy

    def kernel(x_hbm, o_hbm):
        def body(x, o):
            @pl.when(pl.program_id(1) == 0)  # noqa: B023
            def _():
                o[...] = jnp.zeros_like(o)

            o[...] += x[...]

        pp.emit_pipeline(
            body,
            grid=(ROWS // 8, COLS // 128),
            in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
            out_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, 0))],
        )(x_hbm, o_hbm)

    out_shape = jax.ShapeDtypeStruct((ROWS, 128), jnp.float32)
    params = pi.InterpretParams(detect_races=True)
    with pi.errors_as_raised():
        out = pl.pallas_call(
            kernel,
            out_shape=out_shape,
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            interpret=params,
        )(x)
    expected = x[:, :128] + x[:, 128:]
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def _megacore_difference(x, y, use_primitive=None):
    """``x - y`` by a pipeline whose parallel axis two simulated cores split (core_map +
    core_axis_name), races checked."""
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=2)

    @pl.run_state
    def stateful(refs):
        x_hbm, y_hbm, o_hbm = refs

        @pl.core_map(mesh, interpret=pi.InterpretParams(detect_races=True))
        def _():
            def body(x, y, o):
                o[...] = x[...] - y[...]

            pp.emit_pipeline(
                body,
                grid=_grid(),
                in_specs=[_spec(), _spec()],
                out_specs=[_spec()],
                core_axis_name="core",
                dimension_semantics=(pp.PARALLEL, pp.ARBITRARY),
                use_primitive=use_primitive,
            )(x_hbm, y_hbm, o_hbm)

    _, _, out = stateful((x, y, jnp.zeros_like(x)))
    return out


def test_megacore_pipeline_has_no_race(xy):
    x, y = xy
    with pi.errors_as_raised():
        out = jax.jit(_megacore_difference)(x, y)
    np.testing.assert_allclose(out, x - y, rtol=1e-6)


def _reads_previous_output_block(out_buffers, use_primitive=False):
    """A kernel that copies the previous step's output block back from HBM.

    With a double-buffered output, the write-back DMA of the previous step is waited for
    only after this step's body: the copy reads HBM that a DMA may still be writing. With
    a single-buffered (synchronous) output the write-back completed within the previous
    step: no race.
    """
    rows = ROWS // 8
    spec = pl.BlockSpec((rows, COLS), lambda i: (i, 0))
    out_spec = pl.BlockSpec((rows, COLS), lambda i: (i, 0), pipeline_mode=pp.Buffered(out_buffers))

    def kernel(x_hbm, o_hbm, prev_hbm):
        def outer(scratch, sem):
            def body(x, o, prev):
                o[...] = x[...] * 2.0
                prev[...] = jnp.zeros_like(prev)

                @pl.when(pl.program_id(0) > 0)
                def _():
                    block = pl.ds((pl.program_id(0) - 1) * rows, rows)
                    copy = pltpu.make_async_copy(o_hbm.at[block], scratch, sem)
                    copy.start()
                    copy.wait()
                    prev[...] = scratch[...]

            pp.emit_pipeline(
                body, grid=(8,), in_specs=[spec], out_specs=[out_spec, out_spec],
                use_primitive=use_primitive,
            )(x_hbm, o_hbm, prev_hbm)

        pl.run_scoped(outer, pltpu.VMEM((rows, COLS), jnp.float32), pltpu.SemaphoreType.DMA)

    return kernel


def test_reading_an_output_block_still_being_written_is_a_race(xy):
    x, _ = xy
    kernel = _reads_previous_output_block(out_buffers=2)
    with pytest.raises(pi.DataRaceError) as info, pi.errors_as_raised():
        _call(kernel, x, params=pi.InterpretParams(detect_races=True), n_out=2)
    message = str(info.value)
    assert "o_hbm" in message
    assert "test_pipeline_under_interpret.py" in message


def test_same_read_after_a_synchronous_output_is_not_a_race(xy):
    x, _ = xy
    kernel = _reads_previous_output_block(out_buffers=1)
    with pi.errors_as_raised():
        out, prev = _call(kernel, x, params=pi.InterpretParams(detect_races=True), n_out=2)
    np.testing.assert_allclose(out, x * 2.0, rtol=1e-6)
    expected_prev = np.zeros((ROWS, COLS), np.float32)
    expected_prev[ROWS // 8:] = np.asarray(x[:-ROWS // 8]) * 2.0
    np.testing.assert_allclose(prev, expected_prev, rtol=1e-6)


def _ragged_pipeline(rows, cols):
    def kernel(x_hbm, o_hbm):
        def body(x, o):
            o[...] = x[...] * 3.0

        pp.emit_pipeline(  # the line errors must name
            body,
            grid=(pl.cdiv(rows, 16), pl.cdiv(cols, 128)),
            in_specs=[pl.BlockSpec((16, 128), lambda i, j: (i, j))],
            out_specs=[pl.BlockSpec((16, 128), lambda i, j: (i, j))],
        )(x_hbm, o_hbm)

    return kernel


def _run_ragged(bounds):
    rows, cols = 60, 200
    x = jnp.arange(rows * cols, dtype=jnp.float32).reshape(rows, cols)
    out = pl.pallas_call(
        _ragged_pipeline(rows, cols),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        interpret=pi.InterpretParams(detect_races=True, buffer_bounds=bounds),
    )(x)
    return x, out


def test_ragged_last_blocks_with_padded_bounds():
    """Tile-rounded DMAs of ragged last blocks read into tile padding: fine with padded
    bounds (jax 0.10.2's interpret=True cannot run these DMAs at all)."""
    with pi.errors_as_raised():
        x, out = _run_ragged("padded")
    np.testing.assert_array_equal(out, x * 3.0)


def test_ragged_last_blocks_with_logical_bounds_name_the_pipeline_line():
    with pytest.raises(pi.OutOfBoundsError) as info, pi.errors_as_raised():
        _run_ragged("logical")
    message = str(info.value)
    assert "'x_hbm'" in message and "kernel 'kernel'" in message, message
    # The DMA is attributed to the user's emit_pipeline call, not palladium.pipeline's code.
    line = _ragged_pipeline.__code__.co_firstlineno + 5
    assert f"test_pipeline_under_interpret.py:{line}" in message, message
    assert "buffer_bounds='padded'" in message


# -- the emit_pipeline primitive path (use_primitive=True) ---------------------------------
# palladium.interpret learns palladium_emit_pipeline / palladium_pipeline_body from
# palladium-pipeline's "palladium.interpret_rules" entry point; the primitive path must
# give the same results (bit for bit) as the inlined emitter, and the same race reports.
def _elementwise(use_primitive, buffers):
    def kernel(x_hbm, y_hbm, o_hbm):
        def body(x, y, o):
            o[...] = x[...] * y[...] + 1.0

        pp.emit_pipeline(
            body, grid=_grid(), in_specs=[_spec(buffers), _spec(buffers)],
            out_specs=[_spec(buffers)], use_primitive=use_primitive,
        )(x_hbm, y_hbm, o_hbm)

    return kernel


def test_entry_point_registered_the_pipeline_primitives():
    import importlib.metadata

    from palladium.interpret.eval.registry import RULES
    from palladium.pipeline.primitive import emit_pipeline_p, pipeline_body_p

    group = importlib.metadata.entry_points(group="palladium.interpret_rules")
    assert "palladium-pipeline" in [ep.name for ep in group]
    assert emit_pipeline_p in RULES and pipeline_body_p in RULES


@pytest.mark.parametrize("mode", ["on_wait", "eager"])
@pytest.mark.parametrize("buffers", [1, 2, 3])
def test_primitive_path_elementwise_matches_inlined_path(xy, mode, buffers):
    x, y = xy
    params = pi.InterpretParams(detect_races=True, dma_execution_mode=mode)
    with pi.errors_as_raised():
        out = _call(_elementwise(True, buffers), x, y, params=params)
        inlined = _call(_elementwise(False, buffers), x, y, params=params)
    np.testing.assert_allclose(out, x * y + 1.0, rtol=1e-6)
    np.testing.assert_array_equal(out, inlined)


def _matmul(use_primitive, m, k, n, bm, bk, bn):
    def kernel(a_hbm, b_hbm, o_hbm):
        def body(a, b, o):
            @pl.when(pl.program_id(2) == 0)
            def _():
                o[...] = jnp.zeros_like(o)

            o[...] += jnp.dot(a[...], b[...], preferred_element_type=jnp.float32)

        pp.emit_pipeline(
            body,
            grid=(m // bm, n // bn, k // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                      pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
            out_specs=[pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j))],
            use_primitive=use_primitive,
        )(a_hbm, b_hbm, o_hbm)

    return kernel


def test_primitive_path_accumulating_matmul_matches_jnp_and_inlined_path():
    m, k, n = 32, 384, 256
    a = jax.random.normal(jax.random.key(2), (m, k), jnp.float32)
    b = jax.random.normal(jax.random.key(3), (k, n), jnp.float32)

    def run(use_primitive):
        return pl.pallas_call(
            _matmul(use_primitive, m, k, n, 16, 128, 128),
            out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            interpret=pi.InterpretParams(detect_races=True),
        )(a, b)

    with pi.errors_as_raised():
        out, inlined = run(True), run(False)
    np.testing.assert_allclose(out, jnp.dot(a, b, precision="highest"), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out, inlined)


def test_primitive_path_nested_pipeline_matches_jnp():
    """An inner pipeline over the outer pipeline's (transformed, slot-indexed) block refs."""
    x, y = xy_arrays = (jnp.arange(ROWS * COLS, dtype=jnp.float32).reshape(ROWS, COLS),
                        jnp.ones((ROWS, COLS), jnp.float32))
    del xy_arrays

    def make(use_primitive):
        def kernel(x_hbm, y_hbm, o_hbm):
            def outer(x_blk, y_blk, o_blk):
                def inner(x, y, o):
                    o[...] = x[...] + 2.0 * y[...]

                pp.emit_pipeline(
                    inner, grid=(2,),
                    in_specs=[pl.BlockSpec((16, 128), lambda i: (i, 0))] * 2,
                    out_specs=[pl.BlockSpec((16, 128), lambda i: (i, 0))],
                    use_primitive=use_primitive,
                )(x_blk, y_blk, o_blk)

            spec = pl.BlockSpec((32, 128), lambda i, j: (i, j), memory_space=pltpu.VMEM)
            pp.emit_pipeline(
                outer, grid=(ROWS // 32, COLS // 128), in_specs=[spec, spec],
                out_specs=[spec], use_primitive=use_primitive,
            )(x_hbm, y_hbm, o_hbm)

        return kernel

    params = pi.InterpretParams(detect_races=True)
    with pi.errors_as_raised():
        out = _call(make(True), x, y, params=params)
        inlined = _call(make(False), x, y, params=params)
    np.testing.assert_array_equal(out, x + 2.0 * y)
    np.testing.assert_array_equal(out, inlined)


def test_primitive_path_reading_an_output_block_still_being_written_is_a_race(xy):
    x, _ = xy
    kernel = _reads_previous_output_block(out_buffers=2, use_primitive=True)
    with pytest.raises(pi.DataRaceError) as info, pi.errors_as_raised():
        _call(kernel, x, params=pi.InterpretParams(detect_races=True), n_out=2)
    message = str(info.value)
    assert "o_hbm" in message
    assert "test_pipeline_under_interpret.py" in message


def test_primitive_path_same_read_after_a_synchronous_output_is_not_a_race(xy):
    x, _ = xy
    kernel = _reads_previous_output_block(out_buffers=1, use_primitive=True)
    with pi.errors_as_raised():
        out, prev = _call(kernel, x, params=pi.InterpretParams(detect_races=True), n_out=2)
    np.testing.assert_allclose(out, x * 2.0, rtol=1e-6)
    expected_prev = np.zeros((ROWS, COLS), np.float32)
    expected_prev[ROWS // 8:] = np.asarray(x[:-ROWS // 8]) * 2.0
    np.testing.assert_allclose(prev, expected_prev, rtol=1e-6)


def test_primitive_path_megacore_pipeline_matches_inlined_path(xy):
    """Two simulated cores split the parallel axis of a use_primitive=True pipeline."""
    x, y = xy
    with pi.errors_as_raised():
        out = jax.jit(functools.partial(_megacore_difference, use_primitive=True))(x, y)
        inlined = jax.jit(functools.partial(_megacore_difference, use_primitive=False))(x, y)
    np.testing.assert_allclose(out, x - y, rtol=1e-6)
    np.testing.assert_array_equal(out, inlined)


def test_primitive_path_body_with_run_scoped_and_dma_of_a_block_ref(xy):
    """The body copies its input block (a slot of the input buffer) into its own scratch
    by DMA inside ``run_scoped``: both see the block ref through its transforms."""
    x, _ = xy

    def make(use_primitive):
        def kernel(x_hbm, o_hbm):
            def body(x, o):
                def scoped(tmp, sem):
                    copy = pltpu.make_async_copy(x, tmp, sem)
                    copy.start()
                    copy.wait()
                    o[...] = tmp[...] * 2.0 + x[...]

                pl.run_scoped(scoped, pltpu.VMEM(BLOCK, jnp.float32), pltpu.SemaphoreType.DMA)

            pp.emit_pipeline(body, grid=_grid(), in_specs=[_spec(2)], out_specs=[_spec(2)],
                             use_primitive=use_primitive)(x_hbm, o_hbm)

        return kernel

    params = pi.InterpretParams(detect_races=True)
    with pi.errors_as_raised():
        out = _call(make(True), x, params=params)
        inlined = _call(make(False), x, params=params)
    np.testing.assert_allclose(out, x * 3.0, rtol=1e-6)
    np.testing.assert_array_equal(out, inlined)


@pytest.mark.parametrize("loop", ["scan", "while"])
def test_primitive_path_body_loops_over_a_block_ref(xy, loop):
    """A ``fori_loop`` in the body (a scan with static bounds, a while loop otherwise)
    closes over the block refs."""
    x, _ = xy

    def make(use_primitive):
        def kernel(x_hbm, o_hbm):
            def body(x, o):
                def row(r, carry):
                    o[pl.ds(r, 1), :] = x[pl.ds(r, 1), :] + carry
                    return carry + 1.0

                upper = BLOCK[0] if loop == "scan" else pl.program_id(0) * 0 + BLOCK[0]
                jax.lax.fori_loop(0, upper, row, jnp.float32(0.0))

            pp.emit_pipeline(body, grid=_grid(), in_specs=[_spec()], out_specs=[_spec()],
                             use_primitive=use_primitive)(x_hbm, o_hbm)

        return kernel

    params = pi.InterpretParams(detect_races=True)
    with pi.errors_as_raised():
        out = _call(make(True), x, params=params)
        inlined = _call(make(False), x, params=params)
    offsets = np.tile(np.arange(BLOCK[0], dtype=np.float32), ROWS // BLOCK[0])[:, None]
    np.testing.assert_allclose(out, np.asarray(x) + offsets, rtol=1e-6)
    np.testing.assert_array_equal(out, inlined)


def _allocations_and_pytrees(use_primitive):
    """Buffers allocated once and reused by two pipeline calls, with pytree specs."""
    spec = pl.BlockSpec(BLOCK, lambda i, j: (i, j))

    def body(ins, outs):
        (o,) = outs
        o[...] = ins["x"][...] * 2.0 + ins["y"][...]

    def kernel(x_hbm, y_hbm, o_hbm):
        pipeline, make = pp.emit_pipeline_with_allocations(
            body, grid=_grid(), in_specs=[{"x": spec, "y": spec}], out_specs=[(spec,)],
            use_primitive=use_primitive)

        def run_twice(allocs):
            pipeline({"x": x_hbm, "y": y_hbm}, (o_hbm,), allocations=allocs)
            pipeline({"x": o_hbm, "y": y_hbm}, (o_hbm,), allocations=allocs)

        pl.run_scoped(run_twice, make({"x": x_hbm, "y": y_hbm}, (o_hbm,)))

    return kernel


@pytest.mark.timeout(300)
def test_allocations_and_pytree_specs_on_the_primitive_path_match_the_inlined_path(xy):
    x, y = xy
    params = pi.InterpretParams(detect_races=True)
    with pi.errors_as_raised():
        inlined = _call(_allocations_and_pytrees(False), x, y, params=params)
        primitive = _call(_allocations_and_pytrees(True), x, y, params=params)
    np.testing.assert_array_equal(primitive, inlined)
    np.testing.assert_allclose(primitive, (x * 2.0 + y) * 2.0 + y, rtol=1e-6)
