"""The kernels ``compiler_agreement.py`` asks the TPU compiler and the approximation about.

Small kernels written here, each at or near one thing the TPU compiler decides per
generation: vector dtypes per VPU operation, reductions, value reshapes and transposes,
slices (static, dynamic, strided), MXU operand and accumulator dtypes, block shapes,
VMEM and SMEM sizes around each limit, bool scratch, grid dimension semantics, scalar
arithmetic in SMEM. A case is ``make(params) -> (call, args)``: the ``pallas_call`` with
``interpret=params`` and small operands to run it on. ``family`` names the cause a
disagreement on the case is counted under.

Buffers sized to test a limit are kept live with indices the compiler cannot know
(scalar-prefetch operands): it removes scratch it can prove dead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

MiB = 2**20
KiB = 2**10


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    make: Callable[[Any], tuple[Callable, tuple]]


F32, BF16, F16 = jnp.float32, jnp.bfloat16, jnp.float16
I32, I16, I8, U8, U32 = jnp.int32, jnp.int16, jnp.int8, jnp.uint8, jnp.uint32
E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2
BOOL = jnp.bool_
DTYPES = {"f32": F32, "bf16": BF16, "f16": F16, "i32": I32, "i16": I16, "i8": I8,
          "u8": U8, "u32": U32, "e4m3": E4M3, "e5m2": E5M2}
FLOATS = ("f32", "bf16", "f16", "e4m3", "e5m2")


def _array(shape, dtype, seed=0) -> jax.Array:
    rng = np.random.default_rng(seed)
    if dtype == BOOL:
        return jnp.asarray(rng.integers(0, 2, shape).astype(bool))
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.asarray(rng.uniform(-2, 2, shape).astype(np.float32)).astype(dtype)
    lo = 0 if jnp.issubdtype(dtype, jnp.unsignedinteger) else -4
    return jnp.asarray(rng.integers(lo, 5, shape).astype(np.int32)).astype(dtype)


def _call(kernel, out_shape, params, **kw):
    return pl.pallas_call(kernel, out_shape=out_shape, interpret=params, **kw)


# --- vector dtypes in VPU operations --------------------------------------------------

SHAPE = (32, 128)  # one tile of every dtype down to 8 bits

_BINARY = {
    "add": jnp.add, "mul": jnp.multiply, "max": jnp.maximum, "min": jnp.minimum,
    "select_lt": lambda a, b: jnp.where(a < b, a, b),
    "select_gt": lambda a, b: jnp.where(a > b, a, b),
    "sub": jnp.subtract,
}
_INT_ONLY = {
    "and": jnp.bitwise_and, "shr": lambda a, b: a >> 1,
}
_FLOAT_ONLY = {"div": jnp.divide}
_UNARY = {
    "copy": lambda a: a, "neg": jnp.negative, "abs": jnp.abs,
}
_FLOAT_UNARY = {"exp": jnp.exp, "tanh": jnp.tanh}


def _elementwise(dtype, op, n_in, out_dtype=None):
    def kernel(*refs):
        *ins, o_ref = refs
        o_ref[...] = op(*[r[...] for r in ins]).astype(o_ref.dtype)

    def make(params):
        args = tuple(_array(SHAPE, dtype, seed=i) for i in range(n_in))
        out = jax.ShapeDtypeStruct(SHAPE, out_dtype or dtype)
        return _call(kernel, out, params), args

    return make


def _compare_to_i32(dtype):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.where(x_ref[...] == y_ref[...], 1, 0).astype(jnp.int32)

    def make(params):
        args = (_array(SHAPE, dtype, 0), _array(SHAPE, dtype, 1))
        return _call(kernel, jax.ShapeDtypeStruct(SHAPE, I32), params), args

    return make


def _convert(src, dst):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...].astype(dst)

    def make(params):
        return _call(kernel, jax.ShapeDtypeStruct(SHAPE, dst), params), (_array(SHAPE, src),)

    return make


def _bool_ops():
    cases = []

    def where_kernel(m_ref, x_ref, o_ref):
        o_ref[...] = jnp.where(m_ref[...], x_ref[...], 0.0)

    def and_kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.logical_and(a_ref[...], b_ref[...])

    def not_kernel(a_ref, o_ref):
        o_ref[...] = jnp.logical_not(a_ref[...])

    def mask_kernel(x_ref, o_ref):
        m = x_ref[...] > 0
        o_ref[...] = jnp.where(jnp.logical_or(m, x_ref[...] < -1), x_ref[...], 0.0)

    cases.append(Case("bool where (bool operand)", "dtype", lambda p: (
        _call(where_kernel, jax.ShapeDtypeStruct(SHAPE, F32), p),
        (_array(SHAPE, BOOL), _array(SHAPE, F32)))))
    cases.append(Case("bool and (bool operands)", "dtype", lambda p: (
        _call(and_kernel, jax.ShapeDtypeStruct(SHAPE, BOOL), p),
        (_array(SHAPE, BOOL, 0), _array(SHAPE, BOOL, 1)))))
    cases.append(Case("bool not (bool operand)", "dtype", lambda p: (
        _call(not_kernel, jax.ShapeDtypeStruct(SHAPE, BOOL), p), (_array(SHAPE, BOOL),))))
    cases.append(Case("bool mask or (f32 compares)", "dtype", lambda p: (
        _call(mask_kernel, jax.ShapeDtypeStruct(SHAPE, F32), p), (_array(SHAPE, F32),))))
    return cases


def elementwise_cases() -> list[Case]:
    cases = []
    for name, dtype in DTYPES.items():
        is_float = name in FLOATS
        for op_name, op in _BINARY.items():
            cases.append(Case(f"{op_name} {name}", "dtype", _elementwise(dtype, op, 2)))
        for op_name, op in (_FLOAT_ONLY if is_float else _INT_ONLY).items():
            cases.append(Case(f"{op_name} {name}", "dtype", _elementwise(dtype, op, 2)))
        for op_name, op in _UNARY.items():
            if op_name in ("neg", "abs") and name in ("u8", "u32"):
                continue
            cases.append(Case(f"{op_name} {name}", "dtype", _elementwise(dtype, op, 1)))
        if is_float:
            for op_name, op in _FLOAT_UNARY.items():
                cases.append(Case(f"{op_name} {name}", "dtype", _elementwise(dtype, op, 1)))
        cases.append(Case(f"eq->i32 {name}", "dtype", _compare_to_i32(dtype)))
        if name != "f32":
            cases.append(Case(f"convert {name}->f32", "dtype", _convert(dtype, F32)))
            cases.append(Case(f"convert f32->{name}", "dtype", _convert(F32, dtype)))
    for src, dst in (("bf16", "i32"), ("i32", "bf16"), ("i8", "bf16"), ("bf16", "i8"),
                     ("i8", "i32"), ("i32", "i8"), ("i16", "i32"), ("bf16", "f16")):
        cases.append(Case(f"convert {src}->{dst}", "dtype", _convert(DTYPES[src], DTYPES[dst])))
    cases += _bool_ops()
    return cases


# --- reductions -----------------------------------------------------------------------

def _reduce(dtype, op, axis):
    out_shape = (1, SHAPE[1]) if axis == 0 else (SHAPE[0], 1)

    def kernel(x_ref, o_ref):
        o_ref[...] = op(x_ref[...], axis=axis, keepdims=True).astype(o_ref.dtype)

    def make(params):
        return (_call(kernel, jax.ShapeDtypeStruct(out_shape, dtype), params),
                (_array(SHAPE, dtype),))

    return make


def reduction_cases() -> list[Case]:
    cases = []
    for name in ("f32", "bf16", "f16", "i32", "i16", "i8", "u8", "e4m3", "e5m2"):
        for op_name, op in (("sum", jnp.sum), ("max", jnp.max), ("min", jnp.min)):
            for axis in (0, 1):
                cases.append(Case(f"{op_name} axis {axis} {name}", "dtype",
                                  _reduce(DTYPES[name], op, axis)))
    return cases


# --- reshapes and transposes ----------------------------------------------------------

RESHAPES = [
    ((8, 128), (16, 64)), ((16, 128), (8, 256)), ((8, 256), (16, 128)),
    ((2, 8, 128), (16, 128)), ((16, 128), (2, 8, 128)), ((8, 128), (1, 1024)),
    ((1, 1024), (8, 128)), ((8, 128), (8, 1, 128)), ((32, 128), (4, 8, 128)),
    ((32, 128), (2, 16, 128)), ((16, 256), (16, 2, 128)), ((16, 2, 128), (16, 256)),
    ((8, 128), (8, 2, 64)), ((4, 8, 128), (32, 128)), ((64, 128), (8, 8, 128)),
    ((16, 128), (32, 64)), ((8, 256), (32, 64)), ((16, 128), (16, 2, 64)),
    ((8, 256), (8, 4, 64)), ((32, 128), (64, 64)), ((8, 128), (32, 32)),
]


def _reshape(dtype, src, dst):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...].reshape(dst)

    def make(params):
        return _call(kernel, jax.ShapeDtypeStruct(dst, dtype), params), (_array(src, dtype),)

    return make


def _transpose(dtype, shape, perm):
    out = tuple(shape[p] for p in perm)

    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.transpose(x_ref[...], perm)

    def make(params):
        return _call(kernel, jax.ShapeDtypeStruct(out, dtype), params), (_array(shape, dtype),)

    return make


def _fmt(shape):
    return "(" + ", ".join(map(str, shape)) + ")"


def layout_cases() -> list[Case]:
    cases = []
    for name in ("f32", "bf16", "i8", "i32"):
        for src, dst in RESHAPES:
            cases.append(Case(f"reshape {_fmt(src)}->{_fmt(dst)} {name}", "reshape",
                              _reshape(DTYPES[name], src, dst)))
    for name in ("f32", "bf16", "i8", "i32", "f16", "i16"):
        for shape, perm in (((128, 128), (1, 0)), ((8, 128), (1, 0)), ((32, 256), (1, 0)),
                            ((2, 8, 128), (1, 0, 2)), ((4, 8, 128), (0, 2, 1))):
            cases.append(Case(f"transpose {_fmt(shape)} {perm} {name}", "transpose",
                              _transpose(DTYPES[name], shape, perm)))
    return cases


# --- slices ---------------------------------------------------------------------------

SLICE_SRC = (32, 256)


def _slice_case(dtype, index, out_shape, grid=(2,), from_value=False, src=SLICE_SRC):
    def kernel(x_ref, o_ref):
        i = pl.program_id(0)
        if from_value:
            o_ref[...] = index(x_ref[...], i)
        else:
            o_ref[...] = x_ref[index(None, i)]

    def make(params):
        spec = pl.BlockSpec(src, lambda i: (0, 0))
        ospec = pl.BlockSpec(out_shape, lambda i: (0, 0))
        return (_call(kernel, jax.ShapeDtypeStruct(out_shape, dtype), params, grid=grid,
                      in_specs=[spec], out_specs=ospec,
                      compiler_params=pltpu.CompilerParams(
                          dimension_semantics=("arbitrary",))),
                (_array(src, dtype),))

    return make


_SLICES: list[tuple[str, Callable, tuple[int, int], bool]] = [
    ("static rows 8:16", lambda v, i: (slice(8, 16), slice(None)), (8, 256), False),
    ("static rows 3:11", lambda v, i: (slice(3, 11), slice(None)), (8, 256), False),
    ("static lanes 128:256", lambda v, i: (slice(None), slice(128, 256)), (32, 128), False),
    ("static lanes 64:192", lambda v, i: (slice(None), slice(64, 192)), (32, 128), False),
    ("static lanes 1:129", lambda v, i: (slice(None), slice(1, 129)), (32, 128), False),
    ("strided rows ::2", lambda v, i: (pl.ds(0, 16, stride=2), slice(None)), (16, 256), False),
    ("strided lanes ::2", lambda v, i: (slice(None), pl.ds(0, 128, stride=2)), (32, 128),
     False),
    ("dynamic rows i*8", lambda v, i: (pl.ds(i * 8, 8), slice(None)), (8, 256), False),
    ("dynamic rows multiple_of(i*8)", lambda v, i: (pl.ds(pl.multiple_of(i * 8, 8), 8),
                                                   slice(None)), (8, 256), False),
    ("dynamic rows i*3", lambda v, i: (pl.ds(i * 3, 8), slice(None)), (8, 256), False),
    ("dynamic lanes i*128", lambda v, i: (slice(None), pl.ds(i * 128, 128)), (32, 128),
     False),
    ("dynamic lanes multiple_of(i*128)", lambda v, i: (
        slice(None), pl.ds(pl.multiple_of(i * 128, 128), 128)), (32, 128), False),
    ("dynamic lanes i*64", lambda v, i: (slice(None), pl.ds(i * 64, 128)), (32, 128), False),
    ("value rows 3:11", lambda v, i: v[3:11], (8, 256), True),
    ("value lanes 64:192", lambda v, i: v[:, 64:192], (32, 128), True),
    ("value lanes 128:256", lambda v, i: v[:, 128:256], (32, 128), True),
    ("value rows ::2", lambda v, i: v[::2], (16, 256), True),
]


_SLICES += [
    ("static rows 1:9", lambda v, i: (slice(1, 9), slice(None)), (8, 256), False),
    ("static rows 4:12", lambda v, i: (slice(4, 12), slice(None)), (8, 256), False),
    ("static rows 16:24", lambda v, i: (slice(16, 24), slice(None)), (8, 256), False),
    ("dynamic rows i*16", lambda v, i: (pl.ds(i * 16, 16), slice(None)), (16, 256), False),
]
# Refs of 128 lanes.
_SLICES_128: list[tuple[str, Callable, tuple[int, int], bool]] = [
    ("strided rows ::2 of (32, 128)", lambda v, i: (pl.ds(0, 16, stride=2), slice(None)),
     (16, 128), False),
    ("strided lanes ::2 of (32, 128)", lambda v, i: (slice(None), pl.ds(0, 64, stride=2)),
     (32, 64), False),
    ("dynamic rows i*8 of (32, 128)", lambda v, i: (pl.ds(i * 8, 8), slice(None)), (8, 128),
     False),
]


def _store_case(dtype, index, value_shape):
    """A store at ``index(i)`` into a (32, 256) output block."""

    def kernel(x_ref, o_ref):
        i = pl.program_id(0)
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)
        o_ref[index(i)] = x_ref[...]

    def make(params):
        spec = pl.BlockSpec(value_shape, lambda i: (0, 0))
        ospec = pl.BlockSpec(SLICE_SRC, lambda i: (0, 0))
        return (_call(kernel, jax.ShapeDtypeStruct(SLICE_SRC, dtype), params, grid=(2,),
                      in_specs=[spec], out_specs=ospec,
                      compiler_params=pltpu.CompilerParams(
                          dimension_semantics=("arbitrary",))),
                (_array(value_shape, dtype),))

    return make


_STORES = [
    ("store dynamic rows i*8", lambda i: (pl.ds(i * 8, 8), slice(None)), (8, 256)),
    ("store dynamic rows i*3", lambda i: (pl.ds(i * 3, 8), slice(None)), (8, 256)),
    ("store dynamic rows i*16", lambda i: (pl.ds(i * 16, 8), slice(None)), (8, 256)),
    ("store dynamic lanes i*64", lambda i: (slice(None), pl.ds(i * 64, 128)), (32, 128)),
    ("store strided rows ::2", lambda i: (pl.ds(0, 16, stride=2), slice(None)), (16, 256)),
]


def slice_cases() -> list[Case]:
    cases = []
    for name in ("f32", "bf16", "i8"):
        for label, index, out_shape, from_value in _SLICES:
            cases.append(Case(f"{label} {name}", "slice",
                              _slice_case(DTYPES[name], index, out_shape,
                                          from_value=from_value)))
        for label, index, out_shape, from_value in _SLICES_128:
            cases.append(Case(f"{label} {name}", "slice",
                              _slice_case(DTYPES[name], index, out_shape,
                                          from_value=from_value, src=(32, 128))))
        cases.append(Case(f"dynamic rows i*32 of (64, 256) {name}", "slice", _slice_case(
            DTYPES[name], lambda v, i: (pl.ds(i * 32, 32), slice(None)), (32, 256),
            src=(64, 256))))
        for label, index, value_shape in _STORES:
            cases.append(Case(f"{label} {name}", "slice",
                              _store_case(DTYPES[name], index, value_shape)))
    return cases


# --- MXU operand and accumulator dtypes -----------------------------------------------

def _dot(lhs, rhs, acc, transposed_rhs=False):
    n = 128

    def kernel(x_ref, y_ref, o_ref):
        if transposed_rhs:
            r = jax.lax.dot_general(x_ref[...], y_ref[...], (((1,), (1,)), ((), ())),
                                    preferred_element_type=acc)
        else:
            r = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=acc)
        o_ref[...] = r.astype(o_ref.dtype)

    def make(params):
        out_dtype = acc if acc is not None else jnp.result_type(lhs, rhs)
        return (_call(kernel, jax.ShapeDtypeStruct((n, n), out_dtype), params),
                (_array((n, n), lhs, 0), _array((n, n), rhs, 1)))

    return make


def mxu_cases() -> list[Case]:
    cases = []
    same = ("f32", "bf16", "f16", "i8", "u8", "i32", "i16", "e4m3", "e5m2")
    for name in same:
        for acc_name, acc in (("default", None), ("f32", F32), ("i32", I32)):
            cases.append(Case(f"dot {name} x {name} -> {acc_name}", "mxu",
                              _dot(DTYPES[name], DTYPES[name], acc)))
    mixed = [("bf16", "i8"), ("i8", "bf16"), ("f32", "bf16"), ("bf16", "f32"),
             ("i8", "e4m3"), ("e4m3", "e5m2"), ("bf16", "e4m3"), ("e4m3", "bf16"),
             ("i8", "i32"), ("f32", "i8"), ("i8", "u8"), ("bf16", "f16")]
    for lhs, rhs in mixed:
        cases.append(Case(f"dot {lhs} x {rhs} -> f32", "mxu",
                          _dot(DTYPES[lhs], DTYPES[rhs], F32)))
    for name, acc in (("f32", F32), ("bf16", F32), ("i8", I32), ("e4m3", F32)):
        cases.append(Case(f"dot_general {name} x {name}^T -> {np.dtype(acc).name}", "mxu",
                          _dot(DTYPES[name], DTYPES[name], acc, transposed_rhs=True)))
    cases.append(Case("dot bf16 x bf16 -> bf16", "mxu", _dot(BF16, BF16, BF16)))
    return cases


# --- block shapes ---------------------------------------------------------------------

def _blocked(dtype, shape, block):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + x_ref[...]

    grid = tuple(n // b for n, b in zip(shape, block))

    def make(params):
        spec = pl.BlockSpec(block, lambda i, j: (i, j))
        return (_call(kernel, jax.ShapeDtypeStruct(shape, dtype), params, grid=grid,
                      in_specs=[spec], out_specs=spec), (_array(shape, dtype),))

    return make


def block_cases() -> list[Case]:
    cases = []
    for name in ("f32", "bf16", "i32"):
        for block in ((8, 128), (16, 128), (32, 128), (64, 256), (8, 256), (1, 512), (64, 512),
                      (16, 256), (2, 512)):
            cases.append(Case(f"block {_fmt(block)} of (64, 512) {name}", "block",
                              _blocked(DTYPES[name], (64, 512), block)))
    return cases


# --- VMEM and SMEM sizes around the limits --------------------------------------------

def _live_scratch(scratch, *, compiler_params=None, fill=None, read=None, out_dtype=F32):
    """A kernel writing 8 rows of ``scratch`` and reading 8 rows back at run-time
    indices (scalar prefetch), so the compiler must allocate all of it."""

    def kernel(idx_ref, x_ref, o_ref, s_ref):
        (fill or _fill_rows)(s_ref, idx_ref[0], x_ref)
        o_ref[...] = (read or _read_rows)(s_ref, idx_ref[1]).astype(o_ref.dtype)

    def make(params):
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,),
            in_specs=[pl.BlockSpec((8, 128), lambda i, idx: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, idx: (0, 0)),
            scratch_shapes=[scratch])
        call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), out_dtype),
                              grid_spec=grid_spec, interpret=params,
                              compiler_params=compiler_params)
        return call, (jnp.array([0, 0], jnp.int32), _array((8, 128), F32))

    return make


def _fill_rows(s_ref, at, x_ref):
    s_ref[pl.ds(pl.multiple_of(at * 8, 8), 8), :] = x_ref[...].astype(s_ref.dtype)


def _read_rows(s_ref, at):
    return s_ref[pl.ds(pl.multiple_of(at * 8, 8), 8), :]


def _vmem_rows(nbytes, itemsize=4):
    return nbytes // (128 * itemsize)


def vmem_cases() -> list[Case]:
    cases = []
    sizes = [("16 MiB - 64 KiB", 16 * MiB - 64 * KiB), ("16 MiB - 8 KiB", 16 * MiB - 8 * KiB),
             ("16 MiB", 16 * MiB), ("16 MiB + 4 KiB", 16 * MiB + 4 * KiB),
             ("32 MiB - 64 KiB", 32 * MiB - 64 * KiB), ("32 MiB", 32 * MiB),
             ("32 MiB + 4 KiB", 32 * MiB + 4 * KiB)]
    for label, n in sizes:
        # Default scoped limit; the 8x128 f32 operands take 16 KiB beside the scratch.
        cases.append(Case(f"VMEM scratch {label} f32", "vmem",
                          _live_scratch(pltpu.VMEM((_vmem_rows(n), 128), F32))))
    for limit_label, limit, sizes2 in (
            ("64 MiB", 64 * MiB, [("64 MiB - 128 KiB", 64 * MiB - 128 * KiB),
                                  ("64 MiB - 16 KiB", 64 * MiB - 16 * KiB)]),
            ("128 MiB", 128 * MiB, [("128 MiB - 64 KiB", 128 * MiB - 64 * KiB),
                                    ("128 MiB - 128 KiB", 128 * MiB - 128 * KiB),
                                    ("96 MiB", 96 * MiB)]),
            ("100 MiB", 100 * MiB, [("64 MiB", 64 * MiB), ("100 MiB - 64 KiB",
                                                           100 * MiB - 64 * KiB)])):
        params = pltpu.CompilerParams(vmem_limit_bytes=limit)
        for label, n in sizes2:
            cases.append(Case(f"VMEM scratch {label} f32, vmem_limit {limit_label}", "vmem",
                              _live_scratch(pltpu.VMEM((_vmem_rows(n), 128), F32),
                                            compiler_params=params)))
    cases += _double_buffered_cases()
    return cases


def _double_buffered(rows, body, label):
    def kernel(x_ref, o_ref):
        o_ref[...] = body(x_ref[...])

    def make(params):
        spec = pl.BlockSpec((rows, 1024), lambda i: (i, 0))
        return (_call(kernel, jax.ShapeDtypeStruct((2 * rows, 1024), F32), params, grid=(2,),
                      in_specs=[spec], out_specs=spec), (_array((2 * rows, 1024), F32),))

    return Case(label, "vmem", make)


def _double_buffered_cases() -> list[Case]:
    # in + out blocks of rows x 1024 f32, two buffers each: 16 MiB at rows=1024.
    cases = []
    for rows in (1024, 1008, 960, 512):
        mib = 16 * rows / 1024
        cases.append(_double_buffered(rows, lambda v: v * 2.0,
                                      f"blocks {mib:g} MiB, x*2"))
    for rows in (1024, 896, 768, 512):
        mib = 16 * rows / 1024
        cases.append(_double_buffered(
            rows, lambda v, r=rows: jnp.dot(v[:, :r], v, preferred_element_type=F32),
            f"blocks {mib:g} MiB, dot {rows}x{rows}x1024 f32"))
    return cases


def _smem_live(shape, dtype):
    """SMEM scratch of ``shape``: one element written and read at run-time indices."""

    def kernel(idx_ref, x_ref, o_ref, s_ref):
        at = (idx_ref[0],) + (0,) * (len(shape) - 1)
        back = (idx_ref[1],) + (0,) * (len(shape) - 1)
        s_ref[at] = x_ref[0].astype(dtype)
        o_ref[0] = s_ref[back].astype(o_ref.dtype)

    def make(params):
        smem = pl.BlockSpec(memory_space=pltpu.SMEM)
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,), in_specs=[smem], out_specs=smem,
            scratch_shapes=[pltpu.SMEM(shape, dtype)])
        call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), I32),
                              grid_spec=grid_spec, interpret=params)
        return call, (jnp.array([0, 0], jnp.int32), jnp.array([7], jnp.int32))

    return make


def smem_cases() -> list[Case]:
    cases = []
    words = MiB // 4
    for label, n in (("1 MiB", words), ("1 MiB - 256 B", words - 64),
                     ("1 MiB - 1 KiB", words - 256), ("1 MiB - 2 KiB", words - 512),
                     ("1 MiB - 4 KiB", words - 1024), ("1 MiB - 8 KiB", words - 2048),
                     ("1 MiB - 16 KiB", words - 4096), ("512 KiB", words // 2),
                     ("1 KiB", 256)):
        cases.append(Case(f"SMEM scratch ({n},) int32 ({label})", "smem",
                          _smem_live((n,), I32)))
    for shape in ((2048, 2), (1024, 2), (512, 2), (256, 2), (128, 2), (64, 128), (256, 128),
                  (512, 128), (16, 2), (8, 128), (2, 8, 128), (4, 4, 4)):
        cases.append(Case(f"SMEM scratch {_fmt(shape)} int32", "smem", _smem_live(shape, I32)))
    for name in ("f32", "i16", "i8", "bf16"):
        cases.append(Case(f"SMEM scratch (1024,) {name}", "smem",
                          _smem_live((1024,), DTYPES[name])))
    return cases


def _scalar_smem(dtype, op):
    def kernel(x_ref, o_ref):
        o_ref[0] = op(x_ref[0], x_ref[1])
        o_ref[1] = x_ref[1]

    def make(params):
        smem = pl.BlockSpec(memory_space=pltpu.SMEM)
        return (_call(kernel, jax.ShapeDtypeStruct((8,), dtype), params, in_specs=[smem],
                      out_specs=smem), (_array((8,), dtype),))

    return make


def scalar_cases() -> list[Case]:
    cases = []
    for name in ("f32", "i32", "bf16", "f16", "i16", "i8", "u8", "u32"):
        for op_name, op in (("add", jnp.add), ("mul", jnp.multiply), ("max", jnp.maximum),
                            ("copy", lambda a, b: a)):
            cases.append(Case(f"SMEM scalar {op_name} {name}", "scalar",
                              _scalar_smem(DTYPES[name], op)))
    return cases


def bool_scratch_cases() -> list[Case]:
    def fill(s_ref, at, x_ref):
        s_ref[pl.ds(pl.multiple_of(at * 8, 8), 8), :] = x_ref[...] > 0

    def read(s_ref, at):
        return jnp.where(s_ref[pl.ds(pl.multiple_of(at * 8, 8), 8), :], 1.0, 0.0)

    cases = []
    for rows, label in ((8, "(8, 128)"), (4096, "(4096, 128): 512 KiB as bytes, 2 MiB as words"),
                        (24576, "(24576, 128): 3 MiB as bytes, 12 MiB as words"),
                        (40960, "(40960, 128): 5 MiB as bytes, 20 MiB as words"),
                        (73728, "(73728, 128): 9 MiB as bytes, 36 MiB as words"),
                        (131072, "(131072, 128): 16 MiB as bytes, 64 MiB as words")):
        cases.append(Case(f"bool VMEM scratch {label}", "bool",
                          _live_scratch(pltpu.VMEM((rows, 128), BOOL), fill=fill, read=read)))
    return cases


# --- grid dimension semantics ---------------------------------------------------------

def _grid(grid, semantics):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    block = (8, 128)
    shape = tuple(g * b for g, b in zip(grid, block)) if len(grid) == 2 else (grid[0] * 8, 128)

    def make(params):
        if len(grid) == 2:
            spec = pl.BlockSpec(block, lambda i, j: (i, j))
        else:
            spec = pl.BlockSpec(block, lambda i: (i, 0))
        return (_call(kernel, jax.ShapeDtypeStruct(shape, F32), params, grid=grid,
                      in_specs=[spec], out_specs=spec,
                      compiler_params=pltpu.CompilerParams(dimension_semantics=semantics)),
                (_array(shape, F32),))

    return make


def grid_cases() -> list[Case]:
    cases = []
    for n in (1, 2, 3, 4, 8):
        cases.append(Case(f"grid ({n},) core_parallel", "grid", _grid((n,), ("core_parallel",))))
    for n in (1, 4):
        cases.append(Case(f"grid ({n},) parallel", "grid", _grid((n,), ("parallel",))))
        cases.append(Case(f"grid ({n},) arbitrary", "grid", _grid((n,), ("arbitrary",))))
    for grid, sem in ((((2, 4)), ("core_parallel", "arbitrary")),
                      (((1, 4)), ("core_parallel", "arbitrary")),
                      (((4, 2)), ("core_parallel", "parallel")),
                      (((2, 2)), ("parallel", "core_parallel")),
                      (((2, 2)), ("core_parallel", "core_parallel")),
                      (((2, 3)), ("parallel", "arbitrary"))):
        cases.append(Case(f"grid {_fmt(grid)} {'/'.join(sem)}", "grid", _grid(grid, sem)))
    return cases


FAMILIES: dict[str, Callable[[], list[Case]]] = {
    "elementwise": elementwise_cases,
    "reduction": reduction_cases,
    "layout": layout_cases,
    "slice": slice_cases,
    "mxu": mxu_cases,
    "block": block_cases,
    "vmem": vmem_cases,
    "smem": smem_cases,
    "scalar": scalar_cases,
    "bool": bool_scratch_cases,
    "grid": grid_cases,
}


def corpus() -> list[Case]:
    """Every case, in a fixed order."""
    return [case for make in FAMILIES.values() for case in make()]


# --- held out -------------------------------------------------------------------------
# Written after the approximation's rules were learned from the families above, and never
# used to learn them: how the rules do on kernels they were not fitted to.

def _held_out_elementwise() -> list[Case]:
    u16 = jnp.uint16
    specs = [
        ("sub i16 (16, 256)", I16, jnp.subtract), ("mul i16 (16, 256)", I16, jnp.multiply),
        ("min bf16 (16, 256)", BF16, jnp.minimum), ("xor i8 (32, 256)", I8, jnp.bitwise_xor),
        ("or u8 (32, 256)", U8, jnp.bitwise_or), ("shl i8 (32, 256)", I8, lambda a, b: a << 1),
        ("sqrt f32 (16, 256)", F32, lambda a, b: jnp.sqrt(jnp.abs(a))),
        ("exp bf16 (16, 256)", BF16, lambda a, b: jnp.exp(a)),
        ("sqrt e4m3 (32, 256)", E4M3, lambda a, b: jnp.sqrt(a)),
        ("shr u32 (16, 256)", U32, lambda a, b: a >> 2),
        ("ne->where i32 (16, 256)", I32, lambda a, b: jnp.where(a != b, a, b)),
        ("add u16 (16, 256)", u16, jnp.add), ("max u16 (16, 256)", u16, jnp.maximum),
        ("ge i16 select (16, 256)", I16, lambda a, b: jnp.where(a >= b, a, b)),
        ("lt bf16 -> f32 select (16, 256)", BF16,
         lambda a, b: jnp.where(a < b, 1.0, 0.0).astype(BF16)),
        ("add i8 scalar operand (32, 256)", I8, lambda a, b: a + jnp.int8(3)),
        ("mul e5m2 (32, 256)", E5M2, jnp.multiply),
        ("add f16 (16, 256)", F16, jnp.add),
    ]
    cases = []
    for label, dtype, op in specs:
        shape = (32, 256) if np.dtype(dtype).itemsize == 1 else (16, 256)

        def make(params, dtype=dtype, op=op, shape=shape):
            def kernel(x_ref, y_ref, o_ref):
                o_ref[...] = op(x_ref[...], y_ref[...]).astype(o_ref.dtype)

            return (_call(kernel, jax.ShapeDtypeStruct(shape, dtype), params),
                    (_array(shape, dtype, 0), _array(shape, dtype, 1)))

        cases.append(Case(label, "dtype", make))
    return cases


def held_out_cases() -> list[Case]:
    cases = _held_out_elementwise()
    for src, dst, name in (((2, 16, 128), (2, 8, 256), "f32"), ((16, 256), (64, 64), "bf16"),
                           ((8, 512), (8, 4, 128), "f32"), ((32, 256), (32, 4, 64), "i32"),
                           ((4, 8, 128), (4, 1024), "f32"), ((16, 128), (64, 32), "i8")):
        cases.append(Case(f"reshape {_fmt(src)}->{_fmt(dst)} {name}", "reshape",
                          _reshape(DTYPES[name], src, dst)))
    for label, index, out_shape, src, name in (
            ("dynamic rows i*8 of (64, 512)", lambda v, i: (pl.ds(i * 8, 8), slice(None)),
             (8, 512), (64, 512), "bf16"),
            ("dynamic rows i*4 of (32, 384)", lambda v, i: (pl.ds(i * 4, 8), slice(None)),
             (8, 384), (32, 384), "f32"),
            ("dynamic rows i*5 of (64, 128)", lambda v, i: (pl.ds(i * 5, 8), slice(None)),
             (8, 128), (64, 128), "f32"),
            ("dynamic rows i*16 of (64, 128)", lambda v, i: (pl.ds(i * 16, 16), slice(None)),
             (16, 128), (64, 128), "i8"),
            ("dynamic lanes i*256 of (8, 512)", lambda v, i: (slice(None), pl.ds(i * 256, 256)),
             (8, 256), (8, 512), "f32"),
            ("strided rows ::4 of (64, 128)", lambda v, i: (pl.ds(0, 16, stride=4), slice(None)),
             (16, 128), (64, 128), "f32"),
            ("static rows 2:10 of (32, 128)", lambda v, i: (slice(2, 10), slice(None)),
             (8, 128), (32, 128), "i8"),
            ("static rows 24:32 of (32, 128)", lambda v, i: (slice(24, 32), slice(None)),
             (8, 128), (32, 128), "i8")):
        cases.append(Case(f"{label} {name}", "slice",
                          _slice_case(DTYPES[name], index, out_shape, src=src)))
    for lhs, rhs, acc in (("bf16", "bf16", F32), ("i8", "i8", I32), ("f32", "f32", I32),
                          ("i8", "bf16", F32), ("e5m2", "bf16", F32), ("i16", "i8", I32)):
        cases.append(Case(f"dot {lhs} x {rhs} -> {np.dtype(acc).name} (256)", "mxu",
                          _dot(DTYPES[lhs], DTYPES[rhs], acc)))
    cases += [
        Case("grid (2, 3) core_parallel/arbitrary", "grid",
             _grid((2, 3), ("core_parallel", "arbitrary"))),
        Case("grid (3, 2) parallel/core_parallel", "grid",
             _grid((3, 2), ("parallel", "core_parallel"))),
        Case("SMEM scratch (3000, 3) int32", "smem", _smem_live((3000, 3), I32)),
        Case("SMEM scratch (100, 100) int32", "smem", _smem_live((100, 100), I32)),
        Case("SMEM scratch (260000,) int32", "smem", _smem_live((260000,), I32)),
        Case("SMEM scratch (261000,) int32", "smem", _smem_live((261000,), I32)),
        Case("bool VMEM scratch (32768, 128)", "bool", _live_scratch(
            pltpu.VMEM((32768, 128), BOOL),
            fill=lambda s, at, x: s.__setitem__((pl.ds(pl.multiple_of(at * 8, 8), 8),
                                                 slice(None)), x[...] > 0),
            read=lambda s, at: jnp.where(s[pl.ds(pl.multiple_of(at * 8, 8), 8), :], 1.0, 0.0))),
        Case("VMEM scratch 64 MiB - 32 KiB, vmem_limit 64 MiB", "vmem", _live_scratch(
            pltpu.VMEM((_vmem_rows(64 * MiB - 32 * KiB), 128), F32),
            compiler_params=pltpu.CompilerParams(vmem_limit_bytes=64 * MiB))),
        Case("SMEM scalar sub i16", "scalar", _scalar_smem(I16, jnp.subtract)),
        Case("SMEM scalar min bf16", "scalar", _scalar_smem(BF16, jnp.minimum)),
        Case("SMEM scalar sub f32", "scalar", _scalar_smem(F32, jnp.subtract)),
    ]
    return cases
