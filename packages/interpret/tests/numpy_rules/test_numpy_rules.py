"""Every numpy rule against ``primitive.bind`` on the CPU backend, on random inputs.

Exact rules must give the same bits as ``bind`` (NaN payloads aside); approximate rules
must agree within the ulp bounds below. Shapes come from a short fixed list because
``bind`` compiles once per (primitive, shape, dtype, params).
"""

from __future__ import annotations

from typing import Any

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

from palladium.interpret.numpy_rules import NUMPY_RULES
from palladium.interpret.numpy_rules.conversions import _cpu_dependent

jax.config.update("jax_platforms", "cpu")

F32 = np.dtype(np.float32)
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
I32, U32, I8 = np.dtype(np.int32), np.dtype(np.uint32), np.dtype(np.int8)
BOOL = np.dtype(np.bool_)
FLOATS = (F32, BF16, F16)
INTS = (I32, U32, I8)
SIGNED = (I32, I8)

SHAPES = [(), (7,), (4, 8)]
SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# The per-primitive parametrised tests run ~50 times over: fewer examples each.
PER_PRIMITIVE = settings(SETTINGS, max_examples=12)

FLOAT_SPECIALS = np.array(
    [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 1.1754944e-38, 3.4e38, -3.4e38,
     0.5, -0.5, 1.5, -2.5, 1.0, -1.0, 2.0, 3e9, -3e9, 2147483648.0, 255.5],
    np.float32,
)  # fmt: skip


def make_values(
    seed: int, shape: tuple[int, ...], dtype: np.dtype, *, extremes: bool = True
) -> np.ndarray:
    """Random values of ``dtype`` with NaN, infinities, signed zeros, subnormals, extremes."""
    rng = np.random.default_rng(seed)
    if dtype == BOOL:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        wide = rng.integers(info.min, int(info.max) + 1, shape, dtype=np.int64)
        small = rng.integers(-3, 4, shape).astype(np.int64)
        edges = np.array([info.min, info.max, 0, 1, -1], np.int64)
        pick = rng.random(shape)
        v = np.where(pick < 0.4, wide, np.where(pick < 0.8, small, rng.choice(edges, shape)))
        return v.astype(dtype)
    scale = 10.0 ** rng.integers(-3, 4, shape)
    v = (rng.standard_normal(shape) * scale).astype(np.float32)
    specials = FLOAT_SPECIALS if extremes else FLOAT_SPECIALS[np.abs(FLOAT_SPECIALS) < 1e9]
    v = np.where(rng.random(shape) < 0.25, rng.choice(specials, shape), v).astype(np.float32)
    return np.asarray(v.astype(dtype))


def bind(prim: Any, *args: Any, **params: Any) -> Any:
    out = prim.bind(*args, **params)
    return [np.asarray(o) for o in out] if prim.multiple_results else np.asarray(out)


def run_rule(prim: Any, *args: Any, **params: Any) -> Any:
    out = NUMPY_RULES[prim](*args, **params)
    assert out is not NotImplemented, f"{prim} returned NotImplemented"
    return out


