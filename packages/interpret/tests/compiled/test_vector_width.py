"""compiled/vector_width.py: a compiled launch is compiled for the host's widest vectors
only where that keeps every bit. The oracle: each primitive of ``LANE_WISE`` compiled
at XLA's default vector width and at ``WIDE``, on the same values, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _launch_harness import four_launches
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams
from palladium.interpret.compiled import compiled_launch, vector_width
from palladium.interpret.compiled.vector_width import CONTAINERS, DATA_MOVEMENT, LANE_WISE, WIDE

pytestmark = pytest.mark.timeout(600)

_SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 1e-45, 1e38, -1e38, 1.0, -1.0,
            0.5, -0.5, 2.0, 88.7, -88.7, 89.0, -104.0, 1e-8, 3.0, 0.99999, -0.99999, 65504.0]


def _values(dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.concatenate([_SPECIAL, rng.standard_normal(1500) * 4, rng.standard_normal(1000) * 100,
                        rng.uniform(-1, 1, 1000), rng.uniform(-1e-38, 1e-38, 200)])
    with np.errstate(over="ignore"):  # (f16: the large values overflow to inf)
        return x.astype(np.float32).astype(dtype)[:3709]  # (not a multiple of any width)


# name -> (arity, function): each exercises its primitive (checked below)
_OPS = {
    "abs": (1, jnp.abs), "acos": (1, lax.acos), "acosh": (1, lax.acosh), "add": (2, lax.add),
    "asin": (1, lax.asin), "asinh": (1, lax.asinh), "atan2": (2, lax.atan2),
    "atanh": (1, lax.atanh), "cbrt": (1, lax.cbrt), "ceil": (1, lax.ceil),
    "clamp": (3, lambda lo, x, hi: lax.clamp(lo, x, hi)), "cos": (1, lax.cos),
    "cosh": (1, lax.cosh), "digamma": (1, lax.digamma), "div": (2, lax.div),
    "eq": (2, lax.eq), "erf": (1, lax.erf), "erf_inv": (1, lax.erf_inv),
    "erfc": (1, lax.erfc), "exp": (1, lax.exp), "exp2": (1, lax.exp2),
    "expm1": (1, lax.expm1), "floor": (1, lax.floor), "ge": (2, lax.ge), "gt": (2, lax.gt),
    "integer_pow": (1, lambda x: lax.integer_pow(x, 3)), "is_finite": (1, lax.is_finite),
    "le": (2, lax.le), "lgamma": (1, lax.lgamma), "log": (1, lax.log),
    "log1p": (1, lax.log1p), "logistic": (1, lax.logistic), "lt": (2, lax.lt),
    "max": (2, lax.max), "min": (2, lax.min), "mul": (2, lax.mul), "ne": (2, lax.ne),
    "neg": (1, lax.neg), "nextafter": (2, lax.nextafter), "pow": (2, lax.pow),
    "reduce_precision": (1, lambda x: lax.reduce_precision(x, 5, 10)), "rem": (2, lax.rem),
    "round": (1, lax.round), "rsqrt": (1, lax.rsqrt),
    "select_n": (2, lambda a, b: lax.select_n(a > b, a, b)), "sign": (1, lax.sign),
    "sin": (1, lax.sin), "sinh": (1, lax.sinh), "sqrt": (1, lax.sqrt),
    "square": (1, lax.square), "sub": (2, lax.sub), "tan": (1, lax.tan), "tanh": (1, lax.tanh),
    "convert_element_type": (1, lambda x: (x.astype(jnp.bfloat16), x.astype(jnp.float16),
                                           x.astype(jnp.float32), x.astype(jnp.int32))),
}


def test_every_lane_wise_primitive_is_tested_and_the_containers_and_movers_compute_nothing():
    assert set(_OPS) == set(LANE_WISE)
    for name, (arity, fn) in _OPS.items():
        jaxpr = jax.make_jaxpr(fn)(*[np.float32(1)] * arity)
        assert name in {e.primitive.name for e in jaxpr.jaxpr.eqns}, name
    assert not (LANE_WISE | DATA_MOVEMENT) & CONTAINERS


_WIDE_HERE = pytest.mark.skipif(
    WIDE is None, reason="no 512-bit vectors on this host: every launch keeps XLA's default width")


@_WIDE_HERE
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.float16])
def test_each_lane_wise_primitive_gives_the_same_bits_at_both_widths(dtype):
    differ = []
    for name, (arity, fn) in _OPS.items():
        args = [_values(dtype, seed) for seed in range(arity)]
        lowered = jax.jit(fn).lower(*args)
        default = jax.tree.leaves(lowered.compile()(*args))
        wide = jax.tree.leaves(lowered.compile(compiler_options=WIDE)(*args))
        for a, b in zip(default, wide):
            a, b = np.asarray(a), np.asarray(b)
            if not np.array_equal(a.view(np.uint8), b.view(np.uint8)):
                differ.append(name)
    assert differ == []


def _jaxpr(fn, *args):
    return jax.make_jaxpr(fn)(*args)


def test_lane_wise_admits_elementwise_float_code_and_any_integer_code():
    x, i = np.ones((8, 128), np.float32), np.ones((8, 128), np.int32)
    assert vector_width.lane_wise(_jaxpr(lambda x: jnp.tanh(x) * jax.nn.sigmoid(x) + 1, x))
    assert vector_width.lane_wise(_jaxpr(lambda i: (i @ i.T).sum() + jnp.cumsum(i).max(), i))
    loop = _jaxpr(lambda x: lax.fori_loop(0, 4, lambda t, h: jnp.exp(h) * 0.5, x), x)
    assert vector_width.lane_wise(loop)


@pytest.mark.parametrize("fn", [
    lambda x: x @ x.T, lambda x: jnp.sum(x, axis=1), lambda x: jnp.max(x),
    lambda x: jnp.cumsum(x, axis=0), lambda x: jnp.arctan(x),
    lambda x: lax.fori_loop(0, 2, lambda t, h: h + jnp.sum(h), x),
    lambda x: lax.cond(x[0, 0] > 0, lambda: x @ x.T, lambda: x @ x.T),
], ids=["dot", "sum", "max", "cumsum", "atan", "sum in a loop", "dot in a cond"])
def test_lane_wise_refuses_float_code_whose_bits_the_width_may_change(fn):
    assert not vector_width.lane_wise(_jaxpr(fn, np.ones((8, 128), np.float32)))


def test_lane_wise_knows_bf16_as_a_float_and_refuses_the_types_it_was_not_tested_on():
    x = jnp.ones((8, 128), jnp.bfloat16)
    assert not vector_width.lane_wise(_jaxpr(lambda x: x @ x.T, x))
    assert vector_width.lane_wise(_jaxpr(lambda x: jnp.exp(x) * x, x))
    assert not vector_width.lane_wise(_jaxpr(lambda x: x * x, np.ones((8,), np.complex64)))
    assert not vector_width.lane_wise(_jaxpr(lambda x: x * 2, jnp.ones((8,), jnp.float8_e4m3fn)))


def _recurrence_kernel(x_ref, a_ref, o_ref, h_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
        h_ref[...] = jnp.zeros_like(h_ref)

    def step(t, h):
        a = jax.nn.sigmoid(a_ref[pl.ds(t, 1), :])
        h = a * h + jnp.sqrt(jnp.maximum(1.0 - a * a, 0.0)) * jnp.tanh(x_ref[pl.ds(t, 1), :])
        o_ref[pl.ds(t, 1), :] = h
        return h

    h_ref[...] = lax.fori_loop(0, 8, step, h_ref[...])


def _recurrence(x, a):
    row = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(
        _recurrence_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 8,),
        in_specs=[row, row], out_specs=row, scratch_shapes=[pltpu.VMEM((1, 128), jnp.float32)],
        interpret=InterpretParams(random_seed=29))(x, a)  # (a seed no other test uses)


@_WIDE_HERE
def test_an_elementwise_recurrence_compiled_wide_gives_the_bits_of_the_default_width(monkeypatch):
    rng = np.random.default_rng(5)
    x, a = (rng.standard_normal((136, 128), np.float32) for _ in range(2))
    wide_calls = []
    real = vector_width.lane_wise
    monkeypatch.setattr(vector_width, "lane_wise", lambda j: wide_calls.append(real(j)) or real(j))

    def launches():
        return four_launches(_recurrence, x, a)[-1]

    monkeypatch.setattr(compiled_launch, "launch_key", lambda *args: None)  # (no disk cache)
    wide = launches()
    assert wide_calls == [True]
    monkeypatch.setattr(vector_width, "WIDE", None)  # XLA's default width
    default = launches()
    np.testing.assert_array_equal(wide.view(np.uint32), default.view(np.uint32))


def test_only_an_x86_64_host_with_avx512_compiles_wide(tmp_path):
    flags = tmp_path / "cpuinfo"
    flags.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n")
    plain = tmp_path / "cpuinfo-avx2"
    plain.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n")
    assert vector_width.host_has_512_bit_vectors("x86_64", str(flags))
    assert not vector_width.host_has_512_bit_vectors("x86_64", str(plain))
    assert not vector_width.host_has_512_bit_vectors("aarch64", str(flags))  # (arm64: never)
    assert not vector_width.host_has_512_bit_vectors("x86_64", str(tmp_path / "absent"))
