"""compiled/xla_forms.py: the forms the traced evaluator binds some pure primitives in
hold exactly the values of the primitive (a form is for XLA's speed, never its bits)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _launch_harness import four_launches
from jax import lax
from jax.experimental import pallas as pl

from palladium.interpret import InterpretParams
from palladium.interpret.compiled import compiled_launch, xla_forms

pytestmark = pytest.mark.timeout(300)


def _form(prim, *args, **params):
    return jax.jit(lambda *a: xla_forms.FORMS[prim](list(a), params)[0])(*args)


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.int8, np.int32, np.bool_])
@pytest.mark.parametrize("shape,reps", [
    ((256, 128), (1, 2)), ((8, 128), (3, 1)), ((5,), (4,)), ((2, 3, 4), (2, 1, 3)),
    ((7, 9), (1, 1)), ((4, 6), (0, 2)), ((1, 128), (16, 1)),
])
def test_tile_as_concatenations_holds_the_tiled_arrays_elements(dtype, shape, reps):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x[..., 0] = np.nan if np.issubdtype(dtype, np.floating) else x[..., 0]
    x = jnp.asarray(x).astype(dtype)
    ours, theirs = _form(lax.tile_p, x, reps=reps), lax.tile(x, reps)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    np.testing.assert_array_equal(np.asarray(ours).reshape(-1).view(np.uint8),
                                  np.asarray(theirs).reshape(-1).view(np.uint8))


def _kernel(s_ref, m_ref, o_ref):
    # splash attention's step: exp(s - m) with m tiled along the lanes
    o_ref[...] = jnp.exp(s_ref[...] - jnp.tile(m_ref[...], (1, 2)))


def _call(s, m):
    return pl.pallas_call(
        _kernel, out_shape=jax.ShapeDtypeStruct(s.shape, s.dtype), grid=(s.shape[0] // 64,),
        in_specs=[pl.BlockSpec((64, 256), lambda i: (i, 0)),
                  pl.BlockSpec((64, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((64, 256), lambda i: (i, 0)),
        interpret=InterpretParams(random_seed=31))(s, m)  # (a seed no other test uses)


def test_a_launch_compiled_whole_with_the_form_gives_the_bits_without_it(monkeypatch):
    rng = np.random.default_rng(2)
    s = rng.standard_normal((640, 256), np.float32) * 3
    m = rng.standard_normal((640, 128), np.float32)
    monkeypatch.setattr(compiled_launch, "launch_key", lambda *args: None)  # (no disk cache)
    monkeypatch.setattr(compiled_launch, "MIN_EQUATIONS_PER_LAUNCH", 1)

    def launches():
        return four_launches(_call, s, m)

    with_form = launches()
    monkeypatch.setattr(xla_forms, "FORMS", {})
    without = launches()
    for a, b in zip(with_form, without):  # (simulated, then compiled)
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
