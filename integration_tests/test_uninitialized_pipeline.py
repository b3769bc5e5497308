"""``uninitialized_reads`` with the pipeline emitter: a correct pipeline (both paths,
races on and off) is silent; a body reading scratch nothing wrote is reported at its line."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.pipeline as pp
from palladium.interpret import (
    InterpretParams,
    UninitializedReadError,
    UninitializedUseError,
    errors_as_raised,
)

pytestmark = pytest.mark.timeout(120)

ANY = pl.BlockSpec(memory_space=pl.ANY)
F32 = jnp.float32
RACES = pytest.mark.parametrize("detect_races", [False, True], ids=["races-off", "races-on"])


def _params(mode="raise", **kw):
    return InterpretParams(uninitialized_reads=mode, **kw)


@RACES
@pytest.mark.parametrize("mode", ["raise", "on_use"])
@pytest.mark.parametrize("use_primitive", [False, True])
def test_a_pipeline_emitter_kernel_is_silent(detect_races, use_primitive, mode):
    def add_one(x_hbm, o_hbm):
        def body(x, o):
            o[...] = x[...] + 1.0

        pp.emit_pipeline(
            body, grid=(x_hbm.shape[0] // 8,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0), pipeline_mode=pp.Buffered(3))],
            out_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
            use_primitive=use_primitive,
        )(x_hbm, o_hbm)

    x = jnp.arange(64 * 128, dtype=F32).reshape(64, 128)
    out = pl.pallas_call(add_one, out_shape=jax.ShapeDtypeStruct(x.shape, F32),
                         in_specs=[ANY], out_specs=ANY,
                         interpret=_params(mode, detect_races=detect_races))(x)
    np.testing.assert_array_equal(out, x + 1)


def test_a_pipeline_body_reading_never_written_scratch_is_reported():
    def kernel(x_hbm, o_hbm, acc):
        def body(x, o):
            acc[...] += x[...]  # BUG: acc is never zeroed
            o[...] = acc[...]

        pp.emit_pipeline(body, grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                         out_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))])(x_hbm, o_hbm)

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 128), F32),
                       in_specs=[ANY], out_specs=ANY,
                       scratch_shapes=[pltpu.VMEM((8, 128), F32)], interpret=_params())
    with pytest.raises(UninitializedReadError, match=r"'acc' \(VMEM, device 0 core 0\) region "
                       r"\[0:8, 0:128\] \(1024 of the 1024 .* grid point \(\), device 0 core 0 "
                       r"\(test_uninitialized_pipeline.py:\d+\)"), errors_as_raised():
        jax.block_until_ready(f(jnp.ones((16, 128), F32)))


@pytest.mark.parametrize("use_primitive", [False, True])
def test_by_default_an_unzeroed_accumulator_in_a_pipeline_body_is_reported_at_the_output(
        use_primitive):
    def kernel(x_hbm, o_hbm, acc):
        def body(x, o):
            acc[...] += x[...]  # BUG: acc is never zeroed
            o[...] = acc[...]

        pp.emit_pipeline(body, grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                         out_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                         use_primitive=use_primitive)(x_hbm, o_hbm)

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 128), F32),
                       in_specs=[ANY], out_specs=ANY,
                       scratch_shapes=[pltpu.VMEM((8, 128), F32)], interpret=InterpretParams())
    for _ in range(4):
        with pytest.raises(UninitializedUseError, match=r"output 'o_hbm' \(HBM, device 0\) holds "
                           r"data derived from uninitialised memory in region \[0:16, 0:128\] .*"
                           r"derived from 'acc' \(VMEM, device 0 core 0\) region \[0:8, 0:128\] "
                           r"read at .*\(test_uninitialized_pipeline.py:\d+\) before anything "
                           r"wrote it"), errors_as_raised():
            jax.block_until_ready(f(jnp.ones((16, 128), F32)))
