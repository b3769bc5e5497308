"""Blocked pallas_calls under palladium's interpreter, compared with jnp."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams


def matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += x_ref[...] @ y_ref[...]

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul(x, y, params, bm=64, bn=128, bk=64):
    m, k = x.shape
    _, n = y.shape
    return pl.pallas_call(
        matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
            pl.BlockSpec((bk, bn), lambda i, j, k: (k, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")
        ),
        # (64, 64) blocks of 128-wide arrays: Mosaic rejects them; these tests are about the
        # interpreter, so the TPU lowering check is off.
        interpret=dataclasses.replace(params, check_lowering=False),
    )(x, y)


@pytest.fixture(scope="module")
def xy():
    x = jax.random.normal(jax.random.key(0), (128, 128), jnp.float32)
    y = jax.random.normal(jax.random.key(1), (128, 256), jnp.float32)
    return x, y


def test_matmul_eager(xy):
    x, y = xy
    np.testing.assert_allclose(matmul(x, y, InterpretParams()), x @ y, rtol=1e-5, atol=1e-4)


def test_matmul_jit(xy):
    x, y = xy
    f = jax.jit(lambda a, b: matmul(a, b, InterpretParams()))
    np.testing.assert_allclose(f(x, y), x @ y, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(f(x + 1, y), (x + 1) @ y, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("cores", [2, 3])
def test_matmul_megacore(xy, cores):
    x, y = xy
    params = InterpretParams(num_cores_or_threads=cores, detect_races=True, random_seed=5)
    np.testing.assert_allclose(matmul(x, y, params), x @ y, rtol=1e-5, atol=1e-4)


def test_matmul_bf16(xy):
    x, y = (a.astype(jnp.bfloat16) for a in xy)
    out = matmul(x, y, InterpretParams())
    ref = jnp.dot(x, y, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(ref, np.float32), rtol=2e-2, atol=2e-1
    )
