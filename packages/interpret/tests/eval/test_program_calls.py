"""Calls and conditionals in a compiled program: a call's body (``jit``, ``closed_call``,
custom derivatives) is inlined into the calling program, a ``cond`` branch without
equations is answered from its operands. The results, the equations an observer sees
and the compiled segments stay what they were when both ran as programs of their own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from palladium.interpret import InterpretParams
from palladium.interpret.eval import program
from palladium.interpret.eval.program import compile_jaxpr
from palladium.interpret.eval.rules_control import _cond
from palladium.interpret.eval.segments import Segment


@jax.jit
def _scaled(a, b):
    return jnp.where(a == 0.0, 1.0, a) * b + 1.0


def _kernel(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    tiny = jnp.float32(1e-42)  # a subnormal: the second call's operand is not flushed
    acc_ref[...] += _scaled(x_ref[...], y_ref[...]) + _scaled(y_ref[...] * tiny, x_ref[...])

    @pl.when(pl.program_id(0) == pl.num_programs(0) - 1)
    def _():
        o_ref[...] = acc_ref[...]


def _call(interpret):
    from jax.experimental.pallas import tpu as pltpu
    return pl.pallas_call(
        _kernel, grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))] * 2,
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
        interpret=interpret)


@pytest.mark.timeout(120)
def test_a_kernel_with_calls_and_untaken_branches_gives_the_bits_of_programs_apart(monkeypatch):
    """The same launch with every call and branch run as a program of its own (and no
    fast path, ``numpy_rules/fast_paths.py``) gives the same bits; both are jax's
    results within rounding (XLA may fuse a multiply and an add)."""
    from palladium.interpret.eval import program, rules_control

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 128)).astype(np.float32)
    x[::3] = 0.0
    y = rng.standard_normal((32, 128)).astype(np.float32)
    got = np.asarray(_call(InterpretParams(check_lowering=False))(x, y))
    monkeypatch.setattr(program, "_inlined_body", lambda eqn, segments: None)
    monkeypatch.setattr(program, "fast_path", lambda eqn, flushed=False: None)
    monkeypatch.setattr(rules_control, "_passthrough", lambda branch: None)
    apart = np.asarray(jax.jit(_call(InterpretParams(check_lowering=False)))(x, y))
    np.testing.assert_array_equal(got.view(np.uint32), apart.view(np.uint32))
    np.testing.assert_allclose(got, np.asarray(_call(True)(x, y)), rtol=1e-6, atol=1e-6)


def _observed(eqns):
    """The equations an observer saw of programs run apart: a call, then its body."""
    out = []
    for e in eqns:
        out.append(str(e.primitive))
        if str(e.primitive) == "jit":
            out += _observed(e.params["jaxpr"].jaxpr.eqns)
    return out


def _program_of(fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    return closed, compile_jaxpr(closed.jaxpr, segments=True)


def test_a_calls_body_runs_inlined_and_is_observed_as_before():
    a = np.ones((8, 128), np.float32)
    closed, prog = _program_of(lambda a, b: _scaled(a, b) - 2.0, a, a)
    kinds = [str(st.eqn.primitive) for st in prog.steps]
    # an observer of every equation sees each call, then its body (``jnp.where`` is a
    # call within the call), then the rest: what it saw of programs run apart
    assert kinds == _observed(closed.jaxpr.eqns)
    assert kinds[0] == "jit" and kinds.count("jit") == 2 and kinds[-1] == "sub"
    calls = [st.observe_only for st in prog.steps]
    assert calls == [k == "jit" for k in kinds]
    # the evaluator's loop runs only the bodies' steps
    assert len(prog.fast) == len(kinds) - 2


def test_a_call_whose_body_has_a_compiled_segment_stays_a_call():
    """Inlined, the body's segment would be lost (its equations run one by one): the
    results of launches that run segments compiled would change."""

    @jax.jit
    def long_body(a):
        for _ in range(12):
            a = a * 1.5 + 1.0
        return a

    a = np.ones((8, 128), np.float32)
    call = jax.make_jaxpr(lambda a: long_body(a) - 1.0)(a).jaxpr.eqns[0]
    assert program._inlined_body(call, segments=True) is None
    assert any(isinstance(st.rule, Segment)
               for st in compile_jaxpr(call.params["jaxpr"].jaxpr).steps)
    # where the program makes no segment (a segment's own equations, run one by one) it is
    assert program._inlined_body(call, segments=False) is call.params["jaxpr"]
    short = jax.make_jaxpr(_scaled)(a, a).jaxpr.eqns[0]
    assert program._inlined_body(short, segments=True) is short.params["jaxpr"]


def test_an_empty_branch_answers_from_its_operands():
    def f(i, a, b):
        return jax.lax.switch(i, [lambda a, b: (b, a, jnp.float32(2.0)),
                                  lambda a, b: (a + b, a, jnp.float32(3.0))], a, b)

    a, b = np.asarray(1.5, np.float32), np.asarray(4.0, np.float32)
    eqn = next(e for e in jax.make_jaxpr(f)(0, a, b).jaxpr.eqns if str(e.primitive) == "cond")
    branches = eqn.params["branches"]
    assert not branches[0].jaxpr.eqns and branches[1].jaxpr.eqns
    run = _cond(eqn, frozenset())
    evaluated = []

    class Ev:
        def eval_closed(self, closed, args):
            evaluated.append(closed)
            return jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *args)

    for index, branch in ((0, 0), (1, 1), (7, 1), (-3, 0)):  # lax.switch clamps
        evaluated.clear()
        operands = [np.asarray(a), np.asarray(b)][:len(eqn.invars) - 1]
        outs = run(Ev(), eqn, [np.asarray(index, np.int32), *operands])
        want = jax.core.eval_jaxpr(branches[branch].jaxpr, branches[branch].consts, *operands)
        assert [np.asarray(o).tolist() for o in outs] == [np.asarray(w).tolist() for w in want]
        assert [np.asarray(o).dtype for o in outs] == [np.asarray(w).dtype for w in want]
        assert evaluated == ([] if branch == 0 else [branches[1]])


def test_a_constant_is_read_in_its_variables_dtype():
    """A literal or an inlined body's constant given as a Python scalar is an f32
    subnormal where its variable is f32 (1e-40): its consumers must flush it."""
    assert not program.is_flushed_value(1e-40, np.float32)
    assert program.is_flushed_value(1e-30, np.float32)
    assert program.is_flushed_value(np.asarray(1e-40, np.float64))  # not f32: not concerned
    assert not program.is_flushed_value(np.full((2, 2), 1e-40, np.float32))
