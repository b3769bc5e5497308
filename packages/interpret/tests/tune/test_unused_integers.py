"""Issue 40, item 4: ``predict`` does not compute integer arrays that steer nothing
(``InterpretParams(skip_unused_integer_ops=True)``, ``eval/steering_values.py``).

Each kernel is predicted with and without the shortcut: the same numbers, where it
applies (an ``int8`` dot accumulated into an output block) and where it must not (an
integer dot deciding a ``pl.when``, or stored into SMEM and read back as a DMA's index,
or a launch computing the indices another prefetches). Work avoided is asserted by what
the analysis answers and by counting the dots computed, never by time.
"""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi
from palladium.interpret.eval import program
from palladium.interpret.eval.steering_values import unused_values

predict_module = importlib.import_module("palladium.interpret.tune.predict")

I8, I32, F32 = jnp.int8, jnp.int32, jnp.float32


def _dot(x, y):
    return jax.lax.dot(x, y, preferred_element_type=I32)


def int8_matmul(x, y):
    """An int8 dot accumulated into an int32 output block, four times per step."""
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

        def step(i, c):
            o_ref[...] += _dot(x_ref[...], y_ref[...])
            return c
        jax.lax.fori_loop(0, 4, step, 0)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((256, 256), I32),
                          grid=(2,), in_specs=[pl.BlockSpec((128, 256), lambda i: (i, 0)),
                                               pl.BlockSpec((256, 256), lambda i: (0, 0))],
                          out_specs=pl.BlockSpec((128, 256), lambda i: (i, 0)))(x, y)


def dot_decides_a_branch(x, y):
    """An integer dot whose sum decides a pl.when around a float store and a DMA."""
    def kernel(x_ref, y_ref, f_ref, o_ref, f_out, buf, sem):
        o_ref[...] = _dot(x_ref[...], y_ref[...])

        @pl.when(jnp.sum(o_ref[...]) > 0)
        def _():
            f_out[...] = f_ref[...] * 2.0
            copy = pltpu.make_async_copy(f_ref, buf, sem)
            copy.start()
            copy.wait()

    return pl.pallas_call(
        kernel, out_shape=(jax.ShapeDtypeStruct((128, 128), I32),
                           jax.ShapeDtypeStruct((128, 128), F32)),
        scratch_shapes=[pltpu.VMEM((128, 128), F32), pltpu.SemaphoreType.DMA(())],
    )(x, y, jnp.ones((128, 128), F32))


def dot_indexes_a_dma(f):
    """An integer dot's result stored into SMEM, read back as a DMA's row index (its
    operands made in the kernel: a value read from VMEM that steers makes the analysis
    give up)."""
    def kernel(f_ref, o_ref, idx, buf, sem):
        x = (jax.lax.broadcasted_iota(I32, (8, 128), 1) % 3).astype(I8)
        y = (jax.lax.broadcasted_iota(I32, (128, 128), 0) % 5 - 2).astype(I8)
        d = _dot(x, y)
        idx[0] = jnp.sum(d) % 8
        row = idx[0]
        for _ in range(3):
            copy = pltpu.make_async_copy(f_ref.at[pl.ds(row * 8, 8)], buf, sem)
            copy.start()
            copy.wait()
            row = (row + 1) % 8
        o_ref[...] = buf[...]

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.SMEM((1,), I32), pltpu.VMEM((8, 128), F32),
                        pltpu.SemaphoreType.DMA(())],
    )(f)


