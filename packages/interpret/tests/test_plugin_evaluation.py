"""Plugin rules of form "evaluate": the plugin declares a jaxpr and its arguments (refs with
transforms among them), the interpreter evaluates it with its own rules.

The plugin here is a tiny one defined in the test: ``on_slot_p(buf, slot, body=...)``
runs ``body`` (a closed jaxpr of one ref) on ``buf.at[slot]`` and returns its results,
as palladium-pipeline's body primitive runs the pipeline body on a buffer slot.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.extend.core import Primitive

import palladium.interpret as pi
from palladium.interpret import _jax_compat as jc

pytestmark = pytest.mark.timeout(180)

SLOTS, ROWS, COLS = 3, 8, 128
SLOT = jc.AbstractRef(jc.ShapedArray((ROWS, COLS), jnp.float32))
X = np.arange(SLOTS * ROWS * COLS, dtype=np.float32).reshape(SLOTS, ROWS, COLS)

on_slot_p = Primitive("palladium_test_on_slot")
on_slot_p.multiple_results = True
on_slot_p.def_abstract_eval(lambda buf, slot, *, body: body.out_avals)


def _slot_view(buf, slot):
    """``buf.at[slot]`` for operands the plugin does not look into (a jax TransformedRef;
    the interpreter calls the rule once per equation, with the equation's variables
    standing for the operands)."""
    indexer = jc.NDIndexer((slot, jc.Slice(0, ROWS), jc.Slice(0, COLS)), (SLOTS, ROWS, COLS),
                           (), validate=False)
    return jc.TransformedRef(buf, (indexer,))


def _declare(buf, slot, *, body):
    return body, [_slot_view(buf, slot)]


@pytest.fixture(autouse=True)
def _on_slot_rule():
    """Registered for every test: a test of ``process_state.reset()`` in the same worker
    puts the rule table back to what the import left, without this module's rule."""
    pi.register_interpret_rule(on_slot_p, _declare, form="evaluate")


def _on_slot(body_fn):
    """``body_fn`` (of one (8, 128) ref, returning one f32 scalar) as a closed jaxpr."""
    return jax.make_jaxpr(lambda r: [body_fn(r)])(SLOT)


def _run(body_fn, slot, params=None):
    """A kernel: X into a VMEM scratch of 3 slots, ``body_fn`` on slot ``slot`` through
    the plugin, then the scratch and the body's result out."""
    body = _on_slot(body_fn)

    def kernel(slot_ref, x_ref, o_ref, r_ref, buf):
        buf[...] = x_ref[...]
        (r_ref[0],) = on_slot_p.bind(buf, slot_ref[0], body=body)
        o_ref[...] = buf[...]

    out, result = pl.pallas_call(
        kernel,
        out_shape=[jax.ShapeDtypeStruct(X.shape, X.dtype),
                   jax.ShapeDtypeStruct((1,), jnp.float32)],
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec()],
        out_specs=[pl.BlockSpec(), pl.BlockSpec(memory_space=pltpu.SMEM)],
        scratch_shapes=[pltpu.VMEM(X.shape, jnp.float32)],
        interpret=params or pi.InterpretParams(detect_races=True, compile_check="off"),
    )(jnp.array([slot], jnp.int32), X)
    return np.asarray(out), float(result[0])


def test_loads_and_stores_go_through_the_slot():
    def body(r):
        r[2:4, :] = r[0:2, :] * 10.0
        r[...] += 1.0
        return r[5, 7]

    with pi.errors_as_raised():
        out, result = _run(body, 1)
    expected = X.copy()
    expected[1, 2:4] = X[1, 0:2] * 10.0
    expected[1] += 1.0
    np.testing.assert_array_equal(out, expected)
    assert result == expected[1, 5, 7]


