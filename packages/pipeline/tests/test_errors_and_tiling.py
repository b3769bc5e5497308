"""User mistakes raise palladium errors naming the operand; tiling per TPU generation."""

import warnings

import jax
import jax.numpy as jnp
import pytest
from _pipeline_harness import hbm_call, on_tpu
from jax.experimental import pallas as pl

import palladium.pipeline as pp
from palladium.pipeline.tiling import DEFAULT_TPU_GENERATION, infer_tiling, tpu_generation


def trace(kernel, shape=(32, 128)):
    call = hbm_call(kernel, jax.ShapeDtypeStruct(shape, jnp.float32))
    return jax.make_jaxpr(call)(jnp.zeros(shape, jnp.float32))


@pytest.mark.parametrize("grid", [(0,), (4, -1)])
def test_non_positive_grid_is_rejected(grid):
    with pytest.raises(pp.PipelineConfigError, match="strictly positive") as info:
        pp.emit_pipeline(lambda: None, grid=grid)
    assert str(grid) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_revisit_mode_is_rejected_with_explanation():
    def kernel(x_hbm, o_hbm):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        out = pl.BlockSpec((8, 128), lambda i: (i, 0),
                           pipeline_mode=pl.Buffered(2, revisit=pl.RevisitMode.ANY))
        pp.emit_pipeline(lambda x, o: None, grid=(4,), in_specs=[spec],
                         out_specs=[out])(x_hbm, o_hbm)

    with pytest.raises(pp.PipelineNotImplementedError) as info:
        trace(kernel)
    message = str(info.value)
    assert "out_specs[0]" in message and "does not implement RevisitMode" in message
    assert "in_buffer_count + out_buffer_count - 1 grid steps apart" in message


def test_output_lookahead_is_rejected():
    def kernel(x_hbm, o_hbm):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        out = pl.BlockSpec((8, 128), lambda i: (i, 0),
                           pipeline_mode=pp.Buffered(2, use_lookahead=True))
        pp.emit_pipeline(lambda x, o: None, grid=(4,), in_specs=[spec],
                         out_specs=[out])(x_hbm, o_hbm)

    with pytest.raises(pp.PipelineConfigError, match=r"out_specs\[0\].*lookahead"):
        trace(kernel)


@pytest.mark.parametrize("count", [0, (2, 0), (1, 2, 3), 1.5])
def test_bad_buffer_counts_name_the_operand(count):
    def kernel(x_hbm, o_hbm):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0), pipeline_mode=pp.Buffered(count))
        out = pl.BlockSpec((8, 128), lambda i: (i, 0))
        pp.emit_pipeline(lambda x, o: None, grid=(4,), in_specs=[spec],
                         out_specs=[out])(x_hbm, o_hbm)

    with pytest.raises(pp.PipelineConfigError, match=r"in_specs\[0\]: buffer_count"):
        trace(kernel)


def test_both_core_axes_rejected():
    with pytest.raises(pp.PipelineConfigError, match="Only one of `core_axis`"):
        pp.emit_pipeline(lambda: None, grid=(2,), core_axis=0, core_axis_name="core")


def test_buffer_type_manual_is_deprecated():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert pp.BufferType.MANUAL.value == 4
    assert any(issubclass(w.category, DeprecationWarning) and "MANUAL" in str(w.message)
               for w in caught)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pp.BufferType.INPUT_OUTPUT.is_input and pp.BufferType.INPUT_OUTPUT.is_output


def test_sync_copy_needs_exactly_one_buffered_ref():
    with pytest.raises(pp.PipelineConfigError, match="One of src or dst"):
        pp.sync_copy(object(), object(), ())


def test_cpu_has_a_default_generation_instead_of_a_crash():
    assert tpu_generation() == DEFAULT_TPU_GENERATION
    assert infer_tiling(jax.ShapeDtypeStruct((600, 600), jnp.float32)) == (8, 128)
    assert infer_tiling(jax.ShapeDtypeStruct((4, 600, 600), jnp.bfloat16)) == (1, 8, 128)
    assert infer_tiling(jax.ShapeDtypeStruct((1024,), jnp.float32)) == (128,)
    assert infer_tiling(jax.ShapeDtypeStruct((2, 3), jnp.float32)) == (2, 128)


@pytest.mark.parametrize("kind,generation", [("TPU v5 lite", 5), ("TPU v6 lite", 6),
                                             ("TPU7x", 7), ("TPU v3", 3)])
def test_generation_from_abstract_mesh(kind, generation):
    with on_tpu(kind):
        assert tpu_generation() == generation
        one_d = infer_tiling(jax.ShapeDtypeStruct((1024,), jnp.float32))
    # Generations before v4 use two-row sublane tiles for 1-D arrays.
    assert one_d == ((256,) if generation < 4 else (128,))


def test_explicit_sparse_core_tiling():
    value = jax.ShapeDtypeStruct((3, 64), jnp.float32)
    assert infer_tiling(value, pp.Tiling.SPARSE_CORE) == (1, 8)
    assert infer_tiling(jax.ShapeDtypeStruct((3, 64), jnp.bfloat16),
                        pp.Tiling.SPARSE_CORE) == (1, 16)