def _int_view(a: np.ndarray) -> np.ndarray:
    return a.view({1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[a.dtype.itemsize])


def _isnan(a: np.ndarray) -> np.ndarray:
    return np.isnan(a.astype(np.float32))


def assert_exact(ours: Any, ref: Any) -> None:
    """Same dtype, shape and bits; any NaN equals any NaN."""
    if isinstance(ref, list):
        assert isinstance(ours, list) and len(ours) == len(ref)
        for o, r in zip(ours, ref):
            assert_exact(o, r)
        return
    assert isinstance(ours, np.ndarray), type(ours)
    assert ours.dtype == ref.dtype, (ours.dtype, ref.dtype)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    if ref.dtype in FLOATS:
        nan = _isnan(ref)
        np.testing.assert_array_equal(_isnan(ours), nan)
        np.testing.assert_array_equal(
            np.where(nan, 0, _int_view(ours)), np.where(nan, 0, _int_view(ref))
        )
    else:
        np.testing.assert_array_equal(ours, ref)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    def key(x: np.ndarray) -> np.ndarray:
        bits = _int_view(x).astype(np.int64)
        mag = bits & (2 ** (8 * x.dtype.itemsize - 1) - 1)
        return np.where(bits < 0, -mag, mag)

    return np.abs(key(a) - key(b))


def assert_ulp(ours: np.ndarray, ref: np.ndarray, ulps: int) -> None:
    """Same dtype/shape/NaNs; finite values within ``ulps`` (or both below f32 tiny)."""
    assert ours.dtype == ref.dtype and ours.shape == ref.shape, (ours.dtype, ref.dtype)
    nan = _isnan(ref)
    np.testing.assert_array_equal(_isnan(ours), nan)
    d = np.where(nan, 0, ulp_distance(ours, ref))
    near_zero = (
        np.abs(ours.astype(np.float32) - ref.astype(np.float32)) < 2 * np.finfo(np.float32).tiny
    )
    bad = (d > ulps) & ~near_zero
    assert not bad.any(), f"max {d.max()} ulp > {ulps}: ours {ours[bad][:4]} vs bind {ref[bad][:4]}"


# ----------------------------------------------------------------------------- elementwise

NO_PARAMS: dict[str, Any] = {}
ACC = {"accuracy": None}

# primitive, arity, dtypes, params
#: jax 0.10.0 has no ``lax.mulhi_p``: its case is skipped there.
MULHI_P = getattr(lax, "mulhi_p", None)


def _case(i: int, case: tuple) -> Any:
    prim = case[0]
    if prim is None:
        return pytest.param(*case, id=f"mulhi-{i}",
                            marks=pytest.mark.skip(reason="jax 0.10.0 has no lax.mulhi_p"))
    return pytest.param(*case, id=f"{prim.name}-{i}")


EXACT_ELEMENTWISE = [
    (lax.add_p, 2, FLOATS + INTS, NO_PARAMS),
    (lax.sub_p, 2, FLOATS + INTS, NO_PARAMS),
    (lax.mul_p, 2, FLOATS + INTS, {"out_dtype": None}),
    (lax.div_p, 2, FLOATS + INTS, NO_PARAMS),
    (lax.rem_p, 2, FLOATS + INTS, NO_PARAMS),
    (lax.max_p, 2, FLOATS + INTS, NO_PARAMS),
    (lax.min_p, 2, FLOATS + INTS, NO_PARAMS),
    (lax.neg_p, 1, FLOATS + INTS, NO_PARAMS),
    (lax.abs_p, 1, FLOATS + SIGNED, NO_PARAMS),
    (lax.sign_p, 1, FLOATS + SIGNED, NO_PARAMS),
    (lax.square_p, 1, FLOATS + INTS, NO_PARAMS),
    (lax.sqrt_p, 1, FLOATS, ACC),
    (lax.floor_p, 1, FLOATS, NO_PARAMS),
    (lax.ceil_p, 1, FLOATS, NO_PARAMS),
    (lax.round_p, 1, FLOATS, {"rounding_method": lax.RoundingMethod.AWAY_FROM_ZERO}),
    (lax.round_p, 1, FLOATS, {"rounding_method": lax.RoundingMethod.TO_NEAREST_EVEN}),
    (lax.is_finite_p, 1, FLOATS, NO_PARAMS),
    (lax.nextafter_p, 2, (F32,), NO_PARAMS),
    (lax.eq_p, 2, FLOATS + INTS + (BOOL,), NO_PARAMS),
    (lax.ne_p, 2, FLOATS + INTS + (BOOL,), NO_PARAMS),
    (lax.lt_p, 2, FLOATS + INTS + (BOOL,), NO_PARAMS),
    (lax.le_p, 2, FLOATS + INTS, NO_PARAMS),
    (lax.gt_p, 2, FLOATS + INTS, NO_PARAMS),
    (lax.ge_p, 2, FLOATS + INTS + (BOOL,), NO_PARAMS),
    (lax.and_p, 2, INTS + (BOOL,), NO_PARAMS),
    (lax.or_p, 2, INTS + (BOOL,), NO_PARAMS),
    (lax.xor_p, 2, INTS + (BOOL,), NO_PARAMS),
    (lax.not_p, 1, INTS + (BOOL,), NO_PARAMS),
    (lax.shift_left_p, 2, INTS, NO_PARAMS),
    (lax.shift_right_logical_p, 2, INTS, NO_PARAMS),
    (lax.shift_right_arithmetic_p, 2, INTS, NO_PARAMS),
    (lax.population_count_p, 1, INTS, NO_PARAMS),
    (lax.clz_p, 1, INTS, NO_PARAMS),
    (MULHI_P, 2, INTS, NO_PARAMS),
    (lax.clamp_p, 3, FLOATS + INTS, NO_PARAMS),
]


def _operand_shapes(data: Any, arity: int) -> list[tuple[int, ...]]:
    shape = data.draw(st.sampled_from(SHAPES[1:]))
    # lax allows rank-0 operands next to arrays (jaxpr literals such as `max x 0.0`).
    return [data.draw(st.sampled_from([shape, shape, ()])) for _ in range(arity)]


@pytest.mark.parametrize(
    "prim,arity,dtypes,params",
    [_case(i, case) for i, case in enumerate(EXACT_ELEMENTWISE)],
)
@PER_PRIMITIVE
@given(data=st.data())
def test_elementwise_is_bit_identical_to_bind(prim, arity, dtypes, params, data):
    dtype = data.draw(st.sampled_from(dtypes))
    shapes = _operand_shapes(data, arity)
    if prim is lax.clamp_p:
        shapes = [shapes[0] if s == () else s for s in shapes]
        shapes = [() if data.draw(st.booleans()) else shapes[1], shapes[1], ()]
    if prim in (lax.shift_left_p, lax.shift_right_logical_p, lax.shift_right_arithmetic_p):
        # Shift amounts around and beyond the bit width, and negative ones.
        x = make_values(data.draw(st.integers(0, 2**32)), shapes[0], dtype)
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
        amount = rng.integers(-2, dtype.itemsize * 8 + 3, shapes[1]).astype(dtype)
        args = [x, amount]
    else:
        args = [make_values(data.draw(st.integers(0, 2**32)), s, dtype) for s in shapes]
    if prim is lax.rem_p and dtype in FLOATS:
        # Float rem of subnormals is left to bind (see test_rules_decline_...).
        args = [
            np.where(np.abs(a.astype(np.float32)) < 1e-37, a.dtype.type(0), a).astype(dtype)
            for a in args
        ]
    assert_exact(run_rule(prim, *args, **params), bind(prim, *args, **params))


# Transcendentals: XLA CPU's own approximations. Bounds in ulp of the output dtype.
ULP_BOUNDS = {
    lax.exp_p: 6,
    lax.exp2_p: 8,
    lax.log_p: 3,
    lax.log1p_p: 3,
    lax.expm1_p: 8,
    lax.tanh_p: 6,
    lax.logistic_p: 5,
    lax.sin_p: 2,
    lax.cos_p: 2,
    lax.rsqrt_p: 2,
    lax.pow_p: 8,
}


@pytest.mark.parametrize("prim", list(ULP_BOUNDS), ids=lambda p: p.name)
@PER_PRIMITIVE
@given(data=st.data())
def test_transcendental_within_ulp_bound_of_bind(prim, data):
    dtype = data.draw(st.sampled_from((F32,) if prim is lax.exp2_p else FLOATS))
    shape = data.draw(st.sampled_from(SHAPES))
    arity = 2 if prim is lax.pow_p else 1
    args = [
        make_values(data.draw(st.integers(0, 2**32)), shape, dtype, extremes=False)
        for _ in range(arity)
    ]
    # subnormal operands are left to bind (pow, log; and the pass-through functions
    # tanh, sin, expm1, log1p: see test_pass_through_functions_leave_subnormals_to_bind)
    if prim in (lax.pow_p, lax.log_p, lax.tanh_p, lax.sin_p, lax.expm1_p, lax.log1p_p):
        args = [
            np.where(np.abs(a.astype(np.float32)) < 1e-37, a.dtype.type(0), a).astype(dtype)
            for a in args
        ]
    if prim in (lax.sin_p, lax.cos_p):
        args = [np.clip(a.astype(np.float32), -1e4, 1e4).astype(dtype) for a in args]
    params = NO_PARAMS if prim is lax.pow_p else ACC
    ours, ref = run_rule(prim, *args, **params), bind(prim, *args, **params)
    # bf16/f16: both round a slightly different f32 value (XLA sometimes also rounds
    # intermediate steps to the narrow type), so up to two ulp of the output dtype.
    assert_ulp(ours, ref, ULP_BOUNDS[prim] if dtype == F32 else 2)


def test_integer_division_edge_cases_follow_xla():
    x = np.array([7, -7, 7, -7, -(2**31), -(2**31), 5, -5, 0], np.int32)
    y = np.array([2, 2, -2, -2, -1, 0, 0, 0, 0], np.int32)
    assert_exact(run_rule(lax.div_p, x, y), bind(lax.div_p, x, y))
    assert_exact(run_rule(lax.rem_p, x, y), bind(lax.rem_p, x, y))
    np.testing.assert_array_equal(run_rule(lax.div_p, x, y)[:5], [3, -3, -3, 3, -(2**31)])
    u = np.array([7, 0, 5], np.uint32), np.array([0, 0, 2], np.uint32)
    assert_exact(run_rule(lax.div_p, *u), bind(lax.div_p, *u))
    assert_exact(run_rule(lax.rem_p, *u), bind(lax.rem_p, *u))


def test_subnormals_are_flushed_like_xla_cpu():
    d = np.array([1e-40, -1e-40, 1.5e-38, 0.0], np.float32)
    z = np.zeros(4, np.float32)
    assert_exact(run_rule(lax.add_p, d, z), bind(lax.add_p, d, z))
    assert_exact(run_rule(lax.eq_p, d, z), bind(lax.eq_p, d, z))
    assert_exact(run_rule(lax.floor_p, d), bind(lax.floor_p, d))
    # neg moves bits: no flush.
    assert_exact(run_rule(lax.neg_p, d), bind(lax.neg_p, d))
    assert_exact(run_rule(lax.add_p, d, z), np.array([0.0, 0.0, 1.5e-38, 0.0], np.float32))


@pytest.mark.parametrize("y", [0, 1, 2, 3, 4, 5, 7, -1, -2, -3, 12])
@pytest.mark.parametrize("dtype", [F32, BF16, F16, I32], ids=str)
def test_integer_pow_matches_bind(y, dtype):
    if dtype == I32 and y < 0:
        return  # jax rejects negative integer powers of integers at trace time
    x = make_values(y + 100, (4, 8), dtype)
    assert_exact(run_rule(lax.integer_pow_p, x, y=y), bind(lax.integer_pow_p, x, y=y))


def test_mul_out_dtype_converts_inputs_first():
    x = make_values(1, (7,), BF16)
    params = {"out_dtype": F32}
    assert_exact(run_rule(lax.mul_p, x, x, **params), bind(lax.mul_p, x, x, **params))


# ----------------------------------------------------------------------------- conversions

CONVERT_DTYPES = [F32, BF16, F16, I32, U32, I8, np.dtype(np.uint8), np.dtype(np.int16), BOOL]


@SETTINGS
@given(
    src=st.sampled_from(CONVERT_DTYPES),
    dst=st.sampled_from(CONVERT_DTYPES),
    seed=st.integers(0, 2**32),
)
def test_convert_element_type_is_bit_identical(src, dst, seed):
    x = make_values(seed, (4, 8), src)
    params = {"new_dtype": dst, "weak_type": False, "sharding": None}
    if (src != dst and src in (F32, BF16, F16) and dst in (F32, BF16, F16)
            and _cpu_dependent(x, src, dst)):
        # XLA CPU's answer depends on the CPU here: the rule must leave it to bind.
        # (src == dst is no conversion at all: the rule returns x, as XLA does.)
        assert NUMPY_RULES[lax.convert_element_type_p](x, **params) is NotImplemented
        return
    assert_exact(
        run_rule(lax.convert_element_type_p, x, **params),
        bind(lax.convert_element_type_p, x, **params),
    )


@SETTINGS
@given(
    pair=st.sampled_from(
        [
            (F32, I32),
            (F32, U32),
            (I32, F32),
            (BF16, np.dtype(np.int16)),
            (np.dtype(np.uint16), BF16),
            (F32, BF16),
            (F32, np.dtype(np.uint8)),
            (I8, np.dtype(np.uint32)),
        ]  # fmt: skip
    ),
    seed=st.integers(0, 2**32),
)
def test_bitcast_convert_type_is_bit_identical(pair, seed):
    src, dst = pair
    shape = (4, 8) if src.itemsize >= dst.itemsize else (4, dst.itemsize // src.itemsize)
    x = make_values(seed, shape, src)
    assert_exact(
        run_rule(lax.bitcast_convert_type_p, x, new_dtype=dst),
        bind(lax.bitcast_convert_type_p, x, new_dtype=dst),
    )


# ----------------------------------------------------------------------------- structure

STRUCT_DTYPES = [F32, BF16, I32, BOOL]


@SETTINGS
@given(data=st.data())
def test_broadcast_in_dim_reshape_squeeze_transpose_rev(data):
    dtype = data.draw(st.sampled_from(STRUCT_DTYPES))
    x = make_values(data.draw(st.integers(0, 2**32)), (4, 1, 8), dtype)
    cases = [
        (
            lax.broadcast_in_dim_p,
            {"shape": (3, 4, 5, 8), "broadcast_dimensions": (1, 2, 3), "sharding": None},
        ),
        (
            lax.broadcast_in_dim_p,
            {"shape": (4, 6, 8), "broadcast_dimensions": (0, 1, 2), "sharding": None},
        ),
        (lax.reshape_p, {"new_sizes": (8, 4), "dimensions": None, "sharding": None}),
        (lax.reshape_p, {"new_sizes": (32,), "dimensions": None, "sharding": None}),
        (lax.squeeze_p, {"dimensions": (1,)}),
        (lax.transpose_p, {"permutation": data.draw(st.permutations([0, 1, 2]))}),
        (lax.rev_p, {"dimensions": tuple(data.draw(st.sets(st.sampled_from([0, 1, 2]))))}),
        (lax.copy_p, {}),
        (lax.tile_p, {"reps": (2, 3, 1)}),
    ]
    prim, params = data.draw(st.sampled_from(cases))
    if prim is lax.transpose_p:
        params = {"permutation": tuple(params["permutation"])}
    if prim is lax.rev_p:
        params = {"dimensions": tuple(sorted(params["dimensions"]))}
    if prim in (lax.broadcast_in_dim_p, lax.tile_p) and dtype == BF16:
        # bf16 subnormals are declined (test_bf16_subnormal_broadcast_is_left_to_bind).
        x = np.where(
            np.abs(x.astype(np.float32)) < 1e-37, np.float32(0), x.astype(np.float32)
        ).astype(BF16)
    assert_exact(run_rule(prim, x, **params), bind(prim, x, **params))


def test_subnormal_to_bool_follows_xla_cpu():
    params = {"new_dtype": BOOL, "weak_type": False, "sharding": None}
    for x in (
        np.full((16, 128), 1e-40, np.float32),
        np.full((16, 128), 1e-40, np.float32).astype(BF16),
    ):
        assert_exact(
            run_rule(lax.convert_element_type_p, x, **params),
            bind(lax.convert_element_type_p, x, **params),
        )
    # f32 compares with subnormals flushed, bf16 does not.
    assert not run_rule(lax.convert_element_type_p, np.float32(1e-40), **params)
    assert run_rule(lax.convert_element_type_p, np.float32(1e-40).astype(BF16), **params)


def test_bf16_subnormal_tile_is_left_to_bind():
    x = np.full((4, 1, 8), 1e-40, np.float32).astype(BF16)
    assert NUMPY_RULES[lax.tile_p](x, reps=(2, 3, 1)) is NotImplemented


def test_bf16_subnormal_broadcast_is_left_to_bind():
    # Whether XLA CPU flushes bf16 subnormals in a broadcast depends on the CPU: in some
    # broadcasts it converts through f32, and only AVX512_BF16's f32 -> bf16 instruction
    # flushes (XLA_FLAGS=--xla_cpu_max_isa=AVX2 shows the other behaviour). So the rule
    # declines every broadcast of them, and the result is bind's, whatever the CPU.
    x = np.full((4, 8), 1e-40, np.float32).astype(BF16)
    for params in (
        {"shape": (4, 5, 8), "broadcast_dimensions": (0, 2), "sharding": None},
        {"shape": (3, 4, 8), "broadcast_dimensions": (1, 2), "sharding": None},
    ):
        assert NUMPY_RULES[lax.broadcast_in_dim_p](x, **params) is NotImplemented
    normal = np.full((4, 8), 1e-30, np.float32).astype(BF16)
    assert_exact(
        run_rule(lax.broadcast_in_dim_p, normal, **params),
        bind(lax.broadcast_in_dim_p, normal, **params),
    )


def test_float_conversions_of_subnormals_are_left_to_bind():
    # The hardware conversions to/from bf16 and f16 flush subnormals on some CPUs
    # (AVX512_BF16, arm64 under XLA's flush bits) and keep them on others.
    convert = NUMPY_RULES[lax.convert_element_type_p]
    params = {"weak_type": False, "sharding": None}
    cases = [
        (np.full((16, 128), 1e-40, np.float32), BF16),  # f32 subnormal in
        (np.full((16, 128), 1e-6, np.float32), np.dtype(np.float16)),  # f16 subnormal out
        (np.full((16, 128), 1e-6, np.float32).astype(np.float16), F32),  # f16 subnormal in
        (np.full((16, 128), 1e-6, np.float32).astype(np.float16), BF16),
    ]
    for x, dst in cases:
        assert convert(x, new_dtype=dst, **params) is NotImplemented
        normal = np.ones_like(x)
        assert_exact(
            run_rule(lax.convert_element_type_p, normal, new_dtype=dst, **params),
            bind(lax.convert_element_type_p, normal, new_dtype=dst, **params),
        )
    # bf16 -> f32 is a bit shift on every CPU: the rule keeps the subnormal.
    x = np.full((16, 128), 1e-40, np.float32).astype(BF16)
    out = run_rule(lax.convert_element_type_p, x, new_dtype=F32, **params)
    assert_exact(out, bind(lax.convert_element_type_p, x, new_dtype=F32, **params))
    assert out.all()


@SETTINGS
@given(data=st.data())
def test_iota(data):
    dtype = data.draw(st.sampled_from([I32, U32, F32, BF16]))
    shape = data.draw(st.sampled_from([(8,), (4, 8), (3, 300)]))
    params = {
        "dtype": dtype,
        "shape": shape,
        "dimension": data.draw(st.integers(0, len(shape) - 1)),
        "sharding": None,
    }
    assert_exact(run_rule(lax.iota_p, **params), bind(lax.iota_p, **params))


@SETTINGS
@given(data=st.data())
def test_pad_with_negative_and_interior_padding(data):
    dtype = data.draw(st.sampled_from(STRUCT_DTYPES))
    x = make_values(data.draw(st.integers(0, 2**32)), (4, 5), dtype)
    pad_value = make_values(data.draw(st.integers(0, 2**32)), (), dtype)
    config = tuple(
        (data.draw(st.integers(-2, 2)), data.draw(st.integers(-2, 2)), data.draw(st.integers(0, 2)))
        for _ in range(2)
    )
    params = {"padding_config": config}
    assert_exact(
        run_rule(lax.pad_p, x, pad_value, **params), bind(lax.pad_p, x, pad_value, **params)
    )


@SETTINGS
@given(data=st.data())
def test_slice_concatenate_split(data):
    dtype = data.draw(st.sampled_from(STRUCT_DTYPES))
    x = make_values(data.draw(st.integers(0, 2**32)), (6, 8), dtype)
    starts = (data.draw(st.integers(0, 3)), data.draw(st.integers(0, 4)))
    params = {
        "start_indices": starts,
        "limit_indices": (
            data.draw(st.integers(starts[0], 6)),
            data.draw(st.integers(starts[1], 8)),
        ),
        "strides": data.draw(st.sampled_from([None, (1, 1), (2, 3)])),
    }
    assert_exact(run_rule(lax.slice_p, x, **params), bind(lax.slice_p, x, **params))
    dim = data.draw(st.integers(0, 1))
    parts = [x, x[:2], x] if dim == 0 else [x, x[:, :3], x]
    assert_exact(
        run_rule(lax.concatenate_p, *parts, dimension=dim),
        bind(lax.concatenate_p, *parts, dimension=dim),
    )
    split = {"sizes": (2, 0, 4), "axis": 0}
    assert_exact(run_rule(lax.split_p, x, **split), bind(lax.split_p, x, **split))


@SETTINGS
@given(data=st.data())
def test_dynamic_slice_and_update_clamp_start_indices(data):
    dtype = data.draw(st.sampled_from(STRUCT_DTYPES))
    x = make_values(data.draw(st.integers(0, 2**32)), (6, 8), dtype)
    idx_dtype = data.draw(st.sampled_from([I32, U32]))
    lo = 0 if idx_dtype == U32 else -10
    starts = [np.asarray(data.draw(st.integers(lo, 10)), idx_dtype) for _ in range(2)]
    sizes = (3, 4)
    assert_exact(
        run_rule(lax.dynamic_slice_p, x, *starts, slice_sizes=sizes),
        bind(lax.dynamic_slice_p, x, *starts, slice_sizes=sizes),
    )
    update = make_values(data.draw(st.integers(0, 2**32)), sizes, dtype)
    before = x.copy()
    assert_exact(
        run_rule(lax.dynamic_update_slice_p, x, update, *starts),
        bind(lax.dynamic_update_slice_p, x, update, *starts),
    )
    assert_exact(x, before)  # the operand is not modified in place


@SETTINGS
@given(data=st.data())
def test_select_n(data):
    dtype = data.draw(st.sampled_from(STRUCT_DTYPES))
    n = data.draw(st.integers(1, 3))
    which_dtype = BOOL if n <= 2 and data.draw(st.booleans()) else I32
    which_shape = data.draw(st.sampled_from([(), (4, 8)]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    which = rng.integers(0, n, which_shape).astype(which_dtype)
    cases = [make_values(data.draw(st.integers(0, 2**32)), (4, 8), dtype) for _ in range(n)]
    assert_exact(run_rule(lax.select_n_p, which, *cases), bind(lax.select_n_p, which, *cases))


# ----------------------------------------------------------------------------- reductions

AXES = [(0,), (1,), (0, 1)]


def _check_sum_like(ours: np.ndarray, ref: np.ndarray, abs_scale: np.ndarray, terms: int) -> None:
    """Float accumulations: same NaN/inf pattern, error bounded by n * eps * sum|terms|."""
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    o, r = ours.astype(np.float64), ref.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(o), np.isnan(r))
    finite = np.isfinite(r)
    np.testing.assert_array_equal(o[~finite & ~np.isnan(r)], r[~finite & ~np.isnan(r)])
    eps = (
        float(np.finfo(np.float32).eps)
        if ref.dtype == F32
        else float(ml_dtypes.finfo(ref.dtype).eps)
    )
    # f16/bf16 reductions accumulate in the narrow type under XLA CPU, in f32 here.
    tol = terms * eps * abs_scale + eps * np.abs(r) + 1e-30
    assert np.all(np.abs(o - r)[finite] <= np.broadcast_to(tol, r.shape)[finite])


@SETTINGS
@given(data=st.data())
def test_exact_reductions(data):
    prim = data.draw(
        st.sampled_from(
            [
                lax.reduce_max_p,
                lax.reduce_min_p,
                lax.reduce_and_p,
                lax.reduce_or_p,
                lax.reduce_xor_p,
                lax.argmax_p,
                lax.argmin_p,
                lax.reduce_sum_p,
                lax.reduce_prod_p,
            ]
        )  # fmt: skip
    )
    bitwise = prim in (lax.reduce_and_p, lax.reduce_or_p, lax.reduce_xor_p)
    arith = prim in (lax.reduce_sum_p, lax.reduce_prod_p)
    dtypes = INTS + (BOOL,) if bitwise else INTS if arith else FLOATS + INTS + (BOOL,)
    dtype = data.draw(st.sampled_from(dtypes))
    x = make_values(data.draw(st.integers(0, 2**32)), (4, 8), dtype)
    if prim in (lax.argmax_p, lax.argmin_p):
        params: dict[str, Any] = {"axes": (data.draw(st.integers(0, 1)),), "index_dtype": I32}
    elif prim in (lax.reduce_sum_p,):
        params = {"axes": data.draw(st.sampled_from(AXES)), "out_sharding": None}
    else:
        params = {"axes": data.draw(st.sampled_from(AXES))}
    assert_exact(run_rule(prim, x, **params), bind(prim, x, **params))


@SETTINGS
@given(data=st.data())
def test_float_sum_and_prod_are_close(data):
    prim = data.draw(st.sampled_from([lax.reduce_sum_p, lax.reduce_prod_p]))
    dtype = data.draw(st.sampled_from(FLOATS))
    axes = data.draw(st.sampled_from(AXES))
    x = make_values(data.draw(st.integers(0, 2**32)), (4, 8), dtype, extremes=False)
    if prim is lax.reduce_prod_p:
        x = np.clip(x.astype(np.float32), -3, 3).astype(dtype)  # keep products in range
    params: dict[str, Any] = {"axes": axes}
    if prim is lax.reduce_sum_p:
        params["out_sharding"] = None
    ours, ref = run_rule(prim, x, **params), bind(prim, x, **params)
    f = np.abs(x.astype(np.float64))
    scale = (
        np.sum(f, axis=axes) if prim is lax.reduce_sum_p else np.prod(np.maximum(f, 1), axis=axes)
    )
    _check_sum_like(ours, ref, scale, int(np.prod([x.shape[a] for a in axes])))


@SETTINGS
@given(data=st.data())
def test_cumulative_reductions(data):
    prim = data.draw(st.sampled_from([lax.cumsum_p, lax.cumprod_p, lax.cummax_p, lax.cummin_p]))
    dtype = data.draw(st.sampled_from(FLOATS + (I32, U32)))
    params = {"axis": data.draw(st.integers(0, 1)), "reverse": data.draw(st.booleans())}
    exact = dtype in INTS or prim in (lax.cummax_p, lax.cummin_p)
    x = make_values(data.draw(st.integers(0, 2**32)), (4, 8), dtype, extremes=exact)
    if prim is lax.cumprod_p and not exact:
        x = np.clip(x.astype(np.float32), -3, 3).astype(dtype)
    ours, ref = run_rule(prim, x, **params), bind(prim, x, **params)
    if exact:
        assert_exact(ours, ref)
    else:
        f = np.abs(x.astype(np.float64))
        if prim is lax.cumsum_p:
            scale = np.cumsum(
                np.flip(f, params["axis"]) if params["reverse"] else f, axis=params["axis"]
            )
        else:
            g = np.maximum(f, 1)
            scale = np.cumprod(
                np.flip(g, params["axis"]) if params["reverse"] else g, axis=params["axis"]
            )
        if params["reverse"]:
            scale = np.flip(scale, params["axis"])
        _check_sum_like(ours, ref, scale, x.shape[params["axis"]])


# ----------------------------------------------------------------------------- dot_general

DOT_CASES = [
    # lhs shape, rhs shape, dimension numbers
    ((4, 8), (8, 5), (((1,), (0,)), ((), ()))),
    ((4, 8), (5, 8), (((1,), (1,)), ((), ()))),
    ((8, 4), (8, 5), (((0,), (0,)), ((), ()))),
    ((2, 4, 8), (2, 8, 3), (((2,), (1,)), ((0,), (0,)))),
    ((4, 2, 8), (8, 2, 3), (((2,), (0,)), ((1,), (1,)))),
    ((2, 3, 4), (3, 4, 5), (((1, 2), (0, 1)), ((), ()))),
]


@SETTINGS
@given(data=st.data())
def test_dot_general(data):
    lhs_shape, rhs_shape, dims = data.draw(st.sampled_from(DOT_CASES))
    dtype, preferred = data.draw(
        st.sampled_from(
            [(F32, None), (F32, F32), (BF16, F32), (BF16, None), (F16, F32), (I8, I32), (I32, None)]
        )
    )
    exact = dtype in INTS
    lhs = make_values(data.draw(st.integers(0, 2**32)), lhs_shape, dtype, extremes=exact)
    rhs = make_values(data.draw(st.integers(0, 2**32)), rhs_shape, dtype, extremes=exact)
    params = {
        "dimension_numbers": dims,
        "precision": None,
        "preferred_element_type": preferred,
        "out_sharding": None,
    }
    ours, ref = (
        run_rule(lax.dot_general_p, lhs, rhs, **params),
        bind(lax.dot_general_p, lhs, rhs, **params),
    )
    if exact:
        assert_exact(ours, ref)
        return
    scale = np.asarray(
        bind(
            lax.dot_general_p,
            np.abs(lhs.astype(np.float32)),
            np.abs(rhs.astype(np.float32)),
            **{**params, "preferred_element_type": F32},
        )  # fmt: skip
    ).astype(np.float64)
    contracted = int(np.prod([lhs_shape[d] for d in dims[0][0]]))
    _check_sum_like(ours, ref, scale, contracted)


@SETTINGS
@given(data=st.data())
def test_dot_general_of_mixed_float_dtypes(data):
    """f32 x bf16 (paged attention's scores against bf16 pages) widens both to f32."""
    lhs_shape, rhs_shape, dims = data.draw(st.sampled_from(DOT_CASES))
    lhs_dtype, rhs_dtype = data.draw(st.sampled_from([(F32, BF16), (BF16, F32), (F16, F32)]))
    # No infinities or huge values: where an overflowing product meets an infinite
    # partial sum, the NaN-or-inf outcome depends on the BLAS kernel's use of FMA.
    lhs = make_values(data.draw(st.integers(0, 2**32)), lhs_shape, lhs_dtype, extremes=False)
    rhs = make_values(data.draw(st.integers(0, 2**32)), rhs_shape, rhs_dtype, extremes=False)
    params = {"dimension_numbers": dims, "precision": None, "preferred_element_type": F32,
              "out_sharding": None}
    ours = run_rule(lax.dot_general_p, lhs, rhs, **params)
    ref = bind(lax.dot_general_p, lhs, rhs, **params)
    assert ours.dtype == ref.dtype == F32 and ours.shape == ref.shape
    scale = np.asarray(
        bind(lax.dot_general_p, np.abs(lhs.astype(np.float32)), np.abs(rhs.astype(np.float32)),
             **params)
    ).astype(np.float64)
    _check_sum_like(ours, ref, scale, int(np.prod([lhs_shape[d] for d in dims[0][0]])))
    no_preference = {**params, "preferred_element_type": None}
    assert NUMPY_RULES[lax.dot_general_p](lhs, rhs, **no_preference) is NotImplemented


# ----------------------------------------------------------------------------- fallbacks


def test_rules_decline_what_they_do_not_implement():
    x = np.ones((4,), np.float32)
    assert NUMPY_RULES[lax.exp_p](x, accuracy=lax.Tolerance(atol=1e-3)) is NotImplemented
    assert NUMPY_RULES[lax.exp_p](x.astype(np.float64), accuracy=None) is NotImplemented
    assert NUMPY_RULES[lax.rem_p](x, np.full(4, 1e-40, np.float32)) is NotImplemented
    assert (
        NUMPY_RULES[lax.reshape_p](x, new_sizes=(2, 2), dimensions=(0,), sharding=None)
        is NotImplemented
    )


def test_zero_dimensional_results_are_arrays():
    out = NUMPY_RULES[lax.add_p](np.float32(1), np.float32(2))
    assert isinstance(out, np.ndarray) and out.shape == () and out.dtype == F32
