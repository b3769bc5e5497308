"""The approximation's rules of what the TPU compiler rejects beyond jax's Mosaic lowering
(``fidelity/approx_rules.py``, facts in ``chip.CompilerFacts``): each rejected kernel
raises ``TpuLoweringError`` with the rule's message at the kernel line, and its near
twin, which the compiler accepts, runs with the right result.

Every rejection here is one the TPU compiler (libtpu 0.0.42.1) makes on that chip
(``benchmarks/compiler_agreement.py``; ``tests/compiler/`` asks it where libtpu is
installed). No libtpu needed: ``compile_check="approximate"``.
"""

import inspect
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams, TpuLoweringError
from palladium.interpret.fidelity.lowering_check import APPROXIMATION_NOTE

HERE = "test_approx_rules.py"
TAIL = ("\nA TPU rejects this kernel at compile time (InterpretParams(compile_check="
        "'compiler') asks the compiler itself when libtpu is installed); "
        "InterpretParams(check_lowering=False) skips this check.\n" + APPROXIMATION_NOTE)


def _params(chip):
    return InterpretParams(chip=chip, compile_check="approximate")


def _line(fn, marker):
    """The line of ``fn``'s source that holds ``marker``."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, text in enumerate(lines) if marker in text)


def _assert_rejected(info, chip, says, *, primitive=None, line=None, kernel="kernel"):
    """The whole message, line numbers aside (``line`` pins the kernel's)."""
    number = str(line) if line is not None else r"\d+"
    at = rf" at {HERE}:{number} \({primitive}\)" if primitive else ""
    pattern = (rf"kernel '{kernel}' \(pallas_call at {HERE}:\d+\) does not compile for TPU "
               rf"{chip}{at}: palladium's approximation of the TPU compiler says: "
               + re.escape(says) + re.escape(TAIL))
    assert re.fullmatch(pattern, str(info.value)), str(info.value)


def _elementwise(fn, shape, dtype, chip, out_dtype=None, n_in=2):
    def kernel(*refs):
        *ins, o_ref = refs
        o_ref[...] = fn(*[r[...] for r in ins])

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(shape, out_dtype or dtype),
                          interpret=_params(chip))


def _ints(shape, dtype, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(-4, 5, shape), dtype)


def _floats(shape, dtype, seed=0):
    return jnp.asarray(np.random.default_rng(seed).uniform(-2, 2, shape), jnp.float32).astype(
        dtype)


# --- vector dtypes --------------------------------------------------------------------

def _add_i8(a, b):
    return a + b  # int8 add


def test_int8_vector_arithmetic_is_rejected_at_its_line():
    x, y = _ints((32, 128), jnp.int8, 0), _ints((32, 128), jnp.int8, 1)
    with pytest.raises(TpuLoweringError) as info:
        _elementwise(_add_i8, x.shape, jnp.int8, "v5e")(x, y)
    _assert_rejected(
        info, "v5e", "the TPU compiler has no int8 vector 'add' on TPU v5e (\"Only "
        "vector<i16> and vector<i32> are supported, but got 'i8'\"). Compute in int32: "
        "x.astype(jnp.int32) before the operation, .astype(jnp.int8) after it.",
        primitive="add", line=_line(_add_i8, "# int8 add"))


def test_int8_arithmetic_in_int32_runs():
    x, y = _ints((32, 128), jnp.int8, 0), _ints((32, 128), jnp.int8, 1)
    out = _elementwise(lambda a, b: (a.astype(jnp.int32) + b.astype(jnp.int32)).astype(jnp.int8),
                       x.shape, jnp.int8, "v5e")(x, y)
    np.testing.assert_array_equal(out, np.asarray(x) + np.asarray(y))


@pytest.mark.parametrize("chip", ["v4", "v7x"])
def test_float8_max_is_rejected_and_its_float32_twin_runs(chip):
    e4m3 = jnp.float8_e4m3fn
    x, y = _floats((32, 128), e4m3, 0), _floats((32, 128), e4m3, 1)
    with pytest.raises(TpuLoweringError) as info:
        _elementwise(jnp.maximum, x.shape, e4m3, chip)(x, y)
    _assert_rejected(
        info, chip, f"the TPU compiler has no float8_e4m3fn vector 'max' on TPU {chip} "
        "(\"failed to legalize operation\"). Compute in float32: x.astype(jnp.float32) "
        "before the operation, .astype(jnp.float8_e4m3fn) after it.", primitive="max")
    out = _elementwise(lambda a, b: jnp.maximum(a.astype(jnp.float32), b.astype(jnp.float32))
                       .astype(e4m3), x.shape, e4m3, chip)(x, y)
    want = np.maximum(np.asarray(x, np.float32), np.asarray(y, np.float32))
    np.testing.assert_array_equal(np.asarray(out, np.float32), want)


