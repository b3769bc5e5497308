"""palladium.pipeline's rules for interpreters: what the body primitive declares.

The pipeline evaluates nothing itself: for ``palladium_pipeline_body`` it declares the
body jaxpr and its arguments, the block refs as the interpreter's operands with the
slot transforms around them (the protocol of ``palladium.interpret.rule_plugins``, form
"evaluate"); the interpreter's evaluation is tested under integration_tests/.
"""

import jax.numpy as jnp
import numpy as np

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline.interpret_rules import interpret_rules, pipeline_body_evaluation
from palladium.pipeline.primitive import emit_pipeline_p, expand, pipeline_body_p, trace_fun

BUFFER = jc.AbstractRef(jc.ShapedArray((3, 8, 128), jnp.float32))
INT32 = jc.ShapedArray((), jnp.int32)


def test_interpret_rules_maps_both_primitives():
    rules = interpret_rules()
    assert set(rules) == {emit_pipeline_p, pipeline_body_p}
    assert rules[emit_pipeline_p] is expand
    assert rules[pipeline_body_p] == ("evaluate", pipeline_body_evaluation)


class Opaque:
    """An interpreter's value: the rule passes it on without looking into it."""


def test_body_evaluation_declares_the_body_on_the_slot_refs():
    found = {}

    def bind_time(buf, slot):  # how the emitter flattens a block ref (buf.at[slot])
        found["leaves"], found["tree"] = jc.ref_tree_flatten(buf.at[slot])
        return []

    trace_fun(bind_time, [BUFFER, INT32], "test")
    tree = found["tree"]
    assert len(found["leaves"]) == 2  # the buffer and the slot index
    body_jaxpr, _ = trace_fun(lambda c, i, r: [], [INT32, INT32, BUFFER], "test body")
    const, step, buf, slot = np.int32(7), np.int32(2), Opaque(), np.int32(1)
    closed, args = pipeline_body_evaluation(const, step, buf, slot, jaxpr=body_jaxpr,
                                            num_consts=1, num_scalars=1, refs_tree=tree)
    assert closed.jaxpr is body_jaxpr and not closed.consts
    assert args[:2] == [const, step]
    (ref,) = args[2:]
    assert isinstance(ref, jc.TransformedRef) and ref.ref is buf
    (indexer,) = ref.transforms
    assert indexer.indices[0] is slot
