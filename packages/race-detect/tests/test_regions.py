"""Region helpers agree with numpy indexing."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from palladium.race_detect.regions import (
    element_at,
    flat_elements,
    format_region,
    normalise,
    region_shape,
)

SHAPE = (5, 7)


@st.composite
def regions(draw):
    out = []
    for dim in SHAPE[: draw(st.integers(0, 2))]:
        if draw(st.booleans()):
            out.append(draw(st.integers(-dim, dim - 1)))
        else:
            bound = st.one_of(st.none(), st.integers(-dim - 2, dim + 2))
            step = draw(st.sampled_from([None, 1, 2, 3, -1, -3]))
            out.append(slice(draw(bound), draw(bound), step))
    return tuple(out)


@settings(max_examples=200, deadline=None)
@given(regions(), st.integers(0, 2**35 - 1), st.booleans())
def test_elements_match_numpy(region, bits, use_mask):
    full = normalise(region, SHAPE, "x")
    grid = np.arange(35).reshape(SHAPE)
    expected = grid[region]
    assert region_shape(full, SHAPE) == np.shape(expected)
    mask = None
    if use_mask:
        size = int(np.size(expected))
        mask = (np.array([(bits >> i) & 1 for i in range(size)], bool)).reshape(np.shape(expected))
        expected = expected[mask]
    flat = flat_elements(full, SHAPE, mask)
    assert flat.tolist() == np.ravel(expected).tolist()
    for position, value in enumerate(flat.tolist()):
        assert element_at(full, SHAPE, mask, position) == np.unravel_index(value, SHAPE)


def test_format_region():
    assert (
        format_region((slice(0, 8), slice(None), slice(None, None, -2), 3)) == "[0:8, :, ::-2, 3]"
    )
    assert format_region(()) == "[...]"
    assert normalise(None, (2, 3), "x") == (slice(None), slice(None))
    assert normalise(1, (2, 3), "x") == (1, slice(None))


def test_format_region_drops_unit_steps_only():
    assert format_region((slice(0, 8, 1), slice(0, 128, 1))) == "[0:8, 0:128]"
    assert format_region((slice(0, 8, 2), slice(1, None, 3))) == "[0:8:2, 1::3]"