def test_int8_compares_are_rejected():
    x, y = _ints((32, 128), jnp.int8, 0), _ints((32, 128), jnp.int8, 1)
    with pytest.raises(TpuLoweringError) as info:
        _elementwise(lambda a, b: jnp.where(a > b, a, b), x.shape, jnp.int8, "v7x")(x, y)
    _assert_rejected(
        info, "v7x", "the TPU compiler has no int8 vector 'gt' on TPU v7x (\"Target does not "
        "support this comparison\"). Compute in int32: "
        "x.astype(jnp.int32) before the operation, .astype(jnp.int8) after it.",
        primitive="gt")


def test_int16_max_is_rejected_but_int16_add_runs():
    x, y = _ints((32, 128), jnp.int16, 0), _ints((32, 128), jnp.int16, 1)
    with pytest.raises(TpuLoweringError) as info:
        _elementwise(jnp.maximum, x.shape, jnp.int16, "v6e")(x, y)
    _assert_rejected(
        info, "v6e", "the TPU compiler has no int16 vector 'max' on TPU v6e (\"failed to "
        "legalize operation\"). Compute in int32: x.astype(jnp.int32) before the operation, "
        ".astype(jnp.int16) after it.", primitive="max")
    out = _elementwise(jnp.add, x.shape, jnp.int16, "v6e")(x, y)
    np.testing.assert_array_equal(out, np.asarray(x) + np.asarray(y))


def test_float16_vectors_are_rejected_and_bfloat16_runs():
    x = _floats((16, 128), jnp.float16)
    with pytest.raises(TpuLoweringError) as info:
        _elementwise(lambda a: a, x.shape, jnp.float16, "v5p", n_in=1)(x)
    _assert_rejected(
        info, "v5p", "the TPU compiler has no float16 vectors on TPU v5p (\"Invalid vector "
        "type for load\"). Use bfloat16 (or float32) in the kernel; convert float16 arrays "
        "outside the pallas_call.", primitive="get")
    xb = x.astype(jnp.bfloat16)
    out = _elementwise(lambda a: a * 2, x.shape, jnp.bfloat16, "v5p", n_in=1)(xb)
    np.testing.assert_array_equal(np.asarray(out, np.float32), 2 * np.asarray(xb, np.float32))


# --- scalars in SMEM ------------------------------------------------------------------

def _scalar_add(dtype, chip):
    def kernel(x_ref, o_ref):
        o_ref[0] = x_ref[0] + x_ref[1]

    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), dtype),
                          in_specs=[smem], out_specs=smem, interpret=_params(chip))


def test_bfloat16_scalar_arithmetic_is_rejected_and_float32_runs():
    x = jnp.array([1.5, 2.25], jnp.bfloat16)
    with pytest.raises(TpuLoweringError) as info:
        _scalar_add(jnp.bfloat16, "v5e")(x)
    _assert_rejected(
        info, "v5e", "the TPU compiler's scalar unit has no bfloat16 'add' on TPU v5e (\"Only "
        "i32 arith.addi is supported\", \"Only i1 and i32 scalars are supported\"). Compute "
        "scalars as int32 or float32: x.astype(jnp.int32) (or jnp.float32) before the "
        "operation.", primitive="add")
    out = _scalar_add(jnp.float32, "v5e")(x.astype(jnp.float32))
    assert float(out[0]) == 3.75


def test_a_float16_smem_operand_is_rejected():
    def kernel(x_ref, o_ref):
        o_ref[0] = x_ref[0]

    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.float16),
                          in_specs=[smem], out_specs=smem, interpret=_params("v6e"))
    with pytest.raises(TpuLoweringError) as info:
        call(jnp.array([1.5], jnp.float16))
    _assert_rejected(
        info, "v6e", "SMEM operand 'x_ref' is float16, which the TPU compiler does not pass in "
        "SMEM on TPU v6e (\"Only arguments with float8e5m2, float8e4m3fn, ..., bfloat16 or "
        "32-bit element types are supported\"). Pass it as float32 or bfloat16.")


