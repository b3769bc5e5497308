"""Issue 42, item 7: ``predict`` rejects a configuration that does not fit before making
any operand (a 16 GiB spec ran out of memory, a 1 GiB one took +947 MiB), and says when
its walk of the kernel cannot be trusted: control flow steered by floating-point values
(which it does not compute) looped until the watchdog (a ``while`` on
``jnp.max(v) > 1``) or was predicted 36x too fast without a word (``pl.when(x[0, 0] >
0.5)`` around DMAs)."""

import functools
import importlib
import resource
import time
import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi

predict_module = importlib.import_module("palladium.interpret.tune.predict")

S = jax.ShapeDtypeStruct


def _copy(x, *, block):
    return pl.pallas_call(
        lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1.0),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // block[0],),
        in_specs=[pl.BlockSpec(block, lambda i: (i, 0))],
        out_specs=pl.BlockSpec(block, lambda i: (i, 0)))(x)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rows", [8192, 131072])  # 1 GiB and 16 GiB of f32 x 32768
def test_a_configuration_that_does_not_fit_is_rejected_before_any_operand_exists(
        monkeypatch, rows):
    made = []
    real = predict_module.concrete_operand
    monkeypatch.setattr(predict_module, "concrete_operand", lambda a: made.append(a) or real(a))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    p = pi.predict(functools.partial(_copy, block=(1024, 32768)), S((rows, 32768), jnp.float32),
                   compile_check="approximate")
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB
    assert not p.compiles and p.error == "TpuResourceError"
    assert "more than its scoped VMEM limit" in p.reason
    assert made == []  # no operand made
    assert grown < 256 << 10, grown


def _halving(x):
    """Halves a block until its largest element is at most 1: a ``while`` on floats."""
    def kernel(x_ref, o_ref):
        def more(v):
            return jnp.max(v) > 1.0

        o_ref[...] = jax.lax.while_loop(more, lambda v: v * 0.5, x_ref[...])

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)


def _guarded(x, src):
    """Eight DMAs, started only where a float of the block says so."""
    def kernel(x_ref, src_hbm, o_ref, buf, sem):
        @pl.when(x_ref[0, 0] > 0.5)
        def _():
            for i in range(8):
                c = pltpu.make_async_copy(src_hbm.at[i], buf.at[i], sem)
                c.start()
                c.wait()
        o_ref[...] = x_ref[...] * 2.0

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0)), pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        scratch_shapes=[pltpu.VMEM((8, 256, 128), jnp.float32), pltpu.SemaphoreType.DMA(())])(
            x, src)


@pytest.mark.timeout(120)
def test_a_loop_steered_by_floats_is_walked_a_few_times_and_marked_uncertain():
    start = time.monotonic()
    with pytest.warns(predict_module.UncertainPredictionWarning,
                      match=r"a while loop's test \(test_predict_fidelity.py:\d+\)"):
        p = pi.predict(_halving, S((32, 128), jnp.float32), compile_check="approximate",
                       watchdog_timeout=30.0)
    assert time.monotonic() - start < 20
    assert p.compiles
    assert len(p.float_steered) == 1 and p.float_steered[0].startswith("a while loop's test (")
    assert "float-steered" in p.summary()


@pytest.mark.timeout(120)
def test_a_branch_steered_by_floats_around_dmas_is_marked_uncertain():
    with pytest.warns(predict_module.UncertainPredictionWarning, match="a conditional"):
        p = pi.predict(_guarded, S((32, 128), jnp.float32), S((8, 256, 128), jnp.float32),
                       compile_check="approximate")
    assert p.compiles
    assert [u.split(" (")[0] for u in p.float_steered] == ["a conditional"]
    assert "test_predict_fidelity.py:" in p.float_steered[0]


@pytest.mark.timeout(120)
def test_integer_steered_control_flow_is_certain():
    def kernel(n_ref, x_ref, o_ref):
        @pl.when(n_ref[0] > 2)
        def _():
            o_ref[...] = x_ref[...] * 2.0

        @pl.when(n_ref[0] <= 2)
        def _():
            o_ref[...] = x_ref[...]

    def fn(n, x):
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(4,), in_specs=[pl.BlockSpec((8, 128), lambda i, n: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, n: (i, 0)))
        return pl.pallas_call(kernel, grid_spec=spec,
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(n, x)

    with warnings.catch_warnings():
        warnings.simplefilter("error", predict_module.UncertainPredictionWarning)
        p = pi.predict(fn, jnp.array([3], jnp.int32), S((32, 128), jnp.float32),
                       compile_check="approximate")
    assert p.compiles and p.float_steered == ()
