"""Every primitive jax's Pallas TPU lowering registers is accounted for: an interpreter
rule, a numpy rule, evaluation by ``bind`` on CPU, or a refusal that names it. A
primitive a new jax adds to the lowering fails ``test_every_tpu_lowering_primitive_is_
accounted_for`` until it is classified."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import (
    InterpretParams,
    TpuLoweringError,
    UnsupportedPrimitiveError,
    errors_as_raised,
)
from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.program import _bind
from palladium.interpret.eval.registry import RULES
from palladium.interpret.eval.rules_unsupported import BOUND_ON_CPU, UNSUPPORTED
from palladium.interpret.numpy_rules import NUMPY_RULES

LOWERED = jc.mosaic_lowering_primitives()


def _has_rule(p):
    return p in RULES or RULES.compiler(p) is not None or p in NUMPY_RULES


def test_every_tpu_lowering_primitive_is_accounted_for():
    unclassified = sorted(str(p) for p in LOWERED
                          if not _has_rule(p) and str(p) not in BOUND_ON_CPU
                          and str(p) not in UNSUPPORTED)
    assert unclassified == [], (
        "primitives of jax's TPU lowering without an interpreter rule: add a rule, or "
        "list them in rules_unsupported.BOUND_ON_CPU (bind works on CPU) or UNSUPPORTED")


def test_the_lists_do_not_overlap_nor_shadow_a_rule():
    assert not set(UNSUPPORTED) & BOUND_ON_CPU
    ruled = {str(p) for p in LOWERED if _has_rule(p) and str(p) not in UNSUPPORTED}
    assert not ruled & BOUND_ON_CPU, ruled & BOUND_ON_CPU


@pytest.mark.parametrize("name", sorted(BOUND_ON_CPU))
def test_primitives_left_to_bind_have_a_cpu_implementation(name):
    prim = next((p for p in LOWERED if str(p) == name), None)
    if prim is None:
        pytest.skip(f"this jax's TPU lowering has no '{name}'")
    assert "impl" in prim.__dict__ or type(prim).impl is not jc.Primitive.impl, name


class _Eqn:
    def __init__(self, prim):
        self.primitive = prim


class _Ev:
    def site(self, eqn):
        return "kernel 'k', core 0 (k.py:1)"


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_each_unsupported_primitive_is_refused_by_name(name):
    prim = next((p for p in LOWERED if str(p) == name), None)
    if prim is None:
        pytest.skip(f"this jax's TPU lowering has no '{name}'")
    rule = RULES.get(prim)
    with pytest.raises(UnsupportedPrimitiveError) as info:
        if rule is not None:
            rule(_Ev(), _Eqn(prim), [])
        else:  # refused by name where bind finds no CPU implementation
            eqn = _Eqn(prim)
            eqn.params = {}
            _bind(_Ev(), eqn, [])
    msg = str(info.value)
    assert f"primitive '{name}' is not supported" in msg and UNSUPPORTED[name] in msg
    assert "k.py:1" in msg


@pytest.mark.skipif(jc.matmul_push_rhs_p is None, reason="no explicit MXU ops in this jax")
def test_an_explicit_mxu_kernel_before_v7_fails_naming_the_primitive():
    def kernel(x_ref, o_ref, acc_ref):
        pltpu.matmul_push_rhs(x_ref, staging_register=0, mxu_index=0)
        o_ref[...] = x_ref[...]

    x = jnp.ones((128, 128), jnp.float32)

    def call(check_lowering):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              scratch_shapes=[pltpu.VMEM((128, 128), jnp.float32)],
                              interpret=InterpretParams(check_lowering=check_lowering))

    try:
        jax.make_jaxpr(call(True))(x)
    except Exception as e:  # this jax's signature differs: the unit test above covers it
        pytest.skip(f"cannot trace pltpu.matmul_push_rhs here: {e}")
    # Mosaic fails to verify the lowered kernel (a ref where a vector goes), as the TPU
    # compiler does: a lowering error naming the op.
    with pytest.raises(TpuLoweringError, match="'tpu.matmul_push_rhs' op operand #0"):
        call(True)(x)
    # Without the lowering check, the MXU model refuses it on the default chip (v5e), as
    # the TPU compiler does (tests/eval/test_mxu.py runs the operations on a v7x).
    with pytest.raises(TpuLoweringError, match="explicit MXU operations on TPU v5e"), \
            errors_as_raised():
        call(False)(x)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("approx", [False, True])
def test_reciprocal_matches_numpy(dtype, approx):
    x = (jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128) - 500.5).astype(dtype)

    def kernel(x_ref, o_ref):
        o_ref[...] = pl.reciprocal(x_ref[...], approx=approx)

    # jax 0.10.2's Mosaic lowers reciprocal of float32 only: the lowering check is off.
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                         interpret=InterpretParams(check_lowering=False))(x)
    expected = (1 / np.asarray(x, np.float32)).astype(x.dtype)
    np.testing.assert_array_equal(np.asarray(out), expected)