def test_bitcast_and_reshape_of_the_slot():
    def body(r):
        bits = r.bitcast(jnp.int32)
        bits[0:1, :] = jnp.full((1, COLS), 0x3F800000, jnp.int32)  # 1.0f
        flat = r.reshape(ROWS * COLS // 128, 128)
        return flat[0, 3] + r[1, 0]

    with pi.errors_as_raised():
        out, result = _run(body, 2)
    expected = X.copy()
    expected[2, 0] = 1.0
    np.testing.assert_array_equal(out, expected)
    assert result == 1.0 + X[2, 1, 0]


@pytest.mark.parametrize("loop", ["scan", "while"])
def test_control_flow_over_the_slot_ref(loop):
    def body(r):
        @pl.when(r[0, 0] >= 0)
        def _():
            r[...] = -r[...]

        upper = ROWS if loop == "scan" else (r[0, 0] * 0).astype(jnp.int32) + ROWS

        def row(i, c):
            r[pl.ds(i, 1), 0:1] = jnp.full((1, 1), c)
            return c + 1.0

        return jax.lax.fori_loop(0, upper, row, jnp.float32(5.0))

    with pi.errors_as_raised():
        out, result = _run(body, 0)
    expected = X.copy()
    expected[0] = -X[0]
    expected[0, :, 0] = 5.0 + np.arange(ROWS)
    np.testing.assert_array_equal(out, expected)
    assert result == 5.0 + ROWS


def test_an_error_in_the_evaluated_jaxpr_names_the_users_line():
    def body(r):
        start = (r[0, 0] * 0).astype(jnp.int32) + 4
        return jnp.sum(r[pl.ds(start, ROWS), :])  # rows 4:12 of 8: out of bounds

    line = body.__code__.co_firstlineno + 2
    with pytest.raises(pi.OutOfBoundsError) as info, pi.errors_as_raised():
        _run(body, 1)
    message = str(info.value)
    assert f"test_plugin_evaluation.py:{line}" in message, message


def test_race_through_the_evaluated_jaxpr_is_reported():
    """The body reads the slot while a DMA into it is in flight: the race detector sees
    the body's read on the buffer the DMA writes."""
    def read(r):
        return r[0, 0]

    body = _on_slot(read)

    def kernel(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm, buf, sem)
        copy.start()
        (o_ref[0],) = on_slot_p.bind(buf, jnp.int32(1), body=body)
        copy.wait()

    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((1,), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
        scratch_shapes=[pltpu.VMEM(X.shape, jnp.float32), pltpu.SemaphoreType.DMA],
        interpret=pi.InterpretParams(detect_races=True, dma_execution_mode="eager"),
    )
    with pytest.raises(pi.DataRaceError) as info, pi.errors_as_raised():
        call(X)
    message = str(info.value)
    assert f"test_plugin_evaluation.py:{read.__code__.co_firstlineno + 1}" in message, message


def test_the_rule_declares_once_per_equation_with_its_variables():
    """The declaration is made once (the equation's variables standing for the operands,
    never their values) and serves every run of the equation: here 4 slots in a loop."""
    count_p = Primitive("palladium_test_counted_slot")
    count_p.multiple_results = True
    count_p.def_abstract_eval(lambda buf, slot, *, body: body.out_avals)
    seen = []

    def declare(buf, slot, *, body):
        seen.append((type(buf).__name__, type(slot).__name__))
        return body, [_slot_view(buf, slot)]

    pi.register_interpret_rule(count_p, declare, form="evaluate")
    body = _on_slot(lambda r: r[0, 0])

    def kernel(x_ref, o_ref, buf):
        buf[...] = x_ref[...]

        def step(i, acc):
            (v,) = count_p.bind(buf, i % SLOTS, body=body)
            return acc + v

        o_ref[0] = jax.lax.fori_loop(0, 4, step, jnp.float32(0.0))

    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.float32),
        out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
        scratch_shapes=[pltpu.VMEM(X.shape, jnp.float32)],
        interpret=pi.InterpretParams(compile_check="off"))(X)
    assert float(out[0]) == X[0, 0, 0] + X[1, 0, 0] + X[2, 0, 0] + X[0, 0, 0]
    assert seen == [("Var", "Var")]


def test_a_malformed_declaration_names_the_primitive():
    bad_p = Primitive("palladium_test_bad_declaration")
    bad_p.multiple_results = True
    bad_p.def_abstract_eval(lambda buf: [jc.ShapedArray((), jnp.float32)])
    pi.register_interpret_rule(bad_p, lambda buf: "not a jaxpr", form="evaluate")

    def kernel(o_ref, buf):
        (value,) = bad_p.bind(buf)
        o_ref[...] = jnp.full(o_ref.shape, value)

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32),
        scratch_shapes=[pltpu.VMEM((ROWS, COLS), jnp.float32)],
        interpret=pi.InterpretParams())
    with pytest.raises(pi.KernelError, match="palladium_test_bad_declaration.*str"), \
            pi.errors_as_raised():
        call()


def test_an_unknown_form_is_refused():
    with pytest.raises(ValueError, match="'trace'.*'evaluate'"):
        pi.register_interpret_rule(on_slot_p, _declare, form="lower")
