"""Fast paths (``numpy_rules/fast_paths.py``) give exactly the bits of the rules they
stand for, on operands of every class (subnormals of both signs, signed zeros, tiny
normals, infinities, NaNs), inside XLA's FP environment (where a launch runs) and outside
it; and where their preconditions fail they decline (None) so that the rule runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from palladium.interpret.eval.program import compile_jaxpr
from palladium.interpret.numpy_rules import NUMPY_RULES, PREFLUSHED_RULES, flush
from palladium.interpret.numpy_rules.common import (
    ERRORS_IGNORED,
    HARDWARE_FLUSHES,
    hardware_flushes,
)
from palladium.interpret.numpy_rules.fast_paths import FAST_PATHS, fast_path

from .test_hardware_flushes import _operands

F32 = np.float32
_X, _Y = _operands(3, (16, 32)), _operands(4, (16, 32))
_V = _operands(5, (16,))
_B = _operands(6, (2, 16, 32))

# (name, function, operands): each function's last equation is the one tested.
CASES = [
    ("add", lambda a, b: a + b, (_X, _Y)),
    ("sub", lambda a, b: a - b, (_X, _Y)),
    ("mul", lambda a, b: a * b, (_X, _Y)),
    ("div", lambda a, b: a / b, (_X, _Y)),
    ("div by a 0-d", lambda a: a / F32(3.0), (_X,)),
    ("div of a 0-d", lambda a: F32(1.0) / a, (_X,)),
    ("max", jnp.maximum, (_X, _Y)),
    ("min", jnp.minimum, (_X, _Y)),
    ("exp", jnp.exp, (_X,)),
    ("sqrt", jnp.sqrt, (_X,)),
    ("rsqrt", lax.rsqrt, (_X,)),
    ("sign", jnp.sign, (_X,)),
    ("floor", jnp.floor, (_X,)),
    ("tile", lambda a: jnp.tile(a, (1, 1)), (_X,)),
    ("broadcast", lambda v: lax.broadcast_in_dim(v, (16, 32), (0,)), (_V,)),
    ("broadcast of a 0-d", lambda: lax.broadcast_in_dim(F32(-np.inf), (16, 32), ()), ()),
    ("dot nt", lambda a, b: lax.dot_general(a, b, (((1,), (1,)), ((), ())),
                                           preferred_element_type=F32), (_X, _Y)),
    ("dot nn", lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ()))), (_X, _Y.T.copy())),
    ("dot batched", lambda a, b: lax.dot_general(a, b, (((2,), (2,)), ((0,), (0,)))), (_B, _B)),
]


def _last_equation(fn, args):
    closed = jax.make_jaxpr(fn)(*args)
    return closed.jaxpr.eqns[-1], closed


def _operand_values(eqn, closed, args):
    env = dict(zip(closed.jaxpr.invars, args))
    return [np.asarray(a.val, a.aval.dtype) if not hasattr(a, "count") and hasattr(a, "val")
            else env[a] for a in eqn.invars]


def _compare(flushed: bool) -> list[tuple[str, str]]:
    """Every case's fast path against its rule: (name, "same" / "declined" / "differs" /
    "none")."""
    out = []
    for name, fn, args in CASES:
        if flushed:
            args = tuple(flush(a) for a in args)
        eqn, closed = _last_equation(fn, args)
        invals = _operand_values(eqn, closed, args)
        fast = fast_path(eqn, flushed)
        if fast is None:  # none made for this equation
            out.append((name, "none"))
            continue
        table = PREFLUSHED_RULES if flushed and eqn.primitive in PREFLUSHED_RULES else NUMPY_RULES
        got = fast(invals)
        if got is None:
            out.append((name, "declined"))
            continue
        want = np.ascontiguousarray(table[eqn.primitive](*invals, **eqn.params))
        got = np.ascontiguousarray(got[0])
        same = (got.dtype == want.dtype and got.shape == want.shape
                and np.array_equal(got.view(np.uint8), want.view(np.uint8)))
        out.append((name, "same" if same else "differs"))
    return out


def _compare_in_this_environment(flushed: bool) -> list[tuple[str, str]]:
    hw, quiet = HARDWARE_FLUSHES.set(hardware_flushes()), ERRORS_IGNORED.set(True)
    try:
        with np.errstate(all="ignore"):
            return _compare(flushed)
    finally:
        HARDWARE_FLUSHES.reset(hw)
        ERRORS_IGNORED.reset(quiet)


IEEE_CASES = {"add", "sub", "mul", "div", "div of a 0-d"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flushed", [False, True])
def test_fast_paths_give_the_rules_bits_inside_xla(flushed):
    """Inside a host callback (XLA's environment: DAZ and FTZ where XLA sets them)."""
    results = []

    def check():
        results.extend(_compare_in_this_environment(flushed))
        return np.int32(0)

    jax.block_until_ready(jax.jit(lambda: jax.pure_callback(
        check, jax.ShapeDtypeStruct((), np.int32)))())
    assert [r for r in results if r[1] == "differs"] == []
    # every case ran its fast path, except where it defers to the rule by design: the
    # division by a 0-d (XLA's reciprocal rewrite) has none, IEEE arithmetic declines
    # where the environment does not flush
    assert {name for name, verdict in results if verdict == "none"} == {"div by a 0-d"}
    declined = {name for name, verdict in results if verdict == "declined"}
    assert declined == (set() if hardware_flushes_in_xla() else IEEE_CASES)


def hardware_flushes_in_xla() -> bool:
    return bool(jax.jit(lambda: jax.pure_callback(
        lambda: np.bool_(hardware_flushes()), jax.ShapeDtypeStruct((), np.bool_)))())


@pytest.mark.parametrize("flushed", [False, True])
def test_fast_paths_outside_xla_decline_ieee_arithmetic(flushed):
    """On the main thread (no flushing), IEEE arithmetic's fast paths decline: its rule
    flushes in software; the other fast paths flush as their rules do."""
    results = _compare_in_this_environment(flushed)
    assert [r for r in results if r[1] == "differs"] == []
    declined = {name for name, verdict in results if verdict == "declined"}
    assert declined == IEEE_CASES


def test_fast_paths_decline_operands_they_were_not_made_for():
    eqn, _ = _last_equation(lambda a, b: a + b, (_X, _Y))
    fast = fast_path(eqn)
    hw, quiet = HARDWARE_FLUSHES.set(True), ERRORS_IGNORED.set(True)
    try:
        assert fast([_X, _Y]) is not None
        assert fast([_X.astype(np.float64), _Y]) is None
        assert fast([jnp.asarray(_X), _Y]) is None
    finally:
        HARDWARE_FLUSHES.reset(hw)
        ERRORS_IGNORED.reset(quiet)
    # no fast path for operands of other dtypes, for parameters it does not know, or for
    # tile by other than ones
    assert fast_path(_last_equation(lambda a, b: a + b, (_X.astype(jnp.bfloat16),) * 2)[0]) is None
    assert fast_path(_last_equation(lambda a: jnp.tile(a, (2, 1)), (_X,))[0]) is None
    assert fast_path(_last_equation(lambda a: lax.exp(a, accuracy=lax.Tolerance(atol=1e-3)),
                                    (_X,))[0]) is None


def test_every_fast_path_is_tested():
    tested = {_last_equation(fn, args)[0].primitive for _, fn, args in CASES}
    assert set(FAST_PATHS) - tested <= {lax.ceil_p, lax.tanh_p, lax.sin_p, lax.cos_p}


def test_a_program_runs_the_fast_path_and_the_rule_alike():
    """The step a program compiles takes the fast path only when the evaluator would run
    the numpy rule: never under ``skip_floating_point_ops``."""
    eqn_fn = lambda a, b: jnp.exp(a) * b  # noqa: E731
    closed = jax.make_jaxpr(eqn_fn)(_X, _Y)
    prog = compile_jaxpr(closed.jaxpr, segments=False)

    class Ev:
        skip_floating_point_ops = False
        deterministic_dot = False

    ev = Ev()
    with np.errstate(all="ignore"):
        exp_rule, mul_rule = (st.rule for st in prog.steps)
        e = exp_rule(ev, prog.steps[0].eqn, [_X])[0]
        assert np.array_equal(e.view(np.uint32), NUMPY_RULES[lax.exp_p](_X, accuracy=None).view(np.uint32))
        ev.skip_floating_point_ops = True
        skipped = mul_rule(ev, prog.steps[1].eqn, [e, _Y])[0]
    assert np.isinf(skipped).all() and skipped.shape == (16, 32)
