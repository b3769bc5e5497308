"""The TPU lowering check: a kernel jax's Mosaic lowering rejects raises
``TpuLoweringError`` before it runs; its near twin that Mosaic accepts runs as before."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import (
    ConfigError,
    InterpretParams,
    KernelError,
    TpuLoweringError,
    TpuLoweringWarning,
    TpuResourceError,
)

CHIPS = ["v4", "v5e", "v6e"]
X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128) / 128


def _elementwise(op, chip, **params):
    def kernel(x_ref, o_ref):
        o_ref[...] = op(x_ref[...])

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
                          interpret=InterpretParams(chip=chip, **params))


@pytest.mark.parametrize("chip", CHIPS)
def test_a_primitive_mosaic_cannot_lower_is_an_error_at_its_line(chip):
    call = _elementwise(lambda v: jnp.cumsum(v, axis=0), chip)
    with pytest.raises(TpuLoweringError) as info:
        jax.jit(call)(X)
    msg = str(info.value)
    assert isinstance(info.value, KernelError)
    assert msg.startswith("kernel 'kernel' (pallas_call at test_lowering_check.py:")
    assert f"does not lower for TPU {chip} at test_lowering_check.py:" in msg
    assert re.search(r"test_lowering_check\.py:\d+ \(cumsum\)", msg)
    # Mosaic's own message, whole.
    assert ("NotImplementedError: Unimplemented primitive in Pallas TPU lowering for tc: "
            "cumsum. Please file an issue at") in msg
    assert "check_lowering=False" in msg


@pytest.mark.parametrize("chip", CHIPS)
def test_its_twin_with_a_supported_op_runs(chip):
    out = jax.jit(_elementwise(lambda v: jnp.sum(v, axis=0, keepdims=True) + v, chip))(X)
    np.testing.assert_allclose(out, np.asarray(X).sum(0, keepdims=True) + np.asarray(X),
                               rtol=1e-6)


def test_check_lowering_false_runs_what_mosaic_rejects():
    out = _elementwise(lambda v: jnp.cumsum(v, axis=0), "v5e", check_lowering=False)(X)
    np.testing.assert_allclose(out, np.cumsum(np.asarray(X), axis=0), rtol=1e-6)


def _blocked(block, shape, chip):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    grid = tuple(n // b for n, b in zip(shape, block))
    spec = pl.BlockSpec(block, lambda i, j: (i, j))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(shape, jnp.float32),
                          grid=grid, in_specs=[spec], out_specs=spec,
                          interpret=InterpretParams(chip=chip))


@pytest.mark.parametrize("chip", CHIPS)
def test_a_block_shape_mosaic_rejects_is_an_error_naming_the_operand(chip):
    x = jnp.ones((6, 200), jnp.float32)
    with pytest.raises(TpuLoweringError) as info:
        _blocked((3, 100), (6, 200), chip)(x)
    msg = str(info.value)
    assert f"does not lower for TPU {chip}, operand 'x_ref': jax's Mosaic lowering says:" in msg
    assert ("ValueError: The Pallas TPU lowering currently requires that the last two "
            "dimensions of your block shape are divisible by 8 and 128") in msg
    assert "block shape (Blocked(block_size=3), Blocked(block_size=100))" in msg
    # Mosaic's exception is kept, not printed as the cause (~25 frames of jax's lowering)
    assert not isinstance(info.value.__cause__, ValueError)
    assert isinstance(info.value.mosaic_error, ValueError)
    assert str(info.value.mosaic_error).startswith("The Pallas TPU lowering currently")


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("block,shape", [((6, 200), (6, 200)), ((8, 128), (16, 256))],
                         ids=["full-dimension", "aligned"])
def test_full_dimension_or_aligned_blocks_run(chip, block, shape):
    x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
    np.testing.assert_array_equal(_blocked(block, shape, chip)(x), np.asarray(x) * 2)


def test_a_failure_that_is_not_the_kernels_is_a_warning():
    # jax 0.10.2 cannot lower vmap of a kernel with a pl.ANY operand (the batched HBM
    # operand gets a non-trivial window); the kernel itself is fine.
    def kernel(x_hbm, o_ref):
        o_ref[...] = jnp.ones_like(o_ref)

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          interpret=InterpretParams())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = jax.vmap(call)(jnp.zeros((3, 8, 128), jnp.float32))
    np.testing.assert_array_equal(out, 1.0)
    [warning] = [w for w in caught if issubclass(w.category, TpuLoweringWarning)]
    text = str(warning.message)
    assert "kernel 'kernel'" in text and "could not decide" in text
    assert "vmapped kernel with pl.ANY" in text
    assert "supports in memory space ANY only blocks" in text  # Mosaic's message


def test_scratch_and_scalar_prefetch_kernels_lower():
    # A supported kernel with SMEM scalar prefetch, VMEM scratch and a DMA passes.
    def kernel(s_ref, x_hbm, o_ref, buf, sem):
        pltpu.async_copy(x_hbm, buf, sem).wait()
        o_ref[...] = buf[...] + s_ref[0].astype(jnp.float32)

    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i, s: (0, 0)),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA]),
        interpret=InterpretParams(chip="v6e"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TpuLoweringWarning)
        out = call(jnp.array([3], jnp.int32), X)
    np.testing.assert_allclose(out, np.asarray(X) + 3)


@pytest.mark.parametrize("buffers", [3, 2])
def test_more_than_two_blockspec_buffers_are_a_jax_0_10_limit_warning(buffers):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0), pipeline_mode=pl.Buffered(buffers))
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
                          grid=(2,), in_specs=[spec],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                          interpret=InterpretParams())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = call(jnp.zeros((16, 128), jnp.float32))
    np.testing.assert_array_equal(out, 1.0)
    texts = [str(w.message) for w in caught if issubclass(w.category, TpuLoweringWarning)]
    if buffers == 2:
        assert texts == []
    else:
        [text] = texts
        assert "buffers a BlockSpec operand at most twice" in text
        assert "Only single (1) and double (2) buffering are supported. Got 3." in text


# -- the approximation's Mosaic rules that ask for "the current TPU" -----------------------
@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32])
def test_sign_is_not_rejected_and_matches_numpy(chip, dtype):
    # Mosaic's rule for sign asks tpu_info for the current TPU's generation; on a CPU that
    # was the CPU ("Unsupported TPU device kind: cpu"), a false reject of jnp.sign.
    def sign(x_ref, o_ref):
        o_ref[...] = jnp.sign(x_ref[...])

    x = (X * 4 - 12).astype(dtype)
    out = pl.pallas_call(sign, out_shape=jax.ShapeDtypeStruct(x.shape, dtype),
                         interpret=InterpretParams(chip=chip, compile_check="approximate"))(x)
    np.testing.assert_array_equal(np.asarray(out, np.float32),
                                  np.sign(np.asarray(x, np.float32)))


@pytest.mark.parametrize("chip", CHIPS)
def test_integer_floor_division_is_not_rejected(chip):
    def floordiv(x_ref, o_ref):
        o_ref[...] = x_ref[...] // 3

    x = jnp.arange(-512, 512, dtype=jnp.int32).reshape(8, 128)
    out = pl.pallas_call(floordiv, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                         interpret=InterpretParams(chip=chip))(x)
    np.testing.assert_array_equal(out, np.asarray(x) // 3)


def test_compile_check_off_runs_what_mosaic_rejects():
    out = _elementwise(lambda v: jnp.cumsum(v, axis=0), "v5e", compile_check="off")(X)
    np.testing.assert_allclose(out, np.cumsum(np.asarray(X), axis=0), rtol=1e-6)


def test_compile_check_must_be_a_known_choice():
    with pytest.raises(ConfigError) as info:
        InterpretParams(compile_check="libtpu")
    assert str(info.value) == (
        "InterpretParams.compile_check must be one of ('auto', 'compiler', 'approximate', "
        "'off'), got 'libtpu'.")


def test_requiring_the_compiler_without_libtpu_says_how_to_install_it(monkeypatch):
    from palladium.interpret.fidelity import tpu_compiler

    monkeypatch.setattr(tpu_compiler, "compiler_version", lambda: None)
    call = _elementwise(lambda v: v + 1, "v5e", compile_check="compiler")
    with pytest.raises(ConfigError) as info:
        call(X)
    assert str(info.value) == (
        "InterpretParams(compile_check='compiler') needs the TPU compiler (libtpu), which is "
        "not installed: pip install 'palladium-interpret[compiler]' installs the libtpu "
        "matching your jax. compile_check='auto' falls back to palladium's approximate "
        "checks without it.")


def test_auto_without_libtpu_is_the_approximation(monkeypatch):
    from palladium.interpret import timeline
    from palladium.interpret.fidelity import tpu_compiler

    monkeypatch.setattr(tpu_compiler, "compiler_version", lambda: None)
    with timeline() as tl:
        out = _elementwise(lambda v: v + 1, "v5e")(X)
    np.testing.assert_array_equal(out, np.asarray(X) + 1)
    assert tl.launches[-1].info.memory.checker == "approximation"
    with pytest.raises(TpuLoweringError, match="jax's Mosaic lowering says"):
        _elementwise(lambda v: jnp.cumsum(v, axis=0), "v5e")(X)


def test_a_tpu8i_abstract_mesh_simulates_a_tpu8i():
    from jax.sharding import AbstractMesh

    import palladium.interpret as pi
    from palladium.interpret import _jax_compat as jc

    device = jc.abstract_device(device_kind="TPU8i", num_cores=1)
    mesh = AbstractMesh((), (), axis_types=(), abstract_device=device)
    call = _elementwise(lambda v: v + 1, None)
    with jax.sharding.use_abstract_mesh(mesh):
        lowered = jax.jit(call).trace(X).lower()
    with pi.timeline() as tl:
        out = lowered.compile()(X)
    np.testing.assert_array_equal(out, np.asarray(X) + 1)
    info = tl.launches[-1].info
    assert info.memory.chip == "v8i" and info.memory.checker == "approximation"
    assert info.memory.vmem.capacity_bytes == 192 * 2**20


def test_a_tpu_palladium_does_not_know_is_an_error_not_a_silent_v5e():
    from jax.sharding import AbstractMesh

    from palladium.interpret import _jax_compat as jc

    device = jc.abstract_device(device_kind="TPU v99", num_cores=1)
    mesh = AbstractMesh((), (), axis_types=(), abstract_device=device)
    call = _elementwise(lambda v: v + 1, None)
    with jax.sharding.use_abstract_mesh(mesh), pytest.raises(ConfigError) as info:
        jax.jit(call).trace(X).lower()
    assert str(info.value) == (
        "the abstract mesh's device is a 'TPU v99', a TPU palladium does not simulate; it "
        "knows ('v2', 'v3', 'v4', 'v4i', 'v5e', 'v5p', 'v6e', 'v7', 'v7x', 'v8i') "
        "(InterpretParams(chip=...) chooses one).")


def test_the_approximations_verdicts_say_who_spoke():
    with pytest.raises(TpuLoweringError) as info:
        _elementwise(lambda v: jnp.cumsum(v, axis=0), "v5e", compile_check="approximate")(X)
    assert str(info.value).endswith(
        "(Checked by palladium's approximation; where libtpu is installed, the TPU compiler "
        "itself decides: pip install 'palladium-interpret[compiler]'.)")

    def big(x_ref, o_ref, s):
        s[...] = jnp.zeros_like(s)
        o_ref[...] = x_ref[...]

    call = pl.pallas_call(big, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
                          scratch_shapes=[pltpu.VMEM((8 * 4096, 128), jnp.float32)],
                          interpret=InterpretParams(compile_check="approximate"))
    with pytest.raises(TpuResourceError) as info:
        call(X)
    text, doubt = str(info.value).rsplit("\n", 1)
    assert text.endswith("itself decides: pip install 'palladium-interpret[compiler]'.)")
    # 16.01 of 16 MiB: near the limit, where only the compiler knows
    assert doubt == ("This verdict is uncertain: palladium's approximation counts 16.01 MiB "
                     "of 16.00 MiB VMEM, within 10% of the limit, where the TPU compiler's "
                     "internal scratch (which the count cannot size) decides; pip install "
                     "'palladium-interpret[compiler]' for the TPU compiler's verdict.")
