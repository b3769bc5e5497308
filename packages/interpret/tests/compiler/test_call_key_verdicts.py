"""An accepted verdict is found again by the call's key (``call_key``) without lowering
the kernel for the TPU; a rejected kernel is compiled (or read by its module's key) and
reported as before, every time."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

import palladium.interpret as pi
from palladium.interpret.fidelity import tpu_compiler

pytestmark = pytest.mark.skipif(tpu_compiler.compiler_version() is None,
                                reason="needs libtpu (palladium-interpret[compiler])")


def _double(dtype):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), dtype),
                          interpret=pi.InterpretParams(compile_check="compiler"))


def _lowered(monkeypatch):
    """The kernels lowered for the TPU (the module key's path), as verdict sources."""
    seen = []
    real = tpu_compiler._compile_verdict

    def spy(*args, **kwargs):
        verdict = real(*args, **kwargs)
        seen.append(verdict.source)
        return verdict

    monkeypatch.setattr(tpu_compiler, "_compile_verdict", spy)
    return seen


@pytest.mark.timeout(300)
def test_an_accepted_call_is_not_lowered_for_the_tpu_again(monkeypatch, fresh_verdict_cache):
    seen = _lowered(monkeypatch)
    x = jnp.ones((8, 128), jnp.float32)
    for _ in range(2):
        jax.clear_caches()
        np.testing.assert_array_equal(_double(jnp.float32)(x), np.full((8, 128), 2.0))
    assert seen == ["compiled"]
    tpu_compiler.clear_memory_cache()  # as in a new process: found on disk
    jax.clear_caches()
    _double(jnp.float32)(x)
    assert seen == ["compiled"]
    assert len(list((fresh_verdict_cache / "tpu-compiler-calls").glob("*.entry"))) == 1


@pytest.mark.timeout(300)
def test_a_rejected_call_is_lowered_and_reported_every_time(monkeypatch, fresh_verdict_cache):
    seen = _lowered(monkeypatch)
    messages = []
    for _ in range(2):
        jax.clear_caches()
        with pytest.raises(pi.TpuLoweringError) as info:
            _double(jnp.int8)(jnp.ones((8, 128), jnp.int8))
        messages.append(str(info.value))
    assert seen == ["compiled", "memory"]
    assert messages[0] == messages[1] and "got 'i8'" in messages[0]
    assert not (fresh_verdict_cache / "tpu-compiler-calls").exists()
