"""The approximation agrees with the TPU compiler on a slice of
``benchmarks/compiler_agreement.py``'s corpus: for each listed (kernel, chip) pair the
compiler's verdict is the one measured, and the approximation's is the same (so never a
false reject). Each rule of ``fidelity/approx_rules.py`` and of the VMEM/SMEM count has a
rejected kernel here and an accepted twin.

A pair runs the kernel with ``InterpretParams(chip=..., compile_check=...)``: a
``TpuLoweringError``/``TpuResourceError``/``TpuCompilerError`` is "reject", a clean run
"accept".
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import (
    InterpretParams,
    TpuCompilerError,
    TpuLoweringError,
    TpuLoweringWarning,
    TpuResourceError,
)

MiB, KiB = 2**20, 2**10
F32, BF16, F16, I32, I16, I8 = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32, jnp.int16,
                                jnp.int8)
E4M3 = jnp.float8_e4m3fn


def _array(shape, dtype, seed=0):
    values = np.random.default_rng(seed).integers(-4, 5, shape)
    return jnp.asarray(values, jnp.float32).astype(dtype)


def _elementwise(fn, dtype, out_dtype=None, shape=(32, 128)):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = fn(x_ref[...], y_ref[...]).astype(o_ref.dtype)

    def make(params):
        call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(shape, out_dtype or dtype),
                              interpret=params)
        return call, (_array(shape, dtype, 0), _array(shape, dtype, 1))

    return make


def _reshape(src, dst):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...].reshape(dst)

    return lambda params: (pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(dst, F32),
                                          interpret=params), (_array(src, F32),))


def _sliced(index, src, out_shape, dtype):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[index(pl.program_id(0))]

    def make(params):
        call = pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(out_shape, dtype), grid=(2,),
            in_specs=[pl.BlockSpec(src, lambda i: (0, 0))],
            out_specs=pl.BlockSpec(out_shape, lambda i: (0, 0)),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
            interpret=params)
        return call, (_array(src, dtype),)

    return make


def _dot(lhs, rhs, acc):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=acc)

    return lambda params: (
        pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, 128), acc),
                       interpret=params),
        (_array((128, 128), lhs, 0), _array((128, 128), rhs, 1)))


def _grid(n, semantics):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return lambda params: (
        pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8 * n, 128), F32), grid=(n,),
                       in_specs=[spec], out_specs=spec,
                       compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
                       interpret=params),
        (_array((8 * n, 128), F32),))


def _scalar_add(dtype):
    def kernel(x_ref, o_ref):
        o_ref[0] = x_ref[0] + x_ref[1]

    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    return lambda params: (
        pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), dtype), in_specs=[smem],
                       out_specs=smem, interpret=params), (_array((2,), dtype),))


def _live_scratch(scratch, *, vmem_limit=None, fill=None, read=None):
    """8 rows of ``scratch`` written and read back at indices the compiler cannot know
    (scalar prefetch): it removes scratch it can prove dead."""

    def kernel(idx_ref, x_ref, o_ref, s_ref):
        rows = pl.ds(pl.multiple_of(idx_ref[0] * 8, 8), 8)
        if fill is None:
            s_ref[rows, :] = x_ref[...]
            o_ref[...] = s_ref[pl.ds(pl.multiple_of(idx_ref[1] * 8, 8), 8), :]
        else:
            s_ref[rows, :] = x_ref[...] > 0
            o_ref[...] = jnp.where(s_ref[pl.ds(pl.multiple_of(idx_ref[1] * 8, 8), 8), :],
                                   1.0, 0.0)

    def make(params):
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,),
            in_specs=[pl.BlockSpec((8, 128), lambda i, idx: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, idx: (0, 0)), scratch_shapes=[scratch])
        compiler_params = (None if vmem_limit is None
                           else pltpu.CompilerParams(vmem_limit_bytes=vmem_limit))
        call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                              grid_spec=grid_spec, compiler_params=compiler_params,
                              interpret=params)
        return call, (jnp.array([0, 0], jnp.int32), _array((8, 128), F32))

    return make


def _smem_scratch(shape):
    def kernel(idx_ref, x_ref, o_ref, s_ref):
        s_ref[(idx_ref[0],) + (0,) * (len(shape) - 1)] = x_ref[0]
        o_ref[0] = s_ref[(idx_ref[1],) + (0,) * (len(shape) - 1)]

    def make(params):
        smem = pl.BlockSpec(memory_space=pltpu.SMEM)
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,), in_specs=[smem], out_specs=smem,
            scratch_shapes=[pltpu.SMEM(shape, I32)])
        call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), I32),
                              grid_spec=grid_spec, interpret=params)
        return call, (jnp.array([0, 0], jnp.int32), jnp.array([7], jnp.int32))

    return make


def _eq_to_i32(a, b):
    return jnp.where(a == b, 1, 0)


def _rows(start, size):
    return lambda i: (pl.ds(start(i), size), slice(None))


KERNELS = {
    "add i8": _elementwise(jnp.add, I8),
    "add i32": _elementwise(jnp.add, I32),
    "max e4m3": _elementwise(jnp.maximum, E4M3),
    "max f32": _elementwise(jnp.maximum, F32),
    "copy f16": _elementwise(lambda a, b: a, F16),
    "copy bf16": _elementwise(lambda a, b: a, BF16),
    "max i16": _elementwise(jnp.maximum, I16),
    "add i16": _elementwise(jnp.add, I16),
    "eq->i32 bf16": _elementwise(_eq_to_i32, BF16, I32),
    "reshape (8, 128)->(16, 64)": _reshape((8, 128), (16, 64)),
    "reshape (16, 128)->(8, 256)": _reshape((16, 128), (8, 256)),
    "reshape (8, 128)->(8, 2, 64)": _reshape((8, 128), (8, 2, 64)),
    "strided rows bf16": _sliced(lambda i: (pl.ds(0, 16, stride=2), slice(None)), (32, 128),
                                 (16, 128), BF16),
    "strided rows f32 of (32, 128)": _sliced(
        lambda i: (pl.ds(0, 16, stride=2), slice(None)), (32, 128), (16, 128), F32),
    "rows i*3 f32": _sliced(_rows(lambda i: i * 3, 8), (32, 256), (8, 256), F32),
    "rows multiple_of(i*8) f32": _sliced(_rows(lambda i: pl.multiple_of(i * 8, 8), 8),
                                         (32, 256), (8, 256), F32),
    "rows i*8 i8": _sliced(_rows(lambda i: i * 8, 8), (32, 256), (8, 256), I8),
    "dot f32 x f32 -> i32": _dot(F32, F32, I32),
    "dot i8 x i8 -> f32": _dot(I8, I8, F32),
    "dot i8 x i8 -> i32": _dot(I8, I8, I32),
    "grid (2,) core_parallel": _grid(2, ("core_parallel",)),
    "grid (2,) parallel": _grid(2, ("parallel",)),
    "SMEM scalar add bf16": _scalar_add(BF16),
    "SMEM scalar add f32": _scalar_add(F32),
    "SMEM scratch (2048, 2)": _smem_scratch((2048, 2)),
    "SMEM scratch (1024, 2)": _smem_scratch((1024, 2)),
    "SMEM scratch 1 MiB - 1 KiB": _smem_scratch(((MiB - KiB) // 4,)),
    "SMEM scratch 1 MiB - 4 KiB": _smem_scratch(((MiB - 4 * KiB) // 4,)),
    "bool VMEM scratch 20 MiB as words": _live_scratch(pltpu.VMEM((40960, 128), jnp.bool_),
                                                       fill=True),
    "VMEM scratch 128 MiB - 64 KiB, limit 128 MiB": _live_scratch(
        pltpu.VMEM(((128 * MiB - 64 * KiB) // 512, 128), F32), vmem_limit=128 * MiB),
}

# (kernel, chip, the compiler's verdict as measured with libtpu 0.0.42.1)
PAIRS = [
    ("add i8", "v5e", "reject"), ("add i32", "v5e", "accept"),
    ("max e4m3", "v7x", "reject"), ("max f32", "v7x", "accept"),
    ("copy f16", "v6e", "reject"), ("copy bf16", "v6e", "accept"),
    ("max i16", "v4", "reject"), ("add i16", "v4", "accept"),
    ("eq->i32 bf16", "v6e", "reject"), ("eq->i32 bf16", "v5e", "accept"),
    ("reshape (8, 128)->(16, 64)", "v5e", "reject"),
    ("reshape (16, 128)->(8, 256)", "v5e", "accept"),
    ("reshape (8, 128)->(8, 2, 64)", "v4", "reject"),
    ("reshape (8, 128)->(8, 2, 64)", "v5p", "accept"),
    ("strided rows bf16", "v5e", "reject"), ("strided rows f32 of (32, 128)", "v5e", "accept"),
    ("rows i*3 f32", "v6e", "reject"), ("rows multiple_of(i*8) f32", "v6e", "accept"),
    ("rows i*8 i8", "v5p", "reject"),
    ("dot f32 x f32 -> i32", "v5e", "reject"), ("dot f32 x f32 -> i32", "v7x", "accept"),
    ("dot i8 x i8 -> f32", "v6e", "reject"), ("dot i8 x i8 -> i32", "v6e", "accept"),
    ("dot i8 x i8 -> i32", "v4", "reject"),
    ("grid (2,) core_parallel", "v5e", "reject"), ("grid (2,) core_parallel", "v5p", "accept"),
    ("grid (2,) parallel", "v5e", "accept"),
    ("SMEM scalar add bf16", "v5e", "reject"), ("SMEM scalar add f32", "v5e", "accept"),
    ("SMEM scratch (2048, 2)", "v5e", "reject"), ("SMEM scratch (1024, 2)", "v5e", "accept"),
    ("SMEM scratch 1 MiB - 1 KiB", "v6e", "reject"),
    ("SMEM scratch 1 MiB - 4 KiB", "v6e", "accept"),
    ("bool VMEM scratch 20 MiB as words", "v5e", "reject"),
    ("bool VMEM scratch 20 MiB as words", "v6e", "accept"),
    ("VMEM scratch 128 MiB - 64 KiB, limit 128 MiB", "v6e", "reject"),
    ("VMEM scratch 128 MiB - 64 KiB, limit 128 MiB", "v5e", "accept"),
]


def _verdict(kernel, chip, check):
    params = InterpretParams(chip=chip, compile_check=check)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TpuLoweringWarning)
        try:
            call, args = KERNELS[kernel](params)
            jax.block_until_ready(call(*args))
        except (TpuLoweringError, TpuResourceError, TpuCompilerError):
            return "reject"
    return "accept"


@pytest.mark.parametrize(("kernel", "chip", "measured"), PAIRS,
                         ids=[f"{k}-{c}" for k, c, _ in PAIRS])
def test_the_approximation_agrees_with_the_compiler(kernel, chip, measured):
    compiler = _verdict(kernel, chip, "compiler")
    assert compiler == measured, f"libtpu changed its mind on {kernel!r} for {chip}"
    assert _verdict(kernel, chip, "approximate") == compiler