# --- masks ----------------------------------------------------------------------------

def _eq_to_i32(a, b):
    return jnp.where(a == b, 1, 0).astype(jnp.int32)


def test_a_bfloat16_mask_selecting_int32_is_rejected_on_v6e_and_runs_on_v5e():
    x, y = _ints((32, 128), jnp.bfloat16, 0), _ints((32, 128), jnp.bfloat16, 1)
    with pytest.raises(TpuLoweringError) as info:
        _elementwise(_eq_to_i32, x.shape, jnp.bfloat16, "v6e", out_dtype=jnp.int32)(x, y)
    _assert_rejected(
        info, "v6e", "on TPU v6e the TPU compiler cannot use the mask of a bfloat16 comparison "
        "to select 32-bit values (\"Invalid relayout: Non-singleton logical dimension is "
        "replicated in destination but not in source\"). Compare in 32 bits "
        "(x.astype(jnp.float32) or jnp.int32) or select bfloat16 values.",
        primitive="select_n")
    out = _elementwise(_eq_to_i32, x.shape, jnp.bfloat16, "v5e", out_dtype=jnp.int32)(x, y)
    np.testing.assert_array_equal(out, (np.asarray(x) == np.asarray(y)).astype(np.int32))


# --- reshapes -------------------------------------------------------------------------

def _reshape(src, dst, chip):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...].reshape(dst)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(dst, jnp.float32),
                          interpret=_params(chip))


def test_splitting_the_lanes_into_sublanes_is_rejected_and_merging_runs():
    x = _floats((8, 128), jnp.float32)
    with pytest.raises(TpuLoweringError) as info:
        _reshape((8, 128), (16, 64), "v5e")(x)
    _assert_rejected(
        info, "v5e", "the TPU compiler cannot lay out the reshape (8, 128) -> (16, 64) on TPU "
        "v5e (\"infer-vector-layout: unsupported shape cast\"): it splits the minor dimension "
        "of 128 lanes. Keep the minor dimension a multiple of 128 (reshape leading dimensions "
        "only), or read the parts from the ref with slices.", primitive="reshape")
    y = _floats((16, 128), jnp.float32)
    np.testing.assert_array_equal(_reshape((16, 128), (8, 256), "v5e")(y),
                                  np.asarray(y).reshape(8, 256))


def test_splitting_the_lanes_into_a_new_dimension_is_rejected_on_v4_only():
    x = _floats((8, 128), jnp.float32)
    with pytest.raises(TpuLoweringError) as info:
        _reshape((8, 128), (8, 2, 64), "v4")(x)
    _assert_rejected(
        info, "v4", "the TPU compiler cannot lay out the reshape (8, 128) -> (8, 2, 64) on TPU "
        "v4 (\"infer-vector-layout: unsupported shape cast\"): it splits the minor dimension "
        "of 128 lanes. Keep the minor dimension a multiple of 128 (reshape leading dimensions "
        "only), or read the parts from the ref with slices.", primitive="reshape")
    np.testing.assert_array_equal(_reshape((8, 128), (8, 2, 64), "v5e")(x),
                                  np.asarray(x).reshape(8, 2, 64))


# --- ref accesses ---------------------------------------------------------------------

