"""``InterpretParams(deterministic_dot=True)``: a float ``dot_general`` gives the same
bits on every CPU. numpy's BLAS (OpenBLAS) picks its kernel family, and so its
accumulation order, per CPU: the same dot gave different bits under OpenBLAS's Haswell
and SandyBridge kernels (``OPENBLAS_CORETYPE`` selects them on one machine). The
deterministic path accumulates over the contracted dimension in order, one
correctly-rounded multiply and add per term (numpy elementwise ops, no BLAS, no FMA)."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from palladium.interpret import InterpretParams

_CHILD = textwrap.dedent("""
    import hashlib, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import pallas as pl
    from palladium.interpret import InterpretParams

    def dot_kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((128, 512)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((512, 128)), jnp.float32)
    for deterministic in (False, True):
        out = pl.pallas_call(dot_kernel, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32),
                             interpret=InterpretParams(deterministic_dot=deterministic))(x, y)
        print(deterministic, hashlib.sha1(np.asarray(out).tobytes()).hexdigest())
    from threadpoolctl import threadpool_info
    blas = [i for i in threadpool_info() if i.get("internal_api") == "openblas"]
    print("architecture", blas[0].get("architecture") if blas else None)
""")


def _hashes(tmp_path, coretype):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = dict(os.environ, OPENBLAS_CORETYPE=coretype)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    return dict(line.split() for line in done.stdout.splitlines())


@pytest.mark.timeout(600)
def test_deterministic_dot_gives_the_same_bits_under_every_blas_kernel(tmp_path):
    haswell, sandybridge = _hashes(tmp_path, "Haswell"), _hashes(tmp_path, "SandyBridge")
    assert haswell["True"] == sandybridge["True"]
    # Without it the two kernels' bits differ (what the option is for) on this matmul,
    # where OPENBLAS_CORETYPE did select two kernel families (an x86-64 OpenBLAS; on
    # arm64, or another BLAS, both runs use the same kernel and nothing is compared).
    if haswell["architecture"] != sandybridge["architecture"]:
        assert haswell["False"] != sandybridge["False"]


def _sequential_dot(a, b):
    """The oracle: for each output, a running float32 sum over k of float32 products,
    one scalar at a time."""
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n), np.float32)
    for i in range(m):
        for j in range(n):
            acc = np.float32(0)
            for t in range(k):
                acc = np.float32(acc + np.float32(a[i, t] * b[t, j]))
            out[i, j] = acc
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_deterministic_dot_is_the_in_order_float32_sum(dtype):
    def dot_kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((8, 24)) * 1e3, dtype)
    y = jnp.asarray(rng.standard_normal((24, 128)), dtype)
    out = pl.pallas_call(dot_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                         interpret=InterpretParams(deterministic_dot=True))(x, y)
    expected = _sequential_dot(np.asarray(x, np.float32), np.asarray(y, np.float32))
    np.testing.assert_array_equal(np.asarray(out).view(np.uint32), expected.view(np.uint32))


@pytest.mark.timeout(120)
def test_deterministic_dot_handles_batch_dimensions_and_integer_dots():
    def kernel(x_ref, y_ref, i_ref, o_ref, oi_ref):
        o_ref[...] = jnp.einsum("bmk,bkn->bmn", x_ref[...], y_ref[...],
                                preferred_element_type=jnp.float32)
        oi_ref[...] = jnp.einsum("bmk,bkn->bmn", i_ref[...], i_ref[...],
                                 preferred_element_type=jnp.int32)  # int8 x int8 -> int32

    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((2, 8, 16)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((2, 16, 128)), jnp.float32)
    # int8 operands: the MXU has no int32 x int32 (the TPU compiler rejects it)
    i = jnp.asarray(rng.integers(-5, 5, (2, 16, 16)), jnp.int8)
    out, outi = pl.pallas_call(
        kernel, out_shape=(jax.ShapeDtypeStruct((2, 8, 128), jnp.float32),
                           jax.ShapeDtypeStruct((2, 16, 16), jnp.int32)),
        interpret=InterpretParams(deterministic_dot=True))(x, y, i)
    for b in range(2):
        expected = _sequential_dot(np.asarray(x[b]), np.asarray(y[b]))
        np.testing.assert_array_equal(np.asarray(out[b]), expected)
    i32 = np.asarray(i, np.int32)
    np.testing.assert_array_equal(np.asarray(outi), np.einsum("bmk,bkn->bmn", i32, i32))


def test_deterministic_dot_must_be_a_bool():
    from palladium.interpret import ConfigError

    with pytest.raises(ConfigError, match=r"^InterpretParams.deterministic_dot must be True or "
                                          r"False, got 1\.$"):
        InterpretParams(deterministic_dot=1)
