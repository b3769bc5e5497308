"""Each ref access primitive has one rule (a rule compiler), one code path: the uncached
case (an array-valued index, a plugin's ref with transforms) is a plan made for that one
call, not a second rule."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams, UnsupportedFeatureError, errors_as_raised
from palladium.interpret.eval.access_path import PlanCache, operand_key
from palladium.interpret.eval.primitive_groups import ACCESS_PRIMITIVES
from palladium.interpret.eval.registry import RULES
from palladium.interpret.state.process_state import STATE

pytestmark = pytest.mark.timeout(120)


def test_every_access_primitive_has_one_rule_a_compiler():
    table = STATE._rules_at_import or RULES.snapshot()
    both = sorted(str(p) for p in ACCESS_PRIMITIVES if p in table.rules)
    assert both == [], f"access primitives with a plain rule beside their compiler: {both}"
    missing = sorted(str(p) for p in ACCESS_PRIMITIVES if p not in table.compilers)
    assert missing == [], f"access primitives without a rule compiler: {missing}"


def test_no_built_in_primitive_has_both_forms():
    table = STATE._rules_at_import or RULES.snapshot()
    assert sorted(str(p) for p in set(table.rules) & set(table.compilers)) == []


def test_the_key_skips_a_stores_value_and_stops_before_a_mask():
    scalar, index = np.array(3, np.int32), np.int32(2)
    value = np.ones((4, 4), np.float32)
    assert operand_key([scalar, value, index], skip=1) == (3, 2)
    assert operand_key([scalar, index, value, value], stop=2) == (3, 2)
    assert operand_key([scalar, value, index]) is None  # the value has no structure
    assert operand_key([scalar, np.arange(2)]) is None  # a gather's index


def test_a_key_of_none_builds_a_plan_for_the_call_and_keeps_nothing():
    cache: PlanCache[list] = PlanCache()
    built = []

    def build(x):
        built.append(x)
        return [x]

    assert cache.get(None, build, 1) == [1] and cache.get(None, build, 2) == [2]
    assert cache.get((5,), build, 3) == [3] and cache.get((5,), build, 4) == [3]
    assert built == [1, 2, 3] and len(cache) == 1


def test_sliced_loads_stores_and_accumulations_agree_with_numpy():
    def kernel(x_ref, o_ref, acc_ref):
        o_ref[...] = x_ref[...] * 2.0
        acc_ref[...] = jnp.zeros_like(acc_ref)
        acc_ref[...] += x_ref[...]
        for i in range(2):  # one equation per start in the loop's body: plans per key
            acc_ref[pl.ds(1 + i, 2), :] += x_ref[pl.ds(3 + i, 2), :]
        o_ref[pl.ds(0, 2), :] = o_ref[pl.ds(0, 2), :] + acc_ref[pl.ds(1, 2), :]

    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
        interpret=InterpretParams())(jnp.asarray(x))
    acc = x.copy()
    for i in range(2):
        acc[1 + i:3 + i] += x[3 + i:5 + i]
    want = x * 2.0
    want[0:2] += acc[1:3]
    np.testing.assert_array_equal(np.asarray(out), want)


def test_a_gather_is_refused_by_the_same_rule_with_the_same_text():
    # An array-valued index has no key: the access resolves for the call alone, and
    # resolving it refuses it.
    def kernel(idx_ref, x_ref, o_ref):
        o_ref[...] = x_ref[idx_ref[...], :]

    idx = jnp.arange(8, dtype=jnp.int32)[::-1]
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        interpret=InterpretParams(check_lowering=False))
    with pytest.raises(UnsupportedFeatureError) as info, errors_as_raised():
        call(idx, jnp.ones((8, 128), jnp.float32))
    assert str(info.value).startswith(
        "ref indexer: array-valued (gather-style) indexers of refs are not supported on TPU")


def test_masked_loads_and_stores_with_a_fill_agree_with_numpy():
    def kernel(x_ref, o_ref):
        mask = jax.lax.broadcasted_iota(jnp.int32, (2, 128), 1) < 64
        for i in range(3):  # the same equations at other starts: one plan per key
            v = pltpu.load(x_ref.at[pl.ds(i, 2)], mask=mask)
            pltpu.store(o_ref.at[pl.ds(2 * i, 2)], jnp.where(mask, v, -1.0), mask=mask)
        o_ref[pl.ds(6, 2), :] = jnp.full((2, 128), 7.0)

    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        # (columns 64: of rows 0:6 are never stored: the test checks the zero fill there)
        interpret=InterpretParams(uninitialized_memory="zero", check_lowering=False,
                                  uninitialized_reads="off"))(jnp.asarray(x))
    want = np.zeros((8, 128), np.float32)
    for i in range(3):
        want[2 * i:2 * i + 2, :64] = x[i:i + 2, :64]
    want[6:8] = 7.0
    np.testing.assert_array_equal(np.asarray(out), want)