def _sliced(index, src, out_shape, dtype, chip):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[index(pl.program_id(0))]

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(out_shape, dtype), grid=(2,),
        in_specs=[pl.BlockSpec(src, lambda i: (0, 0))],
        out_specs=pl.BlockSpec(out_shape, lambda i: (0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=_params(chip))


_ROWS_BY_2 = lambda i: (pl.ds(0, 16, stride=2), slice(None))  # noqa: E731
_UNPROVEN = ("the TPU compiler cannot prove that the dynamic index in dimension {dim} of this "
             "{dtype} {shape} ref is a multiple of {n} on TPU {chip} (\"E2003: "
             "CompileTimeMosaicUnprovenMemoryAccessAlignment\"). Make it one and say so: "
             "pl.ds(pl.multiple_of(i * {n}, {n}), ...).")


def _input(shape, dtype):
    return (_ints if jnp.issubdtype(dtype, jnp.integer) else _floats)(shape, dtype)


# (index of grid step i, input block, output block, dtype, chip, the rule's message)
@pytest.mark.parametrize(("index", "src", "out_shape", "dtype", "chip", "says"), [
    pytest.param(
        _ROWS_BY_2, (32, 128), (16, 128), jnp.bfloat16, "v5e",
        "the TPU compiler has no strided load of bfloat16 data on TPU v5e (\"Strided load "
        "with non 32-bit data\"). Access the rows contiguously and select them from the "
        "value, or keep this operand in 32 bits.", id="strided-bfloat16"),
    pytest.param(
        _ROWS_BY_2, (32, 256), (16, 256), jnp.float32, "v7x",
        "the TPU compiler loads with a stride only from refs whose minor dimension is 128 on "
        "TPU v7x (\"The last dim size is not 128 in original base memref\"; this one is "
        "(32, 256)). Use blocks of 128 lanes for the strided operand.",
        id="strided-wider-than-128-lanes"),
    pytest.param(
        lambda i: (slice(None), pl.ds(0, 64, stride=2)), (32, 128), (32, 64), jnp.float32,
        "v6e", "the TPU compiler has no strided load along the minor (lane) dimension on TPU "
        "v6e (\"Stride on last dim is not 1\"). Access the lanes contiguously and select them "
        "from the value.", id="strided-along-the-lanes"),
    pytest.param(
        lambda i: (slice(3, 11), slice(None)), (32, 256), (8, 256), jnp.int8, "v4",
        "the TPU compiler cannot take int8 rows from offset 3 on TPU v4 (\"Expected mask "
        "vector type\"): the offset must be a multiple of 8. Start at a multiple of 8 and "
        "select the rows from the value.", id="v4-int8-rows-from-an-unaligned-offset"),
    pytest.param(
        lambda i: (pl.ds(i * 3, 8), slice(None)), (32, 256), (8, 256), jnp.float32, "v5e",
        _UNPROVEN.format(dim=0, dtype="float32", shape=(32, 256), n=8, chip="v5e"),
        id="unproven-row-index"),
    pytest.param(
        lambda i: (pl.ds(i * 8, 8), slice(None)), (64, 256), (8, 256), jnp.int8, "v6e",
        _UNPROVEN.format(dim=0, dtype="int8", shape=(64, 256), n=32, chip="v6e"),
        id="int8-rows-need-a-multiple-of-32"),
    pytest.param(
        lambda i: (slice(None), pl.ds(i * 64, 128)), (32, 256), (32, 128), jnp.float32, "v4",
        _UNPROVEN.format(dim=1, dtype="float32", shape=(32, 256), n=128, chip="v4")[:-1]
        + " (the minor dimension needs 128-lane alignment).", id="unproven-lane-index"),
])
def test_a_load_the_compiler_rejects_raises_its_message(index, src, out_shape, dtype, chip,
                                                         says):
    with pytest.raises(TpuLoweringError) as info:
        _sliced(index, src, out_shape, dtype, chip)(_input(src, dtype))
    _assert_rejected(info, chip, says, primitive="get")


# The near twins the compiler accepts: (index, input block, output block, dtype, chip,
# the rows/lanes of the input the last grid step reads).
@pytest.mark.parametrize(("index", "src", "out_shape", "dtype", "chip", "want"), [
    pytest.param(_ROWS_BY_2, (32, 128), (16, 128), jnp.float32, "v5e",
                 np.s_[::2], id="strided-float32"),
    pytest.param(lambda i: (slice(3, 11), slice(None)), (32, 256), (8, 256), jnp.int8, "v5e",
                 np.s_[3:11], id="int8-rows-from-offset-3-on-v5e"),
    pytest.param(lambda i: (slice(8, 16), slice(None)), (32, 256), (8, 256), jnp.int8, "v4",
                 np.s_[8:16], id="v4-int8-rows-from-an-aligned-offset"),
    pytest.param(lambda i: (pl.ds(pl.multiple_of(i * 8, 8), 8), slice(None)), (32, 256),
                 (8, 256), jnp.float32, "v5e", np.s_[8:16], id="proven-row-index"),
    # One tile of 128 float32 lanes takes any dynamic row (the compiler accepts i * 3).
    pytest.param(lambda i: (pl.ds(i * 3, 8), slice(None)), (32, 128), (8, 128), jnp.float32,
                 "v5e", np.s_[3:11], id="any-row-of-one-lane-tile"),
    pytest.param(lambda i: (pl.ds(i * 32, 32), slice(None)), (64, 256), (32, 256), jnp.int8,
                 "v6e", np.s_[32:64], id="int8-rows-at-a-multiple-of-32"),
    pytest.param(lambda i: (slice(None), pl.ds(i * 128, 128)), (32, 256), (32, 128),
                 jnp.float32, "v4", np.s_[:, 128:], id="proven-lane-index"),
])
def test_its_near_twin_runs(index, src, out_shape, dtype, chip, want):
    x = _input(src, dtype)
    out = _sliced(index, src, out_shape, dtype, chip)(x)
    np.testing.assert_array_equal(out, np.asarray(x)[want])


def _stored(index, value_shape, dtype, chip):
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)
        o_ref[index(pl.program_id(0))] = x_ref[...]

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((32, 256), dtype), grid=(2,),
        in_specs=[pl.BlockSpec(value_shape, lambda i: (0, 0))],
        out_specs=pl.BlockSpec((32, 256), lambda i: (0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=_params(chip))


def test_stores_follow_the_same_stride_and_alignment_rules():
    x = _floats((16, 256), jnp.bfloat16)
    with pytest.raises(TpuLoweringError) as info:
        _stored(lambda i: (pl.ds(0, 16, stride=2), slice(None)), (16, 256), jnp.bfloat16,
                "v5e")(x)
    _assert_rejected(
        info, "v5e", "the TPU compiler has no strided store of bfloat16 data on TPU v5e "
        "(\"Strided store with non 32-bit data\"). Access the rows contiguously and select "
        "them from the value, or keep this operand in 32 bits.", primitive="swap")
    y = _floats((8, 256), jnp.float32)
    with pytest.raises(TpuLoweringError) as info:
        _stored(lambda i: (pl.ds(i * 3, 8), slice(None)), (8, 256), jnp.float32, "v5e")(y)
    _assert_rejected(
        info, "v5e", "the TPU compiler cannot prove that the dynamic index in dimension 0 of "
        "this float32 (32, 256) ref is a multiple of 8 on TPU v5e (\"E2003: "
        "CompileTimeMosaicUnprovenMemoryAccessAlignment\"). Make it one and say so: "
        "pl.ds(pl.multiple_of(i * 8, 8), ...).", primitive="swap")
    out = _stored(lambda i: (pl.ds(i * 16, 8), slice(None)), (8, 256), jnp.float32, "v5e")(y)
    want = np.zeros((32, 256), np.float32)
    want[16:24] = np.asarray(y)  # the last step's store; the first step's was zeroed
    np.testing.assert_array_equal(out, want)


# --- the MXU --------------------------------------------------------------------------

def _dot(lhs, rhs, acc, chip):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=acc)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, 128), acc),
                          interpret=_params(chip))


