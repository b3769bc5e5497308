"""The TPU compiler on the explicit MXU operations: it accepts on v7x what palladium's
model accepts (the accumulator's last address included), and rejects what the model
rejects (staging registers, MXU index, accumulator bounds and alignment, LHS rows, a
second push into a full register, any chip before v7)."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import palladium.interpret as pi

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "eval"))
from test_mxu import ERRORS, _normal, _one  # noqa: E402  (the model's tests, tests/eval)

from palladium.interpret import TpuCompilerError, TpuLoweringError
from palladium.interpret.fidelity import tpu_compiler

CHECKER = f"libtpu {tpu_compiler.compiler_version()} (jax {jax.__version__})"
OUT = jax.ShapeDtypeStruct((16, 256), jnp.float32)


def _compiled(kernel, chip="v7x"):
    from jax.experimental import pallas as pl

    return pl.pallas_call(kernel, out_shape=OUT,
                          interpret=pi.InterpretParams(chip=chip, compile_check="compiler"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("addr", [0, 2, 252])
def test_the_compiler_accepts_what_the_model_accepts(addr):
    x, y = _normal((16, 256), jnp.bfloat16), _normal((256, 256), jnp.bfloat16)
    with pi.timeline() as tl:
        out = _compiled(_one(acc={"acc_addr": addr}))(x, y)
        out.block_until_ready()
    expected = np.asarray(x).astype(np.float32) @ np.asarray(y).astype(np.float32)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-4)
    assert tl.launches[-1].info.memory.checker == CHECKER


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(set(ERRORS) - {"empty_register"}))
def test_the_compiler_rejects_what_the_model_rejects(case):
    kwargs = dict(ERRORS[case][0])
    x = _normal(kwargs.pop("x_shape", (16, 256)), jnp.bfloat16)
    y = _normal((256, 256), jnp.bfloat16)
    with pytest.raises((TpuLoweringError, TpuCompilerError)) as info:
        _compiled(_one(**kwargs))(x, y).block_until_ready()
    assert CHECKER in str(info.value)


@pytest.mark.timeout(300)
def test_the_compiler_rejects_them_before_v7():
    x, y = _normal((16, 256), jnp.bfloat16), _normal((256, 256), jnp.bfloat16)
    with pytest.raises(TpuLoweringError,
                       match="Explicit MXU ops not supported on TPU generations < 7"):
        _compiled(_one(), chip="v6e")(x, y).block_until_ready()
