"""The numpy rules' flush-to-zero of subnormal f32 values (XLA CPU's DAZ/FTZ): its fast
paths (nothing small; only zeros) give the same bits as flushing element by element."""

import numpy as np
import pytest

from palladium.interpret.numpy_rules import _flush

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