MXU_ADVICE = (" Use bfloat16 or float32 operands with a float32 accumulator, or int8 x int8 "
              "with an int32 one (preferred_element_type=...), converting operands before "
              "the dot.")


@pytest.mark.parametrize(("lhs", "rhs", "acc", "chip", "says"), [
    pytest.param(jnp.float32, jnp.float32, jnp.int32, "v5e",
                 "the TPU compiler has no float32 matmul with an int32 accumulator (\"int acc "
                 "with float lhs\") on TPU v5e.", id="float-operands-int-accumulator"),
    pytest.param(jnp.int8, jnp.int8, jnp.float32, "v6e",
                 "the TPU compiler has no int8 x int8 matmul with a float32 accumulator "
                 "(\"float acc with int lhs\", \"Mix int/int - NYI\") on TPU v6e.",
                 id="int8-operands-float-accumulator"),
    pytest.param(jnp.int32, jnp.int32, jnp.int32, "v7x",
                 "the TPU compiler has no int32 x int32 matmul (\"Bad lhs/rhs type\") on TPU "
                 "v7x.", id="int32-operands"),
    pytest.param(jnp.int8, jnp.int8, jnp.int32, "v4",
                 "the TPU compiler has no int8 x int8 matmul (\"Unsupported matmul RHS type "
                 "on target\") on TPU v4.", id="v4-int8-right-hand-side"),
])
def test_a_matmul_the_compiler_rejects_raises_its_message(lhs, rhs, acc, chip, says):
    x, y = _ints((128, 128), lhs, 0), _ints((128, 128), rhs, 1)
    with pytest.raises(TpuLoweringError) as info:
        _dot(lhs, rhs, acc, chip)(x, y)
    _assert_rejected(info, chip, says + MXU_ADVICE, primitive="dot_general")


