"""A known call skips its TPU lowering (``call_key``): the key is the same for the same
call traced again and differs with anything the lowering depends on; a kernel Mosaic (or
the compiler) rejects is rejected again every time, with the same message."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from palladium.interpret import InterpretParams, TpuLoweringError
from palladium.interpret import _jax_compat as jc
from palladium.interpret.fidelity import call_key, lowering_check
from palladium.interpret.hook import jax_hook

X = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128) / 128


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PALLADIUM_CACHE_DIR", str(tmp_path / "cache"))
    lowering_check.MOSAIC_LOWERED.clear()
    yield tmp_path / "cache"
    lowering_check.MOSAIC_LOWERED.clear()


def _call(op, block=(8, 128), dtype=jnp.float32, **params):
    def kernel(x_ref, o_ref):
        o_ref[...] = op(x_ref[...])

    spec = pl.BlockSpec(block, lambda i: (i, 0))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(X.shape, dtype),
                          grid=(X.shape[0] // block[0],), in_specs=[spec], out_specs=spec,
                          interpret=InterpretParams(**params))


def _keys(call):
    """The call_key of every pallas_call ``call`` lowers (the key of its parameters)."""
    keys = []
    real = jax_hook.PreparedKernel.from_params

    def spy(**params):
        params.pop("call_site", None)
        keys.append(call_key.call_key(params, [], "test"))
        return real(**params)

    jax_hook.PreparedKernel.from_params = spy
    try:
        jax.clear_caches()
        jax.block_until_ready(jax.jit(call)(X))
    finally:
        jax_hook.PreparedKernel.from_params = real
    return keys


def test_the_same_call_traced_again_has_the_same_key():
    first = _keys(_call(lambda v: v * 2))
    assert len(first) == 1 and first[0] is not None
    assert _keys(_call(lambda v: v * 2)) == first


@pytest.mark.parametrize("other", [
    _call(lambda v: v * 3),                        # a literal
    _call(lambda v: v * 2 + 1),                    # an equation
    _call(lambda v: v * 2, block=(16, 128)),       # the blocks and the grid
    _call(lambda v: (v * 2).astype(jnp.bfloat16), dtype=jnp.bfloat16),  # a type
])
def test_the_key_changes_with_what_is_lowered(other):
    assert _keys(other) != _keys(_call(lambda v: v * 2))


def test_a_value_without_a_faithful_text_gives_no_key():
    class Opaque:
        pass

    assert call_key.call_key({"x": Opaque()}, []) is None
    assert call_key.call_key({"x": np.zeros(10)}, []) != call_key.call_key(
        {"x": np.ones(10)}, [])
    assert call_key.call_key({"x": 1}, [], "v5e") != call_key.call_key({"x": 1}, [], "v6e")


def _lowerings(monkeypatch):
    count = []
    real = jc.mosaic_lower

    def counted(*args, **kwargs):
        count.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(jc, "mosaic_lower", counted)
    return count


def test_a_kernel_mosaic_lowered_is_not_lowered_again(monkeypatch, fresh_cache):
    count = _lowerings(monkeypatch)
    call = _call(lambda v: v * 2, chip="v5e", compile_check="approximate")
    for _ in range(2):
        jax.clear_caches()
        np.testing.assert_array_equal(jax.jit(call)(X), np.asarray(X) * 2)
    assert len(count) == 1
    lowering_check.MOSAIC_LOWERED.clear()  # a new process: found on disk
    jax.clear_caches()
    jax.jit(call)(X)
    assert len(count) == 1
    assert len(list((fresh_cache / "mosaic-lowered").iterdir())) == 1


def test_a_kernel_mosaic_rejects_is_rejected_every_time(monkeypatch, fresh_cache):
    count = _lowerings(monkeypatch)
    call = _call(lambda v: jnp.cumsum(v, axis=0), chip="v5e", compile_check="approximate")
    messages = []
    for _ in range(2):
        jax.clear_caches()
        with pytest.raises(TpuLoweringError) as info:
            jax.jit(call)(X)
        messages.append(str(info.value))
    assert len(count) == 2 and messages[0] == messages[1]
    assert "cumsum" in messages[0]
    assert not (fresh_cache / "mosaic-lowered").exists()


def test_the_key_holds_jax_configuration():
    key = functools.partial(call_key.call_key, {"x": 1}, [])
    with jax.enable_x64(True):
        on = key(sorted(jax.config.values.items()))
    assert on != key(sorted(jax.config.values.items()))
