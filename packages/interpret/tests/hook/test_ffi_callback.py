"""The host callback of a single-device launch (hook/ffi_callback.py): the function sees
XLA's operand buffers themselves (read-only views, no copy), its results land in the
call's outputs, a failure is the call's error with the exception first, and the call's
entry goes when jax drops the executable."""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from palladium.interpret.hook import ffi_callback
from palladium.interpret.hook.host_call import host_call

pytestmark = pytest.mark.timeout(120)


def _call(fn, *out_shapes):
    return jax.jit(lambda *args: host_call(fn, list(out_shapes), *args, views=True))


def test_the_function_sees_the_operands_in_place_and_fills_the_outputs():
    assert ffi_callback.available()
    seen = []

    def fn(x, n):
        seen.append((x.flags.owndata, x.flags.writeable, x.dtype, x.shape, int(n[0])))
        return [np.tanh(x) * np.float32(n[0]), x.sum(axis=0, dtype=np.float32)]

    x = jnp.asarray(np.random.default_rng(0).standard_normal((256, 1024)), jnp.float32)
    n = jnp.asarray([3], jnp.int32)
    out, total = _call(fn, jax.ShapeDtypeStruct(x.shape, x.dtype),
                       jax.ShapeDtypeStruct((1024,), jnp.float32))(x, n)
    np.testing.assert_allclose(np.asarray(out), np.tanh(np.asarray(x)) * 3, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(total), np.asarray(x).sum(axis=0), rtol=1e-5)
    # a view of XLA's buffer (owns no data), read-only, of the operand's type
    assert seen == [(False, False, np.dtype(np.float32), (256, 1024), 3)]


def test_zero_size_operands_and_results():
    def fn(x, e):
        assert e.shape == (0, 4)
        return [x + 1, np.zeros((0,), np.int32)]

    x = jnp.arange(6, dtype=jnp.float32)
    out, empty = _call(fn, jax.ShapeDtypeStruct((6,), jnp.float32),
                       jax.ShapeDtypeStruct((0,), jnp.int32))(x, jnp.zeros((0, 4)))
    np.testing.assert_array_equal(np.asarray(out), np.arange(6) + 1)
    assert empty.shape == (0,)


def test_a_failure_is_the_calls_error_with_the_exception_first():
    def fn(x):
        raise ZeroDivisionError("the kernel divided by zero")

    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(_call(fn, jax.ShapeDtypeStruct((4,), jnp.float32))(jnp.ones(4)))
    text = str(info.value)
    assert text.startswith("INTERNAL: ZeroDivisionError: the kernel divided by zero\n")
    assert "in fn" in text  # then where: the traceback


def test_a_result_of_the_wrong_type_is_an_error():
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"result 0 is float64\[4\], "
                                                         r"expected float32\[4\]"):
        jax.block_until_ready(_call(lambda x: [np.zeros(4)],
                                    jax.ShapeDtypeStruct((4,), jnp.float32))(jnp.ones(4)))


def test_the_calls_entry_goes_with_its_executable():
    def fn(x):
        return [x * 2]

    before = set(ffi_callback._CALLS)
    call = _call(fn, jax.ShapeDtypeStruct((4,), jnp.float32))
    np.testing.assert_array_equal(np.asarray(call(jnp.ones(4))[0]), 2 * np.ones(4))
    added = set(ffi_callback._CALLS) - before
    assert len(added) == 1 and ffi_callback._CALLS[added.pop()].fn is fn
    del call
    jax.clear_caches()
    gc.collect()
    assert not any(c.fn is fn for c in ffi_callback._CALLS.values())


@pytest.mark.parametrize("dtype", [jnp.int4, jnp.uint4])
def test_packed_sub_byte_types_go_through_jaxs_callback(dtype):
    """XLA packs int4/uint4 two to a byte: the handler, which maps whole-byte elements,
    leaves such calls to jax's callback (which unpacks them)."""
    assert not ffi_callback.supports([jax.ShapeDtypeStruct((4,), dtype)])
    assert ffi_callback.supports([jax.ShapeDtypeStruct((4,), jnp.complex64),
                                  jax.ShapeDtypeStruct((4,), jnp.bool_),
                                  jax.ShapeDtypeStruct((4,), jnp.bfloat16)])
    x = (jnp.arange(8 * 128) % 5).astype(dtype).reshape(8, 128)
    out = _call(lambda v: [np.asarray(v)[::-1].copy()], jax.ShapeDtypeStruct(x.shape, dtype))(x)
    np.testing.assert_array_equal(np.asarray(out[0]).astype(np.int32),
                                  np.asarray(x)[::-1].astype(np.int32))
