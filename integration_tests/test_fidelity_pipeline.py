"""palladium.pipeline kernels go through the TPU lowering check like any kernel: a body
Mosaic cannot lower is a ``TpuLoweringError`` at the body's line, on both of the
pipeline's paths (inlined, and the ``emit_pipeline`` primitive that is expanded when
lowered to Mosaic); the twin with a supported body runs."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

import palladium.interpret as pi
import palladium.pipeline as pp

ROWS, COLS, BLOCK = 32, 256, (8, 128)
X = jnp.arange(ROWS * COLS, dtype=jnp.float32).reshape(ROWS, COLS) / COLS


def _pipelined(op, chip, use_primitive):
    def kernel(x_hbm, o_hbm):
        def body(x, o):
            o[...] = op(x[...])

        spec = pl.BlockSpec(BLOCK, lambda i, j: (i, j))
        pp.emit_pipeline(body, grid=(ROWS // BLOCK[0], COLS // BLOCK[1]), in_specs=[spec],
                         out_specs=[spec], use_primitive=use_primitive)(x_hbm, o_hbm)

    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
                          in_specs=[any_spec], out_specs=any_spec,
                          interpret=pi.InterpretParams(chip=chip))


@pytest.mark.parametrize("use_primitive", [False, True], ids=["inlined", "primitive"])
@pytest.mark.parametrize("chip", ["v4", "v5e", "v6e"])
def test_a_pipeline_body_mosaic_rejects_is_an_error_at_its_line(chip, use_primitive):
    with pytest.raises(pi.TpuLoweringError) as info:
        _pipelined(lambda v: jnp.cumsum(v, axis=1), chip, use_primitive)(X)
    msg = str(info.value)
    assert "kernel 'kernel' (pallas_call at test_fidelity_pipeline.py:" in msg
    assert re.search(rf"TPU {chip} at test_fidelity_pipeline\.py:\d+ \(cumsum\)", msg), msg
    assert "Unimplemented primitive in Pallas TPU lowering for tc: cumsum" in msg


@pytest.mark.parametrize("use_primitive", [False, True], ids=["inlined", "primitive"])
@pytest.mark.parametrize("chip", ["v4", "v5e", "v6e"])
def test_its_twin_with_a_supported_body_runs(chip, use_primitive):
    out = _pipelined(lambda v: v * 2 + 1, chip, use_primitive)(X)
    np.testing.assert_allclose(out, np.asarray(X) * 2 + 1)
