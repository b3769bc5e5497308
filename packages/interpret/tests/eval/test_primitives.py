"""Primitives not covered elsewhere, each checked against a jnp/numpy reference: delay,
SMEM scratch and run_scoped SMEM, ref swap (plain and masked), jit / custom_vjp /
custom_jvp inside a kernel, named grid axes, num_programs, bind fallback."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams
from palladium.interpret.numpy_rules import NUMPY_RULES

P = InterpretParams()
X = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128) / 64


def _call(kernel, out_shape, *args, **kw):
    return pl.pallas_call(kernel, out_shape=out_shape, interpret=kw.pop("interpret", P), **kw)(*args)


def test_delay_is_accepted_with_static_and_dynamic_cycles():
    def kernel(n_ref, x_ref, o_ref):
        pl.delay(100)
        pl.delay(n_ref[0])
        o_ref[...] = x_ref[...] * 2

    out = _call(kernel, jax.ShapeDtypeStruct(X.shape, X.dtype), jnp.array([7], jnp.int32), X,
                in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(X.shape, lambda: (0, 0))])
    np.testing.assert_array_equal(out, X * 2)


def test_smem_scratch_and_run_scoped_smem():
    v = jnp.array([3, 1, 4, 1, 5], jnp.int32)

    def kernel(v_ref, o_ref, acc):
        acc[0] = 0
        acc[1] = 1

        def body(i, _):
            acc[0] = acc[0] + v_ref[i]
            acc[1] = acc[1] * v_ref[i]
            return 0

        jax.lax.fori_loop(0, 5, body, 0)

        def scoped(tmp):
            tmp[0] = acc[0] * 10
            tmp[1] = acc[1] - 1
            o_ref[0] = tmp[0] + tmp[1]
            o_ref[1] = tmp[1]

        pl.run_scoped(scoped, pltpu.SMEM((2,), jnp.int32))

    out = _call(
        kernel, jax.ShapeDtypeStruct((2,), jnp.int32), v,
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
        scratch_shapes=[pltpu.SMEM((2,), jnp.int32)],
    )
    s, p = int(v.sum()), int(v.prod())
    np.testing.assert_array_equal(out, [s * 10 + p - 1, p - 1])


def test_ref_swap_returns_the_old_value_plain_and_masked():
    def kernel(x_ref, o_ref, old_ref):
        o_ref[...] = jnp.full((16, 128), -1.0)
        old = o_ref.swap(x_ref[...])
        old_ref[...] = old
        rows = pl.ds(0, 8)
        mask = jax.lax.broadcasted_iota(jnp.int32, (8, 128), 1) % 2 == 0
        prev = pltpu.load(o_ref.at[rows], mask=mask)
        pltpu.store(o_ref.at[rows], prev * 3, mask=mask)

    # jax 0.10.2's Mosaic lowering has no masked loads: the TPU lowering check is off.
    out, old = _call(kernel, (jax.ShapeDtypeStruct(X.shape, X.dtype),) * 2, X,
                     interpret=InterpretParams(check_lowering=False))
    expected = np.array(X)
    expected[:8, ::2] *= 3
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(old, -1.0)


@jax.custom_vjp
def _clip_grad(x):
    return jnp.tanh(x)


_clip_grad.defvjp(lambda x: (jnp.tanh(x), x), lambda x, g: (jnp.clip(g, -1, 1),))


def test_jit_custom_vjp_and_custom_jvp_inside_a_kernel():
    @jax.jit
    def inner(v):
        return v * 2 + 1

    def kernel(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = inner(v) + _clip_grad(v) + jax.nn.softplus(v)  # softplus: custom_jvp

    out = _call(kernel, jax.ShapeDtypeStruct(X.shape, X.dtype), X)
    np.testing.assert_allclose(out, X * 2 + 1 + jnp.tanh(X) + jax.nn.softplus(X), rtol=1e-6)
    text = str(jax.make_jaxpr(lambda v: inner(v) + _clip_grad(v) + jax.nn.softplus(v))(X))
    assert "pjit" in text or "jit" in text
    assert "custom_vjp_call" in text and "custom_jvp_call" in text


def test_named_grid_axis_index_program_id_and_num_programs():
    def kernel(x_ref, o_ref):
        i = jax.lax.axis_index("rows")
        j = jax.lax.axis_index("cols")
        code = (i * 100 + j * 10 + pl.num_programs(0) * 1000 + pl.num_programs(1) * 10000)
        assert_same = (pl.program_id(0) == i) & (pl.program_id(1) == j)
        o_ref[...] = x_ref[...] + jnp.where(assert_same, code, -1).astype(jnp.float32)

    out = _call(
        kernel, jax.ShapeDtypeStruct((16, 256), jnp.float32), jnp.zeros((16, 256), jnp.float32),
        grid=(("rows", 2), ("cols", 2)),
        in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)),
    )
    expected = np.zeros((16, 256), np.float32)
    for i in range(2):
        for j in range(2):
            expected[8 * i : 8 * i + 8, 128 * j : 128 * j + 128] = i * 100 + j * 10 + 22000
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("fn, prim", [(jax.lax.erf_inv, "erf_inv"), (jax.lax.atan2, "atan2")])
def test_primitives_without_a_numpy_rule_are_bound_eagerly(fn, prim):
    assert prim not in {str(p) for p in NUMPY_RULES}
    y = X / 40 - 0.2

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = fn(x_ref[...]) if prim == "erf_inv" else fn(x_ref[...], y_ref[...])

    out = _call(kernel, jax.ShapeDtypeStruct(X.shape, X.dtype), y, X + 1)
    np.testing.assert_allclose(out, fn(y) if prim == "erf_inv" else fn(y, X + 1), rtol=1e-6)
