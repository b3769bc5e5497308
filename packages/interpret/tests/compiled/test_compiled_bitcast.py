"""Compiled launches read through bitcast refs and evaluate ``pltpu.bitcast`` as the
simulator does (``eval.refs.tpu_bitcast``: a change of bit width scales the
second-minor dimension, the low half first)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams
from palladium.interpret.compiled import compiled_launch
from palladium.interpret.eval.refs import tpu_bitcast
from palladium.interpret.run.execution_plan import WHOLE_LAUNCH

pytestmark = pytest.mark.timeout(300)

G, R, C = 8, 16, 128


@pytest.mark.parametrize("src, dst, shape", [
    (np.uint32, ml_dtypes.bfloat16, (3, 8, 128)),
    (ml_dtypes.bfloat16, np.uint32, (16, 128)),
    (np.int8, np.int32, (2, 32, 128)),
    (np.int32, np.int8, (8, 128)),
    (np.float32, np.int32, (8, 128)),
])
def test_the_traced_bitcast_gives_the_simulators_bits(src, dst, shape):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (*shape[:-1], shape[-1] * np.dtype(src).itemsize),
                     dtype=np.uint8).view(src)
    traced = np.asarray(jax.jit(lambda a: tpu_bitcast(a, dst, lax.bitcast_convert_type))(x))
    expected = tpu_bitcast(x, dst)
    assert traced.dtype == expected.dtype and traced.shape == expected.shape
    np.testing.assert_array_equal(traced.view(np.uint8), expected.view(np.uint8))


def _kernel(x_ref, o_ref, w_ref):
    # a read through a width-changing bitcast ref, and a same-width one before an index
    words = x_ref.bitcast(jnp.uint32)[...]  # (R // 2, C): rows 2i, 2i+1 packed
    first = x_ref.bitcast(jnp.int16)[0, :]  # the bf16 bits of row 0
    o_ref[...] = (words >> 3) ^ (words << 5)
    w_ref[...] = pltpu.bitcast(jnp.broadcast_to(first, (R, C)), jnp.int32)


def _call():
    return jax.jit(lambda x: pl.pallas_call(
        _kernel, grid=(G,),
        out_shape=(jax.ShapeDtypeStruct((G * R // 2, C), jnp.uint32),
                   jax.ShapeDtypeStruct((G * R // 2, C), jnp.int32)),
        in_specs=[pl.BlockSpec((R, C), lambda i: (i, 0))],
        out_specs=(pl.BlockSpec((R // 2, C), lambda i: (i, 0)),
                   pl.BlockSpec((R // 2, C), lambda i: (i, 0))),
        interpret=InterpretParams())(x))


def _reference(x):
    bits = x.view(np.uint16).astype(np.uint32).reshape(G, R // 2, 2, C)
    words = (bits[:, :, 0] | (bits[:, :, 1] << 16)).reshape(G * R // 2, C)
    first = x.view(np.uint16).reshape(G, R, C)[:, 0].astype(np.uint32)  # (G, C)
    pair = (first | (first << 16)).view(np.int32)
    return (words >> 3) ^ (words << 5), np.repeat(pair, R // 2, axis=0)


def test_a_kernel_reading_through_bitcast_refs_runs_compiled_with_the_simulators_bits(
        monkeypatch):
    monkeypatch.setattr(compiled_launch, "MIN_EQUATIONS_PER_LAUNCH", 0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((G * R, C)).astype(ml_dtypes.bfloat16)
    call = _call()
    before = compiled_launch.STATS["compiled"]
    outs = [[np.asarray(o) for o in call(x)] for _ in range(4)]
    assert compiled_launch.STATS["compiled"] == before + 5 - WHOLE_LAUNCH  # the hot ones
    expected = _reference(x)
    for out in outs:
        for got, want in zip(out, expected):
            np.testing.assert_array_equal(got, want)


def test_jax_ragged_paged_attention_in_bf16_runs_compiled_once_hot():
    """jax's ragged paged attention in bfloat16 reads its KV pages through bitcast refs
    (two bf16 rows per 32-bit word) and unpacks them with ``pltpu.bitcast``: compiled from
    its ``WHOLE_LAUNCH``-th launch, with the simulated launches' values and close to its reference."""
    import functools

    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa
    from test_jax_kernels import ragged_paged_attention_inputs

    import palladium.interpret as pi

    args, n = ragged_paged_attention_inputs()
    args = (args[0].astype(jnp.bfloat16), args[1].astype(jnp.bfloat16), *args[2:])
    call = jax.jit(functools.partial(rpa.ragged_paged_attention, num_kv_pages_per_block=4,
                                     num_queries_per_block=8))
    before = compiled_launch.STATS["compiled"]
    with pi.force_tpu_interpret_mode(InterpretParams(compile_check="approximate")):
        outs = [np.asarray(call(*args).astype(jnp.float32))[:n] for _ in range(WHOLE_LAUNCH)]
    assert compiled_launch.STATS["compiled"] - before == 1
    reference = np.asarray(rpa.ref_ragged_paged_attention(*args).astype(jnp.float32))[:n]
    for out in outs:
        np.testing.assert_allclose(out, reference, rtol=2e-2, atol=2e-2)
    # bf16 outputs: the compiled and simulated launches may differ by a bf16 rounding step
    np.testing.assert_allclose(outs[-1], outs[0], rtol=1e-2, atol=1e-2)
