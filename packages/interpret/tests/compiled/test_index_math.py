"""``compiled/index_math.py``: index arithmetic that stays static where it can. Every
function must give what int32 arithmetic gives, whichever operands are traced, and
trace no equation when none is."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from palladium.interpret.compiled import index_math as im

pytestmark = pytest.mark.timeout(300)

_small = st.integers(-1000, 1000)


def _run(fn, values, traced):
    """``fn`` of ``values``, the ones flagged in ``traced`` passed as jit arguments."""
    dyn = [np.bool_(v) if isinstance(v, bool) else np.int32(v)
           for v, t in zip(values, traced) if t]

    def f(*args):
        it = iter(args)
        return fn(*[next(it) if t else v for v, t in zip(values, traced)])

    if not any(traced):
        out = f()
        assert im.is_static(out)  # nothing traced: the answer is a Python value
        return out
    return np.asarray(jax.jit(f)(*dyn)).item()


@settings(max_examples=60, deadline=None)
@given(a=_small, b=_small, traced=st.tuples(st.booleans(), st.booleans()))
def test_arithmetic_and_comparison_as_int32(a, b, traced):
    assert _run(im.add, [a, b], traced) == a + b
    assert _run(im.mul, [a, b], traced) == a * b
    assert _run(im.less, [a, b], traced) == (a < b)
    assert _run(im.at_most, [a, b], traced) == (a <= b)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.booleans(), min_size=1, max_size=4),
       traced=st.lists(st.booleans(), min_size=4, max_size=4))
def test_conjunction_disjunction_negation(values, traced):
    traced = traced[:len(values)]
    assert _run(im.all_of, values, traced) == all(values)
    assert _run(im.any_of, values, traced) == any(values)
    assert _run(lambda c: im.negate(c), values[:1], traced[:1]) == (not values[0])


def test_static_identities_trace_nothing():
    def f(x):
        y = im.add(im.mul(x, 1), 0)
        assert y is x  # no equation for * 1 or + 0
        return im.all_of(True, im.less(x, 3), im.negate(im.less(5, 2)))

    jaxpr = jax.make_jaxpr(f)(np.int32(1))
    assert [e.primitive.name for e in jaxpr.eqns] == ["lt"]
    assert im.all_of(True, False, object()) is False  # a static False decides
    assert im.any_of(False, True, object()) is True


def test_indices_become_int32():
    def f(x):
        return im.add(x, 2)

    out = jax.jit(f)(np.int16(5))
    assert out.dtype == np.int32 and int(out) == 7
    assert im.traced_index(3).dtype == np.int32
    assert im.traced_bool(True).dtype == np.bool_


@settings(max_examples=80, deadline=None)
@given(start=st.one_of(_small, st.integers(-(2**31), 2**31 - 1)),
       extent=st.integers(1, 4096), n=st.integers(1, 1 << 20), step=st.integers(1, 64),
       traced=st.booleans())
def test_fits_is_exact_where_int32_arithmetic_would_wrap(start, extent, n, step, traced):
    """``fits`` answers what exact integers answer, for starts near 2**31 as well."""
    expected = start >= 0 and start * step + extent <= n
    assert _run(lambda s: im.fits(s, extent, n, step), [start], [traced]) == expected
