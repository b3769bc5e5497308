"""palladium.pipeline's rules for interpreters: the body evaluated on transformed refs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline.errors import PipelineNotImplementedError
from palladium.pipeline.interpret_rules import eval_with_transformed_refs, interpret_rules
from palladium.pipeline.primitive import emit_pipeline_p, expand, pipeline_body_p, trace_fun

BLOCK = jc.AbstractRef(jc.ShapedArray((8, 128), jnp.float32))


def test_interpret_rules_maps_both_primitives():
    rules = interpret_rules()
    assert set(rules) == {emit_pipeline_p, pipeline_body_p}
    assert rules[emit_pipeline_p] is expand


def _on_slot(body, slot):
    """``body``'s jaxpr evaluated on slot ``slot`` of a (3, 8, 128) buffer, via run_state."""
    jaxpr, consts = trace_fun(body, [BLOCK], "test body")
    assert not consts
    x = jnp.arange(3 * 8 * 128, dtype=jnp.float32).reshape(3, 8, 128)

    @pl.run_state
    def run(refs):
        buf, _ = refs
        eval_with_transformed_refs(jaxpr, [buf.at[slot]])

    return x, run((x, jnp.zeros(())))[0]


def test_loads_and_stores_compose_the_block_transforms():
    def body(r):
        r[2:4, :] = r[0:2, :] * 10.0
        r[...] += 1.0
        return []

    x, out = _on_slot(body, 1)
    expected = np.array(x)
    expected[1, 2:4] = x[1, 0:2] * 10.0
    expected[1] += 1.0
    np.testing.assert_array_equal(out, expected)


def test_control_flow_over_a_block_ref():
    def body(r):
        @pl.when(r[0, 0] > 0)
        def _():
            r[...] = -r[...]

        jax.lax.fori_loop(0, 4, lambda i, c: (r.__setitem__((i, 0), c), c + 1.0)[1],
                          jnp.float32(5.0))
        return []

    x, out = _on_slot(body, 2)
    expected = np.array(x)
    expected[2] = -x[2]
    expected[2, :4, 0] = [5.0, 6.0, 7.0, 8.0]
    np.testing.assert_array_equal(out, expected)


def test_unsupported_primitive_on_a_block_ref_names_it():
    touch_p = jc.Primitive("palladium_test_touch_ref")
    touch_p.def_abstract_eval(lambda ref: jc.ShapedArray((), jnp.float32))

    def body(r):
        return [touch_p.bind(r)]

    jaxpr, _ = trace_fun(body, [BLOCK], "test body")
    buf = jc.AbstractRef(jc.ShapedArray((2, 8, 128), jnp.float32))

    def run(ref):
        return eval_with_transformed_refs(jaxpr, [ref.at[0]])

    with pytest.raises(PipelineNotImplementedError, match="palladium_test_touch_ref"):
        trace_fun(run, [buf], "test")
