"""palladium's numpy rules raise no numpy RuntimeWarning (overflow in a cast, invalid
value): XLA computes the same values silently, so the warnings would be our noise."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

import palladium.interpret as pi


def _casts(x_ref, f16_ref, i32_ref, sq_ref):
    x = x_ref[...]
    f16_ref[...] = (x * 1e30).astype(jnp.float16)  # overflow in cast
    i32_ref[...] = x.astype(jnp.int32)  # NaN and inf to int
    sq_ref[...] = jnp.sqrt(x - 10.0)  # invalid value
    for _ in range(2):  # nested evaluation (a loop body) is covered too
        sq_ref[...] = jax.lax.fori_loop(0, 2, lambda i, a: a * 1e30, sq_ref[...])


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("error")
def test_numpy_rules_raise_no_runtime_warning():
    x = jnp.asarray(np.linspace(-3, 3, 8 * 128, dtype=np.float32).reshape(8, 128))
    x = x.at[0, :3].set(jnp.array([jnp.nan, jnp.inf, -jnp.inf]))
    shapes = [
        jax.ShapeDtypeStruct((8, 128), jnp.float16),
        jax.ShapeDtypeStruct((8, 128), jnp.int32),
        jax.ShapeDtypeStruct((8, 128), jnp.float32),
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # A TPU has no float16 vectors (the approximation says so, as the compiler does);
        # this test is about the interpreter's numpy casts, so the check is off.
        out = pl.pallas_call(_casts, out_shape=shapes,
                             interpret=pi.InterpretParams(check_lowering=False))(x)
        jax.block_until_ready(out)
    assert [str(w.message) for w in caught] == []
    expected = jax.jit(lambda x: [(x * 1e30).astype(jnp.float16), x.astype(jnp.int32)])(x)
    np.testing.assert_array_equal(out[0], expected[0])
    assert np.isinf(np.asarray(out[0], np.float32)[0, 1])
    # A NaN or out-of-range float to int is implementation-defined: only the rest is compared.
    np.testing.assert_array_equal(np.asarray(out[1])[1:], np.asarray(expected[1])[1:])
    assert np.isnan(np.asarray(out[2])[0, 0])


@pytest.mark.filterwarnings("error")
def test_a_rule_called_outside_a_launch_is_quiet_too():
    """Inside a launch the evaluator sets errstate once and the rules skip theirs
    (``ERRORS_IGNORED``); called on their own, the rules still set it."""
    from jax import lax

    from palladium.interpret.numpy_rules import NUMPY_RULES
    from palladium.interpret.numpy_rules.common import ERRORS_IGNORED, quiet

    big = np.full((4,), 3e38, np.float32)
    assert not ERRORS_IGNORED.get()
    assert np.isinf(NUMPY_RULES[lax.mul_p](big, big)).all()  # overflow: no warning
    with quiet():
        assert np.geterr()["over"] == "ignore"
    token = ERRORS_IGNORED.set(True)
    try:
        with np.errstate(all="ignore"), quiet():  # the evaluator's errstate holds
            assert np.geterr()["over"] == "ignore"
    finally:
        ERRORS_IGNORED.reset(token)
