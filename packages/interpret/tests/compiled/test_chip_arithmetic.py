"""Issue 42, item 2: the compiled paths compute what the chip computes. On a v5e,
``jnp.max``/``jnp.min`` propagate NaN and f32 ``a * x + y`` rounds the product and the
sum separately (``benchmarks/chip/compiled_semantics.py``); so does the simulator
(numpy). XLA's CPU backend drops NaN in a max/min reduction and contracts ``a * x + y``
into an FMA. Every call must give numpy's bits: the simulated calls, and the hot ones (the
whole-launch executable from call 2, or the kernel's hot compiled segments from call 3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from palladium.interpret import InterpretParams
from palladium.interpret.compiled import compiled_launch
from palladium.interpret.eval import chip_arithmetic
from palladium.interpret.run.execution_plan import WHOLE_LAUNCH

pytestmark = pytest.mark.timeout(300)

R, C, G = 64, 128, 4


@pytest.fixture(params=["whole launch", "segments"])
def compiled_path(request, monkeypatch):
    """Call 2 on runs the whole-launch executable, or (no whole launch) call 3 on the
    kernel body's hot compiled segments."""
    monkeypatch.setattr(compiled_launch, "MIN_EQUATIONS_PER_LAUNCH",
                        0 if request.param == "whole launch" else 1 << 60)
    return request.param


def _nan_call(seed):
    def kernel(x_ref, rows_ref, cols_ref, all_ref):
        x = x_ref[...]
        for _ in range(3):  # (enough equations for a hot segment)
            x = x + 0.0
        rows_ref[...] = jnp.broadcast_to(jnp.max(x, axis=0, keepdims=True), (8, C))
        cols_ref[...] = jnp.broadcast_to(jnp.min(x, axis=1, keepdims=True), (R, C))
        all_ref[...] = x * 0.0 + jnp.max(x)

    return jax.jit(lambda x: pl.pallas_call(
        kernel, grid=(G,), in_specs=[pl.BlockSpec((R, C), lambda i: (i, 0))],
        out_specs=[pl.BlockSpec((8, C), lambda i: (i, 0)), pl.BlockSpec((R, C), lambda i: (i, 0)),
                   pl.BlockSpec((R, C), lambda i: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((G * 8, C), jnp.float32),
                   jax.ShapeDtypeStruct((G * R, C), jnp.float32),
                   jax.ShapeDtypeStruct((G * R, C), jnp.float32)],
        interpret=InterpretParams(random_seed=seed))(x))


def test_max_and_min_propagate_nan_on_every_call(compiled_path):
    x = np.random.default_rng(1).standard_normal((G * R, C)).astype(np.float32)
    x[3, 5] = np.nan            # block 0: column 5's max, row 3's min, block 0's max
    x[R + 10, 7] = np.nan       # block 1
    blocks = np.float64(x).reshape(G, R, C)
    rows = np.repeat(blocks.max(axis=1), 8, axis=0).reshape(G * 8, C)
    cols = np.broadcast_to(blocks.min(axis=2)[:, :, None], (G, R, C)).reshape(G * R, C)
    whole = np.broadcast_to(blocks.max(axis=(1, 2))[:, None, None], (G, R, C)).reshape(G * R, C)
    call = _nan_call(4210 if compiled_path == "whole launch" else 4211)
    before = compiled_launch.STATS["compiled"]
    for n in range(4):
        got = [np.asarray(o) for o in call(x)]
        for out, ref in zip(got, (rows, cols, whole)):
            np.testing.assert_array_equal(out, ref.astype(np.float32), err_msg=f"call {n + 1}")
    assert np.isnan(got[2][:2 * R]).all() and not np.isnan(got[2][2 * R:]).any()
    ran_whole = compiled_launch.STATS["compiled"] - before
    assert ran_whole == (5 - WHOLE_LAUNCH if compiled_path == "whole launch" else 0)


def _axpy_call(seed):
    def kernel(a_ref, x_ref, y_ref, o_ref, p_ref):
        a, x, y = a_ref[...], x_ref[...], y_ref[...]
        o_ref[...] = a * x + y
        p_ref[...] = y - x * x + (a * a) * 0.5  # square, and a product in a difference

    spec = pl.BlockSpec((R, C), lambda i: (i, 0))
    return jax.jit(lambda a, x, y: pl.pallas_call(
        kernel, grid=(G,), in_specs=[spec] * 3, out_specs=[spec, spec],
        out_shape=[jax.ShapeDtypeStruct((G * R, C), jnp.float32)] * 2,
        interpret=InterpretParams(random_seed=seed))(a, x, y))


def test_f32_products_are_rounded_before_the_sum_on_every_call(compiled_path):
    rng = np.random.default_rng(2)
    a, x, y = (rng.standard_normal((G * R, C)).astype(np.float32) for _ in range(3))
    axpy = a * x + y  # numpy: two roundings, as the chip
    other = (y - x * x) + (a * a) * np.float32(0.5)
    fused = (np.float64(a) * np.float64(x) + np.float64(y)).astype(np.float32)
    assert (axpy != fused).mean() > 0.1  # an FMA would be seen
    call = _axpy_call(4212 if compiled_path == "whole launch" else 4213)
    for n in range(4):
        o, p = (np.asarray(v) for v in call(a, x, y))
        np.testing.assert_array_equal(o, axpy, err_msg=f"call {n + 1}")
        np.testing.assert_array_equal(p, other, err_msg=f"call {n + 1}")


def test_bind_adds_negative_zero_to_products_only_inside_a_chip_function():
    """``chip_arithmetic.bind`` adds the ``-0.0`` operand to a float product only while a
    ``chip_function`` traces (whose executable takes ``NEGATIVE_ZERO`` first): then
    ``a * x + y`` is two roundings; elsewhere the product is bound as it is."""
    rng = np.random.default_rng(3)
    a, x, y = (rng.standard_normal((256, 128)).astype(np.float32) for _ in range(3))
    mul = jax.make_jaxpr(lambda a, x: a * x)(a, x).eqns[0]

    def axpy(a, x, y):
        p, = chip_arithmetic.bind(mul.primitive, [a, x], mul.params)
        return p + y

    exe = jax.jit(chip_arithmetic.chip_function(axpy))
    np.testing.assert_array_equal(np.asarray(exe(chip_arithmetic.NEGATIVE_ZERO, a, x, y)),
                                  a * x + y)
    inside = jax.make_jaxpr(chip_arithmetic.chip_function(axpy))(np.float32(-0.0), a, x, y)
    outside = jax.make_jaxpr(axpy)(a, x, y)
    assert [e.primitive.name for e in inside.eqns] == ["mul", "add", "add"]
    assert [e.primitive.name for e in outside.eqns] == ["mul", "add"]