def chained(x, y, f):
    """One launch computes (with an int dot) the page indices the next prefetches."""
    def first(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.abs(_dot(x_ref[...], y_ref[...])) % 4

    idx = pl.pallas_call(first, out_shape=jax.ShapeDtypeStruct((8, 128), I32))(x, y)

    def second(idx_ref, f_ref, o_ref):
        o_ref[...] = f_ref[...] + 1.0

    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(16,),
        in_specs=[pl.BlockSpec((8, 128), lambda i, idx: (idx[i % 8, i], 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, idx: (i, 0)))
    return pl.pallas_call(second, grid_spec=spec,
                          out_shape=jax.ShapeDtypeStruct((128, 128), F32))(idx, f)


def _ints(shape, seed):
    return jnp.asarray(np.random.default_rng(seed).integers(-3, 4, shape), I8)


CASES = {
    "int8 matmul": (int8_matmul, (jax.ShapeDtypeStruct((256, 256), I8),
                                  jax.ShapeDtypeStruct((256, 256), I8)), True),
    "int dot decides a pl.when": (dot_decides_a_branch,
                                  (_ints((128, 128), 1), _ints((128, 128), 2)), False),
    "int dot indexes a DMA": (dot_indexes_a_dma, (jax.ShapeDtypeStruct((64, 128), F32),), False),
    "a launch prefetches another's results": (
        chained, (_ints((8, 128), 5), _ints((128, 128), 6),
                  jax.ShapeDtypeStruct((32, 128), F32)), False),
}


@pytest.fixture
def dots(monkeypatch):
    """The integer dot_generals the evaluator computed (not skipped)."""
    counted = []
    skipped = program._skipped

    def counting(ev, eqn, float_outs):
        skip = skipped(ev, eqn, float_outs)
        if eqn.primitive is jax.lax.dot_general_p and not float_outs and not skip:
            counted.append(1)
        return skip

    monkeypatch.setattr(program, "_skipped", counting)
    return counted


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(CASES))
def test_skipping_unused_integers_predicts_the_same(name, dots):
    fn, args, skippable = CASES[name]
    fast = pi.predict(fn, *args, compile_check="approximate")
    n_fast = len(dots)
    full = pi.predict(fn, *args, compile_check="approximate", skip_unused_integer_ops=False)
    n_full = len(dots) - n_fast
    assert fast.compiles and full.compiles
    assert fast.predicted_seconds == pytest.approx(full.predicted_seconds, rel=1e-9)
    assert fast.flops == pytest.approx(full.flops, rel=1e-9)
    assert fast.dma_bytes == full.dma_bytes and fast.grid_steps == full.grid_steps
    assert fast.launches[0].by_primitive == pytest.approx(full.launches[0].by_primitive)
    assert n_full > 0
    assert (n_fast == 0) if skippable else (n_fast == n_full)


def _kernel_jaxpr(fn, args):
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    return next(e.params["jaxpr"] for e in jaxpr.eqns if e.primitive.name == "pallas_call")


def _dot_outputs(jaxpr):
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive is jax.lax.dot_general_p:
            found.extend(eqn.outvars)
        for j in (v for p in eqn.params.values() for v in (p if isinstance(p, tuple) else (p,))):
            inner = getattr(j, "jaxpr", None)
            if inner is not None and hasattr(inner, "eqns"):
                found.extend(_dot_outputs(inner))
    return found


@pytest.mark.timeout(120)
def test_the_analysis_finds_the_dots_that_steer_nothing():
    with pi.force_tpu_interpret_mode():
        body = _kernel_jaxpr(int8_matmul, CASES["int8 matmul"][1])
        [d] = _dot_outputs(body)
        assert d in unused_values(body)
        # stored into SMEM and read back as an index: steers
        body = _kernel_jaxpr(*CASES["int dot indexes a DMA"][:2])
        [d] = _dot_outputs(body)
        found = unused_values(body)
        assert found is not None and d not in found
        # stored into VMEM and read back to decide: memory steers, nothing is skipped
        assert unused_values(_kernel_jaxpr(*CASES["int dot decides a pl.when"][:2])) is None


@pytest.mark.timeout(120)
def test_a_launch_whose_results_another_prefetches_is_chained():
    fn, args, _ = CASES["a launch prefetches another's results"]
    assert predict_module._chained(jax.make_jaxpr(fn)(*args).jaxpr)
    assert not predict_module._chained(jax.make_jaxpr(int8_matmul)(*CASES["int8 matmul"][1]).jaxpr)


@pytest.mark.timeout(120)
def test_outside_predict_steering_integers_are_computed_and_unused_ones_are_zeros():
    x, y = _ints((128, 128), 1), _ints((128, 128), 2)
    with pi.force_tpu_interpret_mode(pi.InterpretParams(skip_unused_integer_ops=True)):
        ints, floats = dot_decides_a_branch(x, y)
    expect = np.int32(x) @ np.int32(y)
    assert expect.sum() > 0
    np.testing.assert_array_equal(np.asarray(floats), np.full((128, 128), 2.0, np.float32))
    # (the dot is stored into the output and read back to decide: computed)
    np.testing.assert_array_equal(np.asarray(ints), expect)
    # (equation by equation: a compiled segment would compute the dot)
    with pi.force_tpu_interpret_mode(pi.InterpretParams(skip_unused_integer_ops=True,
                                                        compile_segments=False)):
        out = int8_matmul(_ints((256, 256), 3), _ints((256, 256), 4))
    np.testing.assert_array_equal(np.asarray(out), 0)  # steers nothing: not computed


@pytest.mark.timeout(60)
def test_without_float_data_a_float_operand_is_not_copied_for_the_launch():
    from palladium.interpret.hook import jax_hook

    params = pi.InterpretParams(keep_float_data=False)
    f, i = np.ones((64, 128), np.float32), np.arange(12, dtype=np.int32).reshape(3, 4)
    stand_in = jax_hook._own_copy(f, params)
    assert stand_in.shape == f.shape and stand_in.dtype == f.dtype
    assert not any(stand_in.strides) and not stand_in.flags.writeable  # no memory
    copied = jax_hook._own_copy(i, params)
    np.testing.assert_array_equal(copied, i)
    assert copied is not i and copied.flags.writeable
    kept = jax_hook._own_copy(f, pi.InterpretParams())
    np.testing.assert_array_equal(kept, f)
    assert kept.flags.writeable and kept.base is None
