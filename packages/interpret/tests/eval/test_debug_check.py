"""Runtime asserts in kernels: ``pl.debug_check`` checks when ``pl.enable_debug_checks``
is on at lowering (as jax's Mosaic lowering compiles it in), raising ``DebugCheckError``
with the check's message, kernel line, grid point and core; a plain ``checkify.check`` is
refused as Mosaic refuses it."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify
from jax.experimental import pallas as pl

import palladium.interpret as pi
from palladium.interpret import DebugCheckError, TpuLoweringError, UnsupportedFeatureError

X = jnp.arange(4 * 8 * 128, dtype=jnp.float32).reshape(32, 128)


def checked(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1
    pl.debug_check(jnp.all(x_ref[...] >= 0), "negative input")
    pl.debug_check(pl.program_id(0) != 2, "grid point 2 is not allowed")


LINE = inspect.getsourcelines(checked)[1] + 3


def _call(kernel, **params):
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype), grid=(4,),
                          in_specs=[spec], out_specs=spec,
                          interpret=pi.InterpretParams(compile_check="approximate", **params))


@pytest.mark.timeout(120)
def test_a_failing_debug_check_raises_with_its_message_line_grid_point_and_core():
    with pl.enable_debug_checks(True):
        call = jax.jit(_call(checked))
        with pytest.raises(DebugCheckError) as info, pi.errors_as_raised():
            jax.block_until_ready(call(X))  # (a failure may surface when awaited)
    assert str(info.value) == (
        "pl.debug_check failed: grid point 2 is not allowed (kernel 'checked', grid point "
        f"(2,), device 0 core 0 (test_debug_check.py:{LINE}))")


@pytest.mark.timeout(120)
def test_passing_debug_checks_are_silent():
    def fine(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1
        pl.debug_check(jnp.all(x_ref[...] >= 0), "negative input")

    with pl.enable_debug_checks(True):
        out = _call(fine)(X)
    np.testing.assert_array_equal(out, np.asarray(X) + 1)


@pytest.mark.timeout(120)
def test_debug_checks_are_dropped_unless_enabled_at_lowering():
    # jax's runtime_assert_is_noop_when_not_enabled: the kernel runs, the check is gone.
    with pl.enable_debug_checks(False):
        out = _call(checked)(X)
    np.testing.assert_array_equal(out, np.asarray(X) + 1)


@pytest.mark.timeout(120)
def test_a_vector_condition_fails_if_any_element_fails():
    with pl.enable_debug_checks(True), pytest.raises(DebugCheckError,
                                                     match="negative input"), \
            pi.errors_as_raised():
        jax.block_until_ready(_call(checked)(X - 1))  # (a failure may surface when awaited)


def plain_check(x_ref, o_ref):
    o_ref[...] = x_ref[...]
    checkify.check(jnp.all(x_ref[...] >= 0), "negative input")


@pytest.mark.timeout(120)
def test_a_plain_checkify_check_is_refused_as_mosaic_refuses_it():
    with pytest.raises(TpuLoweringError, match="Non-debug checks are not supported by the "
                                               "Mosaic backend"):
        _call(plain_check)(X)
    # With the lowering check off, the interpreter refuses it itself.
    with pytest.raises(UnsupportedFeatureError) as info, pi.errors_as_raised():
        _call(plain_check, check_lowering=False)(X)
    assert str(info.value).startswith(
        "checkify.check inside a kernel is not supported on a TPU: jax's Mosaic lowering "
        "rejects it")
    assert "pl.debug_check(condition, message)" in str(info.value)
