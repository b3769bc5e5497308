"""jax's own ``emit_pipeline`` primitive (``jax_use_emit_pipeline_primitive=True`` with
``pltpu.emit_pipeline``) under palladium.interpret: palladium-pipeline's entry point
expands it into palladium's emitter (DMAs and semaphores the race detector and the
timeline see). Results match the inlined path (the flag off) and numpy."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import AbstractMesh

import palladium.interpret as pi
from palladium.interpret import _jax_compat as jc

pytestmark = pytest.mark.skipif(
    "jax_use_emit_pipeline_primitive" not in jax.config.values,
    reason="this jax has no jax_use_emit_pipeline_primitive option")


@contextlib.contextmanager
def _flag(on):
    jax.config.update("jax_use_emit_pipeline_primitive", on)
    try:
        yield
    finally:
        jax.config.update("jax_use_emit_pipeline_primitive", False)


def _run(kernel, out_shape, *args, primitive):
    """Trace under a v5e abstract mesh (jax's inlined emitter asks for the TPU's tiling)
    with the flag as given; run under palladium with races detected."""
    call = pl.pallas_call(
        kernel, out_shape=out_shape,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * len(args),
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        interpret=pi.InterpretParams(detect_races=True, compile_check="approximate"))
    device = jc.abstract_device(device_kind="TPU v5 lite", num_cores=1)
    mesh = AbstractMesh((), (), axis_types=(), abstract_device=device)
    with _flag(primitive), jax.sharding.use_abstract_mesh(mesh):
        text = str(jax.make_jaxpr(call)(*args))
        lowered = jax.jit(call).trace(*args).lower()
    assert ("emit_pipeline[" in text) == primitive
    with pi.timeline() as tl, pi.errors_as_raised():
        out = np.asarray(lowered.compile()(*args))
    return out, tl.launches[-1]


def matmul_kernel(x_hbm, y_hbm, o_hbm):
    def body(x, y, o):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o[...] = jnp.zeros_like(o)

        o[...] += jnp.dot(x[...], y[...], preferred_element_type=jnp.float32)

    pltpu.emit_pipeline(
        body, grid=(2, 2, 3),
        in_specs=[pl.BlockSpec((8, 128), lambda i, j, k: (i, k)),
                  pl.BlockSpec((128, 128), lambda i, j, k: (k, j))],
        out_specs=[pl.BlockSpec((8, 128), lambda i, j, k: (i, j))])(x_hbm, y_hbm, o_hbm)


def fused_kernel(a_hbm, b_hbm, c_hbm, o_hbm):
    """Three inputs, a scalar-step dependent body, num_programs."""

    def body(a, b, c, o):
        step = pl.program_id(0).astype(jnp.float32) / jnp.float32(pl.num_programs(0))
        o[...] = a[...] * b[...] + c[...] + step

    spec = pl.BlockSpec((8, 256), lambda i: (i, 0))
    pltpu.emit_pipeline(body, grid=(4,), in_specs=[spec, spec, spec],
                        out_specs=[spec])(a_hbm, b_hbm, c_hbm, o_hbm)


@pytest.mark.timeout(300)
def test_matmul_through_jax_s_primitive_matches_the_inlined_path_and_numpy():
    x = jax.random.normal(jax.random.key(0), (16, 384), jnp.float32)
    y = jax.random.normal(jax.random.key(1), (384, 256), jnp.float32)
    shape = jax.ShapeDtypeStruct((16, 256), jnp.float32)
    inlined, _ = _run(matmul_kernel, shape, x, y, primitive=False)
    out, launch = _run(matmul_kernel, shape, x, y, primitive=True)
    np.testing.assert_allclose(out, inlined, rtol=1e-6)
    np.testing.assert_allclose(out, np.asarray(x) @ np.asarray(y), rtol=1e-4, atol=1e-4)
    # The pipeline's DMAs are simulated: every x block (12 steps), the y blocks that
    # change, the output blocks written back.
    assert launch.dma_bytes >= (16 * 384 + 384 * 256 + 16 * 256) * 4
    assert launch.flops == 2 * 16 * 384 * 256


@pytest.mark.timeout(300)
def test_a_kernel_with_several_inputs_through_jax_s_primitive_matches_the_inlined_path():
    a, b, c = (jax.random.normal(jax.random.key(k), (32, 256), jnp.float32) for k in range(3))
    shape = jax.ShapeDtypeStruct((32, 256), jnp.float32)
    inlined, _ = _run(fused_kernel, shape, a, b, c, primitive=False)
    out, _ = _run(fused_kernel, shape, a, b, c, primitive=True)
    np.testing.assert_allclose(out, inlined, rtol=1e-6)
    step = np.repeat(np.arange(4) / 4, 8)[:, None]
    np.testing.assert_allclose(out, np.asarray(a) * np.asarray(b) + np.asarray(c) + step,
                               rtol=1e-6)


@pytest.mark.timeout(300)
def test_a_megacore_split_through_jax_s_primitive_is_refused_clearly():
    import palladium.pipeline as pp

    def kernel(x_hbm, o_hbm):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        pltpu.emit_pipeline(lambda x, o: o.__setitem__(..., x[...]), grid=(4,),
                            in_specs=[spec], out_specs=[spec], core_axis=0,
                            dimension_semantics=(pltpu.PARALLEL,))(x_hbm, o_hbm)

    x = jnp.ones((32, 128), jnp.float32)
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=pi.InterpretParams(compile_check="off"))
    device = jc.abstract_device(device_kind="TPU v5 lite", num_cores=1)
    mesh = AbstractMesh((), (), axis_types=(), abstract_device=device)
    with _flag(True), jax.sharding.use_abstract_mesh(mesh):
        lowered = jax.jit(call).trace(x).lower()
    with pytest.raises(pp.PipelineNotImplementedError, match="core_axis / core_axis_name"), \
            pi.errors_as_raised():
        lowered.compile()(x)


def program_ids_in_control_flow_kernel(x_hbm, o_hbm):
    """``pl.program_id`` inside a ``pl.when`` and a ``fori_loop`` over the block refs: it
    answers the pipeline's grid there too."""

    def body(x, o):
        @pl.when(x[0, 0] > -1e30)
        def _():
            o[...] = x[...] + pl.program_id(0).astype(jnp.float32)

        def row(r, carry):
            o[pl.ds(r, 1), 0:1] = jnp.full((1, 1), pl.program_id(0).astype(jnp.float32) * 100)
            return carry

        jax.lax.fori_loop(0, 2, row, 0)

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    pltpu.emit_pipeline(body, grid=(4,), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)


@pytest.mark.timeout(300)
def test_program_ids_inside_the_body_s_control_flow_answer_the_pipeline_grid():
    x = jax.random.normal(jax.random.key(4), (32, 128), jnp.float32)
    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    inlined, _ = _run(program_ids_in_control_flow_kernel, shape, x, primitive=False)
    out, _ = _run(program_ids_in_control_flow_kernel, shape, x, primitive=True)
    expected = np.asarray(x) + np.repeat(np.arange(4, dtype=np.float32), 8)[:, None]
    for i in range(4):
        expected[8 * i:8 * i + 2, 0] = 100.0 * i
    np.testing.assert_array_equal(inlined, expected)
    np.testing.assert_array_equal(out, expected)
