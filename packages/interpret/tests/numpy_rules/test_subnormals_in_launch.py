"""Subnormals inside a launch. XLA runs host callbacks (so every palladium launch) with
denormals-are-zero / flush-to-zero set: there a float comparison reads a subnormal as
zero, so the numpy rules find subnormals from the raw bits. Each kernel here is compared
bit for bit with the same jnp expression under ``jax.jit`` on the CPU backend, and the
rules' helpers are checked inside a host callback's FP environment, not only outside it."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl

from palladium.interpret import InterpretParams
from palladium.interpret.numpy_rules import NUMPY_RULES, PREFLUSHED_RULES, flush, has_subnormal_f32
from palladium.interpret.numpy_rules.elementwise import PASS_THROUGH

F32 = np.float32
A = np.array([-1e-40, 1e-40, -1e-40, 0.0, 1e-40, 2.0, -3e-39, 1e-40], F32)
B = np.array([1e-40, -1e-40, -0.0, -1e-40, 0.0, 1e-40, 5e-39, 1e-40], F32)


def _bits(x):
    x = np.asarray(x)
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def _in_launch(fn, *args):
    def kernel(*refs):
        refs[-1][...] = fn(*[r[...] for r in refs[:-1]])

    out = jax.eval_shape(fn, *args)
    # Numerics, not Mosaic conformance: some of these ops do not lower for a TPU.
    params = InterpretParams(check_lowering=False)
    return np.asarray(pl.pallas_call(kernel, out_shape=out, interpret=params)(*args))


BINARY = {
    "maximum": jnp.maximum, "minimum": jnp.minimum, "add": jnp.add, "sub": jnp.subtract,
    "mul": jnp.multiply, "lt": jnp.less, "eq": jnp.equal,
}
UNARY = {
    "sign": jnp.sign, "tanh": jnp.tanh, "sin": jnp.sin, "log1p": jnp.log1p,
    "expm1": jnp.expm1, "exp": jnp.exp, "cos": jnp.cos, "floor": jnp.floor,
    "sqrt_abs": lambda x: jnp.sqrt(jnp.abs(x)), "neg": jnp.negative, "abs": jnp.abs,
    "to_bool": lambda x: x.astype(jnp.bool_), "log_abs": lambda x: jnp.log(jnp.abs(x)),
    "tanh_then_max": lambda x: jnp.maximum(jnp.tanh(x), jnp.float32(0)),
    "tanh_then_add": lambda x: jnp.tanh(x) + x,
}


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_ops_on_subnormals_match_xla(name):
    fn = BINARY[name]
    np.testing.assert_array_equal(_bits(_in_launch(fn, A, B)), _bits(jax.jit(fn)(A, B)))


@pytest.mark.parametrize("dtype", [F32, ml_dtypes.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_ops_on_subnormals_match_xla(name, dtype):
    fn = UNARY[name]
    x = A.astype(dtype)
    if dtype != F32:  # bf16 subnormals (the f32 values above round to bf16 subnormals)
        x = np.concatenate([x, np.array([1e-39, -2e-39], F32).astype(dtype)])
    ours, xla = _in_launch(fn, x), np.asarray(jax.jit(fn)(x))
    if name in ("exp", "cos", "tanh", "sin", "expm1", "log1p", "log_abs", "tanh_then_add",
                "tanh_then_max"):
        # XLA's approximations on normal values are matched within a few ulp (see
        # test_numpy_rules); what is exact is every subnormal input and every result.
        small = np.abs(x.astype(F32)) < np.finfo(F32).tiny
        np.testing.assert_array_equal(_bits(ours)[small], _bits(xla)[small])
        np.testing.assert_allclose(ours.astype(F32), xla.astype(F32), rtol=1e-6 if dtype == F32
                                   else 1e-2)
    else:
        np.testing.assert_array_equal(_bits(ours), _bits(xla))


def test_issue_reproducer_maximum_of_opposite_subnormals():
    a, b = np.full((8, 128), -1e-40, F32), np.full((8, 128), 1e-40, F32)
    ours = _in_launch(jnp.maximum, a, b)
    np.testing.assert_array_equal(_bits(ours), _bits(jax.jit(jnp.maximum)(a, b)))
    np.testing.assert_array_equal(_bits(ours), 0)  # both read as zero: +0 wins


def _inside_callback(fn, x, out_dtype):
    """``fn(x)`` run inside a host callback (XLA's DAZ/FTZ environment)."""
    out = jax.ShapeDtypeStruct(x.shape, out_dtype)
    return np.asarray(jax.jit(lambda v: jax.pure_callback(fn, out, v))(x))


def test_flush_and_subnormal_checks_inside_a_callback():
    x = np.array([1e-40, -1e-40, 0.0, -0.0, 1.0, np.nan, np.finfo(F32).tiny, 2e-45], F32)
    want = np.where((np.abs(x) < np.finfo(F32).tiny) & (x != 0), np.copysign(F32(0), x), x)
    got = _inside_callback(lambda v: flush(np.asarray(v)), x, F32)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    for values, expected in (([1e-40, 1.0], 1), ([-2e-45, 0.0], 1), ([0.0, -0.0], 0),
                             ([np.finfo(F32).tiny, np.nan], 0)):
        found = _inside_callback(
            lambda v: np.full(2, has_subnormal_f32(np.asarray(v)), np.int32),
            np.array(values, F32), np.int32)
        assert found.tolist() == [expected, expected], values


@pytest.mark.parametrize("prim", sorted(PASS_THROUGH, key=str), ids=str)
def test_pass_through_functions_leave_subnormals_to_bind(prim):
    x = np.array([1e-40, 1.0], F32)
    assert NUMPY_RULES[prim](x, accuracy=None) is NotImplemented
    assert NUMPY_RULES[prim](x.astype(ml_dtypes.bfloat16) * 0 + np.array(
        [1e-39, 1.0], F32).astype(ml_dtypes.bfloat16), accuracy=None) is NotImplemented
    assert NUMPY_RULES[prim](np.array([1e-3, 1.0], F32), accuracy=None) is not NotImplemented
    assert PREFLUSHED_RULES[prim](np.array([1e-3, 1.0], F32), accuracy=None) is not \
        NotImplemented
    assert prim in (lax.tanh_p, lax.sin_p, lax.expm1_p, lax.log1p_p)