@pytest.mark.parametrize(("lhs", "rhs", "acc", "chip"), [
    pytest.param(jnp.float32, jnp.float32, jnp.int32, "v7x", id="v7x-int-accumulator"),
    pytest.param(jnp.int8, jnp.int8, jnp.int32, "v6e", id="int8-with-int32-accumulator"),
    # A bfloat16 left-hand side takes the int8 right-hand side on v4.
    pytest.param(jnp.bfloat16, jnp.int8, jnp.float32, "v4", id="v4-bfloat16-times-int8"),
])
def test_a_matmul_the_compiler_accepts_runs(lhs, rhs, acc, chip):
    x, y = _ints((128, 128), lhs, 0), _ints((128, 128), rhs, 1)
    out = _dot(lhs, rhs, acc, chip)(x, y)
    want = np.asarray(x, np.float64) @ np.asarray(y, np.float64)
    np.testing.assert_array_equal(out, want.astype(np.dtype(acc)))



# --- grid semantics -------------------------------------------------------------------

def _grid_call(grid, semantics, chip):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    spec = pl.BlockSpec((8, 128), lambda *ij: (ij[0], ij[1] if len(ij) > 1 else 0))
    shape = (grid[0] * 8, 128 * (grid[1] if len(grid) > 1 else 1))
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(shape, jnp.float32), grid=grid,
        in_specs=[spec], out_specs=spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
        interpret=_params(chip)), shape


def test_a_core_parallel_dimension_must_match_the_active_cores():
    call, shape = _grid_call((2,), ("core_parallel",), "v5e")
    x = _floats(shape, jnp.float32)
    with pytest.raises(TpuLoweringError) as info:
        call(x)
    _assert_rejected(
        info, "v5e", "grid dimension 0 is \"core_parallel\" with 2 iterations, but TPU v5e "
        "gives a kernel 1 active TensorCore (the compiler: \"Core-parallel dimension has "
        "iteration bound greater than the number of active cores\"). Make that dimension 1 "
        "long, or \"parallel\".")
    call, _ = _grid_call((2,), ("core_parallel",), "v5p")
    np.testing.assert_array_equal(call(x), np.asarray(x) + 1)
    call, _ = _grid_call((2,), ("parallel",), "v5e")
    np.testing.assert_array_equal(call(x), np.asarray(x) + 1)


def test_two_core_parallel_dimensions_are_rejected():
    call, shape = _grid_call((2, 2), ("core_parallel", "core_parallel"), "v5p")
    with pytest.raises(TpuLoweringError) as info:
        call(_floats(shape, jnp.float32))
    _assert_rejected(
        info, "v5p", "a pallas_call may have one \"core_parallel\" grid dimension (the "
        "compiler: \"A single Mosaic subkernel cannot contain multiple core sharding "
        "dimensions\"); make the others \"parallel\".")


# --- a failed verification of the lowered kernel --------------------------------------

def test_a_kernel_mosaic_fails_to_verify_is_rejected():
    x = _floats((128, 128), jnp.bfloat16)

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...])  # bf16 x bf16 -> bf16

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.bfloat16),
                          interpret=_params("v5e"))
    with pytest.raises(TpuLoweringError) as info:
        call(x, x)
    assert str(info.value).startswith(
        f"kernel 'kernel' (pallas_call at {HERE}:")
    assert ("does not lower for TPU v5e: jax's Mosaic lowering says:\nVerificationError: "
            in str(info.value))
    out = _dot(jnp.bfloat16, jnp.bfloat16, jnp.float32, "v5e")(x, x)
    # (an f32 sum of 128 products: numpy's or, from the kernel's third launch on, XLA's
    # order; cancellation leaves ~1e-6 absolute on entries near zero)
    np.testing.assert_allclose(out, np.asarray(x, np.float32) @ np.asarray(x, np.float32),
                               rtol=1e-5, atol=1e-5)


def test_ml_dtypes_names_match_the_facts():
    # The facts name dtypes as numpy does; float8 names must match ml_dtypes'.
    assert np.dtype(ml_dtypes.float8_e4m3fn).name == "float8_e4m3fn"
    assert np.dtype(jnp.bfloat16).name == "bfloat16"
