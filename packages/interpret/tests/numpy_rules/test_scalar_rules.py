"""The scalar index rules (``numpy_rules/scalars.py``) against the general rules and
``bind``: the same values and dtypes on 0-d int32 and bool operands, overflow included."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

from palladium.interpret.eval.program import _compute_rule
from palladium.interpret.numpy_rules.scalars import scalar_rule

I32 = st.integers(np.iinfo(np.int32).min, np.iinfo(np.int32).max)


class _Ev:
    skip_floating_point_ops = False
    deterministic_dot = False


def _eqn(fn, *args):
    (eqn,) = jax.make_jaxpr(fn)(*args).jaxpr.eqns
    return eqn


_INT_BINARY = [lax.add, lax.sub, lax.mul, lax.max, lax.min, lax.eq, lax.ne, lax.lt, lax.le,
               lax.gt, lax.ge, lax.bitwise_and, lax.bitwise_or, lax.bitwise_xor]
_BOOL_BINARY = [lax.bitwise_and, lax.bitwise_or, lax.bitwise_xor, lax.eq, lax.ne, lax.max,
                lax.min]


def _check(eqn, args):
    fast = scalar_rule(eqn, lambda ev, e, invals: pytest.fail("general rule used"))
    assert fast is not None, eqn
    (got,) = fast(_Ev(), eqn, args)
    (general,) = _compute_rule(eqn)(_Ev(), eqn, args)
    bound = np.asarray(eqn.primitive.bind(*args, **eqn.params))
    assert type(got) is np.ndarray and got.shape == ()
    assert got.dtype == general.dtype == bound.dtype
    assert got == general == bound


@settings(max_examples=60, deadline=None)
@given(a=I32, b=I32)
def test_int32_binary_ops_match_the_general_rules_and_bind(a, b):
    x, y = np.asarray(np.int32(a)), np.asarray(np.int32(b))
    for fn in _INT_BINARY:
        _check(_eqn(fn, x, y), [x, y])


@pytest.mark.parametrize("a", [False, True])
@pytest.mark.parametrize("b", [False, True])
def test_bool_binary_ops_and_not_match(a, b):
    x, y = np.asarray(a), np.asarray(b)
    for fn in _BOOL_BINARY:
        _check(_eqn(fn, x, y), [x, y])
    _check(_eqn(lax.bitwise_not, x), [x])


@settings(max_examples=40, deadline=None)
@given(a=I32, c=st.booleans(), b=I32)
def test_not_convert_and_select_match(a, c, b):
    x, y, w = np.asarray(np.int32(a)), np.asarray(np.int32(b)), np.asarray(c)
    _check(_eqn(lax.bitwise_not, x), [x])
    _check(_eqn(lambda v: lax.convert_element_type(v, jnp.bool_), x), [x])
    _check(_eqn(lambda v: lax.convert_element_type(v, jnp.int32), w), [w])
    _check(_eqn(lambda p, u, v: lax.select_n(p, u, v), w, x, y), [w, x, y])


def test_other_dtypes_and_shapes_keep_the_general_rules():
    f = np.asarray(np.float32(1.5))
    assert scalar_rule(_eqn(lax.add, f, f), None) is None
    v = np.ones(3, np.int32)
    assert scalar_rule(_eqn(lax.add, v, v), None) is None
    i16 = np.asarray(np.int16(3))
    assert scalar_rule(_eqn(lax.add, i16, i16), None) is None


def test_an_operand_of_another_dtype_than_declared_goes_to_the_general_rule():
    x = np.asarray(np.int32(3))
    eqn = _eqn(lax.add, x, x)
    seen = []
    fast = scalar_rule(eqn, lambda ev, e, invals: seen.append(invals) or ["general"])
    assert fast(_Ev(), eqn, [np.asarray(np.int64(3)), x]) == ["general"] and len(seen) == 1


@settings(max_examples=60, deadline=None)
@given(a=I32, b=I32)
def test_int32_rem_matches_the_general_rule_and_bind(a, b):
    eqn = _eqn(lax.rem, np.asarray(np.int32(a)), np.asarray(np.int32(b)))
    for u, v in ((a, b), (a, 0), (np.iinfo(np.int32).min, -1), (-7, 3), (7, -3), (-7, -3)):
        x, y = np.asarray(np.int32(u)), np.asarray(np.int32(v))
        if v == 0:  # bind's own x % 0 is platform-defined: the general rule (XLA's x)
            fast = scalar_rule(eqn, None)
            assert fast is not None
            (got,) = fast(_Ev(), eqn, [x, y])
            (general,) = _compute_rule(eqn)(_Ev(), eqn, [x, y])
            assert got.dtype == general.dtype and got == general == x
        else:
            _check(eqn, [x, y])


_MIN, _MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)


@pytest.mark.parametrize("fn", [lax.add, lax.sub, lax.mul])
@pytest.mark.parametrize("a, b", [(_MAX, 1), (_MIN, -1), (_MIN, _MIN), (_MAX, _MAX), (_MIN, _MAX),
                                  (_MAX, -1), (_MIN, 1), (-1, -1), (65536, 65536), (0, _MIN)])
def test_int32_add_sub_mul_wrap_at_the_edges_as_the_general_rules_and_bind(fn, a, b):
    x, y = np.asarray(np.int32(a)), np.asarray(np.int32(b))
    _check(_eqn(fn, x, y), [x, y])


def test_int32_rem_of_operands_of_another_dtype_runs_the_general_rule():
    x = np.asarray(np.int32(7))
    eqn = _eqn(lax.rem, x, x)
    seen = []
    fast = scalar_rule(eqn, lambda ev, e, invals: seen.append(invals) or ["general"])
    assert fast(_Ev(), eqn, [np.asarray(np.int64(7)), np.asarray(np.int64(3))]) == ["general"]
    assert len(seen) == 1
    (got,) = fast(_Ev(), eqn, [np.asarray(np.int32(-7)), np.asarray(np.int32(3))])
    assert got.dtype == np.int32 and got == -1
