"""The numpy rules' flush-to-zero of subnormal f32 values (XLA CPU's DAZ/FTZ): its fast
paths (nothing small; only zeros) give the same bits as flushing element by element."""

import numpy as np
import pytest

from palladium.interpret.numpy_rules import flush as _flush

TINY = np.finfo(np.float32).tiny


def _reference(x: np.ndarray) -> np.ndarray:
    out = x.copy()
    for i in np.ndindex(x.shape):
        if 0 < abs(x[i]) < TINY:
            out[i] = np.copysign(np.float32(0), x[i])
    return out


@pytest.mark.parametrize("values", [
    [1.0, -2.5, 3e38],  # nothing small
    [0.0, -0.0, 1.0],  # zeros only
    [1e-40, -1e-40, 0.0, -0.0, 2.0],  # subnormals of both signs
    [np.nan, 1e-41, np.inf, -np.inf],  # NaN and infinities
    [np.nan, 0.0, 1.0],
    [TINY, -TINY],  # smallest normals stay
])
def test_flush_matches_element_by_element(values):
    x = np.array(values, np.float32).reshape(-1, 1)
    got = _flush(x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.int32), _reference(x).view(np.int32))


def test_flush_of_empty_and_scalar():
    assert _flush(np.zeros((0, 3), np.float32)).shape == (0, 3)
    assert _flush(np.array(1e-40, np.float32)).view(np.int32) == 0
    assert _flush(np.array(-1e-40, np.float32)).view(np.int32) == np.array(-0.0, np.float32).view(np.int32)


def test_flush_random_bits():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**32, size=4096, dtype=np.uint64).astype(np.uint32).view(np.float32)
    np.testing.assert_array_equal(_flush(x).view(np.int32), _reference(x).view(np.int32))


def _xla_extreme_reference(a, b, is_max):
    """XLA's max/min element by element: NaN propagates, -0 < +0."""
    out = np.empty(np.broadcast_shapes(a.shape, b.shape), np.float32)
    for i in np.ndindex(out.shape):
        x, y = np.float32(a[i if a.shape == out.shape else (i[0], 0)]), np.float32(b[i])
        if np.isnan(x) or np.isnan(y):
            out[i] = np.nan
        elif x == y:  # equal values; for zeros the sign decides
            neg_x = np.signbit(x)
            out[i] = (y if neg_x else x) if is_max else (x if neg_x else y)
        else:
            out[i] = max(x, y) if is_max else min(x, y)
    return out


@pytest.mark.parametrize("is_max", [True, False])
def test_max_min_ties_of_signed_zeros(is_max):
    from jax import lax

    from palladium.interpret.numpy_rules import NUMPY_RULES

    rule = NUMPY_RULES[lax.max_p if is_max else lax.min_p]
    values = np.array([0.0, -0.0, 1.0, -1.0, np.nan, np.inf, -np.inf], np.float32)
    a = np.repeat(values, len(values)).reshape(len(values), len(values))
    b = np.tile(values, len(values)).reshape(len(values), len(values))
    got, want = rule(a, b), _xla_extreme_reference(a, b, is_max)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got.view(np.int32)[ok], want.view(np.int32)[ok])
    col = values[:, None]  # broadcasting (n, 1) against (n, n), as in flash attention
    got = rule(col, b)
    want = _xla_extreme_reference(np.broadcast_to(col, b.shape), b, is_max)
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got.view(np.int32)[ok], want.view(np.int32)[ok])
