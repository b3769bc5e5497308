"""Skipping the flush of operands known to hold no subnormals changes no bits.

The evaluator marks f32 values produced by ``FLUSHING`` rules (and moved by
``PRESERVING`` ones) and runs their consumers' ``PREFLUSHED_RULES`` variants, which skip
the operand flush. These tests check the three facts that makes exact: the variants
agree with the plain rules on subnormal-free operands, the flushing rules leave no
subnormals, and evaluated jaxprs mixing marked and unmarked values (subnormal inputs,
subnormal literals) give ``bind``'s bits.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from palladium.interpret import InterpretParams
from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.evaluator import CoreEvaluator, ProgramCache
from palladium.interpret.numpy_rules import (
    FLUSHING,
    NUMPY_RULES,
    PREFLUSHED_RULES,
    has_subnormal_f32,
)
from palladium.interpret.run.execution_plan import plan_launch

jax.config.update("jax_platforms", "cpu")

TINY = np.finfo(np.float32).tiny
SPECIAL = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, TINY, -TINY, 1.0, -3.5, 3e38, 88.0,
                    -104.0, 1e-20, -1e-20], np.float32)


def _operand(rng: np.random.Generator, shape=(8, 16)) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32) * rng.choice([1e-19, 1.0, 1e19], shape)
    x = x.astype(np.float32)
    x.flat[: SPECIAL.size] = SPECIAL[: x.size]
    return rng.permutation(x.ravel()).reshape(shape)


def _params(prim) -> dict:
    if prim in (lax.reduce_max_p, lax.reduce_min_p, lax.reduce_sum_p, lax.reduce_prod_p):
        return {"axes": (1,)}
    if prim is lax.dot_general_p:
        return {"dimension_numbers": (((1,), (0,)), ((), ())), "preferred_element_type": None}
    return {}


def _arity(prim) -> int:
    return 1 if prim in (lax.reduce_max_p, lax.reduce_min_p, lax.reduce_sum_p,
                         lax.reduce_prod_p) or prim.name in {
        "sign", "sqrt", "rsqrt", "exp", "log1p", "expm1", "tanh", "sin", "cos", "floor",
        "ceil", "square"} else 2


def _bits_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype == np.float32:
        nan = np.isnan(a)
        np.testing.assert_array_equal(nan, np.isnan(b))
        np.testing.assert_array_equal(a.view(np.int32)[~nan], b.view(np.int32)[~nan])
    else:
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("prim", sorted(PREFLUSHED_RULES, key=str), ids=str)
def test_preflushed_variant_matches_the_rule_on_flushed_operands(prim):
    rng = np.random.default_rng(0)
    for _ in range(5):
        if prim is lax.dot_general_p:
            args = [_operand(rng, (8, 16)), _operand(rng, (16, 4))]
        else:
            args = [_operand(rng) for _ in range(_arity(prim))]
        assert not any(has_subnormal_f32(a) for a in args)
        params = _params(prim)
        _bits_equal(np.asarray(PREFLUSHED_RULES[prim](*args, **params)),
                    np.asarray(NUMPY_RULES[prim](*args, **params)))


@pytest.mark.parametrize("prim", sorted(FLUSHING, key=str), ids=str)
def test_flushing_rules_leave_no_subnormals(prim):
    rng = np.random.default_rng(1)
    sub = np.float32(1e-40)
    for _ in range(5):
        if prim is lax.dot_general_p:
            args = [_operand(rng, (8, 16)) * sub, _operand(rng, (16, 4))]
        else:
            args = [(_operand(rng) * sub).astype(np.float32) for _ in range(_arity(prim))]
        assert any(has_subnormal_f32(a) for a in args)
        out = np.asarray(NUMPY_RULES[prim](*args, **_params(prim)))
        assert out.dtype == np.float32
        assert not has_subnormal_f32(out)


def _evaluate(fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    # equation by equation (the rules under test), no compiled segment
    params = InterpretParams(compile_segments=False)
    launch = types.SimpleNamespace(programs=ProgramCache(), kernel=None, params=params,
                                   plan=plan_launch(None, params, 1),
                                   kernel_name="test", memory=None)
    ev = CoreEvaluator(launch, (0, 0))
    return ev.eval_jaxpr(closed.jaxpr, list(closed.consts), list(args))


def _chain(x, y):
    s = jnp.dot(x, y)  # flushing: everything downstream of it is marked
    m = jnp.max(s, axis=1, keepdims=True)
    e = jnp.exp(s - m)
    t = jnp.maximum(e, x[:, :4])  # x is unmarked: its flush stays
    u = t * jnp.float32(1e-40) + jnp.float32(2e-39)  # subnormal literals stay unmarked
    r = jnp.where(u > 0, u, -u) / jnp.sum(e, axis=1, keepdims=True)
    return r, jnp.min(jnp.transpose(r[:4]) * y[:4, :4], axis=0) == 0


def test_evaluator_with_marked_and_unmarked_values_gives_binds_bits():
    rng = np.random.default_rng(2)
    x = _operand(rng, (8, 16))
    x.flat[::3] = np.float32(3e-40)  # subnormal operands, unmarked
    y = _operand(rng, (16, 4)) * np.float32(1e-20)
    y = y.astype(np.float32)
    got = _evaluate(_chain, x, y)
    want = jax.jit(_chain)(x, y)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _bits_equal(np.asarray(g), np.asarray(w))


def test_literal_with_a_subnormal_is_not_marked():
    x = np.full((4,), 1e-30, np.float32)
    closed = jax.make_jaxpr(lambda a: a * jnp.float32(1e-10) + jnp.float32(1e-41))(x)
    lits = [a for e in closed.jaxpr.eqns for a in e.invars if isinstance(a, jc.Literal)]
    assert any(has_subnormal_f32(np.asarray(lit.val, np.float32)) for lit in lits)
    got = _evaluate(lambda a: a * jnp.float32(1e-10) + jnp.float32(1e-41), x)[0]
    _bits_equal(np.asarray(got), np.asarray(jax.jit(
        lambda a: a * jnp.float32(1e-10) + jnp.float32(1e-41))(x)))
