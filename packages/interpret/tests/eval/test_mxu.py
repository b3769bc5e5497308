"""The explicit MXU operations (pltpu.matmul_push_rhs / matmul_acc_lhs / matmul_pop) on a
simulated v7x: staging registers, weights and accumulators per MXU and core, results
against numpy, the timeline's MXU flops, and what the TPU compiler rejects (measured:
tests/compiler/test_mxu.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi
from palladium.interpret import KernelError, TpuLoweringError

RNG = np.random.default_rng(1234)


def _normal(shape, dtype):
    return jnp.asarray(RNG.normal(size=shape).astype(np.float32)).astype(dtype)


def _call(kernel, out_shapes, chip="v7x"):
    return pl.pallas_call(kernel, out_shape=out_shapes,
                          interpret=pi.InterpretParams(chip=chip, compile_check="approximate"))


def _f32(a):
    return np.asarray(a).astype(np.float32)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype,transpose", [(jnp.bfloat16, False), (jnp.float32, False),
                                             (jnp.bfloat16, True), (jnp.float8_e4m3fn, False)])
def test_push_acc_pop_is_a_matmul(dtype, transpose):
    m = 128 + 64
    x = _normal((m, 256), dtype)
    y = _normal((256, 256), dtype)

    def kernel(x_ref, y_ref, o_ref):
        pltpu.matmul_push_rhs(y_ref[...], mxu_index=0, staging_register=0, transpose=transpose)
        pltpu.matmul_acc_lhs(acc_addr=0, lhs=x_ref[...], mxu_index=0, load_staged_rhs=0)
        o_ref[...] = pltpu.matmul_pop(acc_addr=0, shape=(m, 256), dtype=jnp.float32,
                                      mxu_index=0)

    with pi.timeline() as tl:
        out = _call(kernel, jax.ShapeDtypeStruct((m, 256), jnp.float32))(x, y)
        out.block_until_ready()
    rhs = _f32(y).T if transpose else _f32(y)
    np.testing.assert_allclose(np.asarray(out), _f32(x) @ rhs, rtol=1e-5, atol=1e-4)
    assert tl.launches[-1].flops == 2 * m * 256 * 256
    assert tl.launches[-1].by_unit["mxu"] > 0


@pytest.mark.timeout(120)
def test_two_mxus_and_accumulation_with_reused_weights():
    x0, x1 = _normal((256, 256), jnp.bfloat16), _normal((256, 256), jnp.bfloat16)
    y0, y1 = _normal((256, 256), jnp.bfloat16), _normal((256, 256), jnp.bfloat16)

    def kernel(x0_ref, x1_ref, y0_ref, y1_ref, o0_ref, o1_ref):
        pltpu.matmul_push_rhs(y0_ref[...], mxu_index=0, staging_register=0)
        pltpu.matmul_push_rhs(y1_ref[...], mxu_index=1, staging_register=1)
        pltpu.matmul_acc_lhs(acc_addr=0, lhs=x0_ref[...], mxu_index=0, load_staged_rhs=0)
        # The same weights again (no load): the product adds into the accumulator.
        pltpu.matmul_acc_lhs(acc_addr=0, lhs=x1_ref[...], mxu_index=0)
        pltpu.matmul_acc_lhs(acc_addr=128, lhs=x0_ref[...], mxu_index=1, load_staged_rhs=1)
        o0_ref[...] = pltpu.matmul_pop(acc_addr=0, shape=(256, 256), dtype=jnp.float32,
                                       mxu_index=0)
        o1_ref[...] = pltpu.matmul_pop(acc_addr=128, shape=(256, 256), dtype=jnp.float32,
                                       mxu_index=1)

    shape = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    out0, out1 = _call(kernel, (shape, shape))(x0, x1, y0, y1)
    np.testing.assert_allclose(np.asarray(out0), (_f32(x0) + _f32(x1)) @ _f32(y0),
                               rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(np.asarray(out1), _f32(x0) @ _f32(y1), rtol=1e-5, atol=1e-4)


@pytest.mark.timeout(120)
def test_pop_zeroes_the_accumulator_so_a_grid_accumulates_per_step():
    # Two grid steps, each a full push/acc/pop on the same accumulator: the second pop
    # holds only the second step's product.
    x = _normal((2, 16, 256), jnp.bfloat16)
    y = _normal((256, 256), jnp.bfloat16)

    def kernel(x_ref, y_ref, o_ref):
        pltpu.matmul_push_rhs(y_ref[...], mxu_index=0, staging_register=0)
        pltpu.matmul_acc_lhs(acc_addr=2, lhs=x_ref[0], mxu_index=0, load_staged_rhs=0)
        o_ref[0] = pltpu.matmul_pop(acc_addr=2, shape=(16, 256), dtype=jnp.float32,
                                    mxu_index=0)

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((2, 16, 256), jnp.float32), grid=(2,),
        in_specs=[pl.BlockSpec((1, 16, 256), lambda i: (i, 0, 0)),
                  pl.BlockSpec((256, 256), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((1, 16, 256), lambda i: (i, 0, 0)),
        interpret=pi.InterpretParams(chip="v7x", compile_check="approximate"))
    out = call(x, y)
    np.testing.assert_allclose(np.asarray(out), _f32(x) @ _f32(y), rtol=1e-5, atol=1e-4)


def _one(push=None, acc=None, pop=None, x_shape=(16, 256), pushes=1):
    push = {"mxu_index": 0, "staging_register": 0, **(push or {})}
    acc = {"acc_addr": 0, "mxu_index": 0, "load_staged_rhs": 0, **(acc or {})}

    def kernel(x_ref, y_ref, o_ref):
        for _ in range(pushes):
            pltpu.matmul_push_rhs(y_ref[...], **push)
        if acc is not False:
            pltpu.matmul_acc_lhs(lhs=x_ref[...], **acc)
        pop_args = {"acc_addr": acc.get("acc_addr", 0), "mxu_index": 0,
                    **(pop or {})} if acc is not False else {"acc_addr": 0, "mxu_index": 0}
        o_ref[...] = pltpu.matmul_pop(shape=(16, 256), dtype=jnp.float32, **pop_args)

    return kernel


ERRORS = {
    "push_twice": (dict(pushes=2), TpuLoweringError,
                   "staging register 0 of MXU 0 already holds an RHS"),
    "register_2": (dict(push={"staging_register": 2}, acc={"load_staged_rhs": 2}),
                   TpuLoweringError, "invalid staging register: 2"),
    "mxu_2": (dict(push={"mxu_index": 2}), TpuLoweringError, "a TPU v7x core has 2 MXUs"),
    "out_of_accumulators": (dict(acc={"acc_addr": 254}), TpuLoweringError,
                            "OOB accumulator access"),
    "odd_address": (dict(acc={"acc_addr": 1}), TpuLoweringError,
                    "acc_addr=1 is not an even accumulator address"),
    "bf16_rows": (dict(x_shape=(8, 256)), TpuLoweringError,
                  "must be a multiple of 16 for bfloat16, got 8"),
    "empty_register": (dict(acc={"load_staged_rhs": 1}), KernelError,
                       "staging register 1 holds no RHS"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(ERRORS))
def test_what_a_tpu_rejects_is_an_error_naming_the_line(case):
    kwargs, error, says = ERRORS[case]
    kwargs = dict(kwargs)
    x = _normal(kwargs.pop("x_shape", (16, 256)), jnp.bfloat16)
    y = _normal((256, 256), jnp.bfloat16)
    call = _call(_one(**kwargs), jax.ShapeDtypeStruct((16, 256), jnp.float32))
    with pytest.raises(error) as info, pi.errors_as_raised():
        call(x, y).block_until_ready()
    assert says in str(info.value)
    assert "test_mxu.py:" in str(info.value)


@pytest.mark.timeout(120)
def test_a_kernel_must_not_leave_a_staged_rhs():
    def kernel(x_ref, y_ref, o_ref):
        pltpu.matmul_push_rhs(y_ref[...], mxu_index=1, staging_register=0)
        o_ref[...] = x_ref[...].astype(jnp.float32)

    x, y = _normal((16, 256), jnp.bfloat16), _normal((256, 256), jnp.bfloat16)
    with pytest.raises(KernelError) as info, pi.errors_as_raised():
        _call(kernel, jax.ShapeDtypeStruct((16, 256), jnp.float32))(x, y).block_until_ready()
    assert str(info.value).startswith(
        "the kernel left an RHS staged in register 0 of MXU 1 at its end (kernel 'kernel'")


@pytest.mark.timeout(120)
def test_the_explicit_mxu_operations_are_rejected_before_v7():
    x, y = _normal((16, 256), jnp.bfloat16), _normal((256, 256), jnp.bfloat16)
    call = _call(_one(), jax.ShapeDtypeStruct((16, 256), jnp.float32), chip="v6e")
    with pytest.raises(TpuLoweringError) as info, pi.errors_as_raised():
        call(x, y).block_until_ready()
    assert ("the TPU compiler rejects the explicit MXU operations on TPU v6e (\"Explicit MXU "
            "ops not supported on TPU generations < 7\")") in str(info.value)
