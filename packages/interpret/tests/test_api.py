"""The public API: params validation, forced interpret mode, transformations, custom rules."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.extend.core import Primitive

import palladium.interpret as pi
from palladium.interpret import InterpretParams


def scale_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 3.0


def scale(x, interpret=None):
    kwargs = {} if interpret is None else {"interpret": interpret}
    return pl.pallas_call(
        scale_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        **kwargs,
    )(x)


X = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128) / 100


@pytest.mark.parametrize(
    "field, value",
    [
        ("dma_execution_mode", "lazy"),
        ("out_of_bounds_reads", "clip"),
        ("uninitialized_memory", "garbage"),
        ("buffer_bounds", "tiled"),
        ("dma_order", "lifo"),
        ("on_race", "explode"),
        ("num_cores_or_threads", 0),
        ("chip", "v1"),
    ],
)
def test_invalid_params_name_field_and_choices(field, value):
    with pytest.raises(ValueError, match=f"InterpretParams.{field}"):
        InterpretParams(**{field: value})


def test_params_are_hashable_and_frozen():
    p = InterpretParams(detect_races=True)
    assert hash(p) == hash(InterpretParams(detect_races=True))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.detect_races = False  # type: ignore[misc]


def test_force_tpu_interpret_mode_applies_to_calls_without_interpret():
    with pi.force_tpu_interpret_mode(InterpretParams()):
        out = scale(X)
    np.testing.assert_allclose(out, X * 3)


def test_set_and_reset_tpu_interpret_mode():
    pi.set_tpu_interpret_mode(InterpretParams())
    try:
        np.testing.assert_allclose(jax.jit(scale)(X), X * 3)
    finally:
        pi.reset_tpu_interpret_mode_state()


def test_other_interpret_values_keep_jax_behaviour():
    np.testing.assert_allclose(scale(X, interpret=True), X * 3)


@jax.custom_vjp
def scaled(x):
    return scale(x, InterpretParams())


def _fwd(x):
    return scaled(x), None


def _bwd(_, g):
    return (scale(g, InterpretParams()),)


scaled.defvjp(_fwd, _bwd)


def test_grad_of_custom_vjp_using_kernels():
    g = jax.grad(lambda x: jnp.sum(jnp.sin(scaled(x))))(X)
    np.testing.assert_allclose(g, 3 * jnp.cos(3 * X), rtol=1e-5)


def test_checkpoint_and_jit_around_kernels():
    f = jax.jit(jax.grad(lambda x: jnp.sum(jax.checkpoint(lambda y: jnp.sin(scaled(y)))(x))))
    np.testing.assert_allclose(f(X), 3 * jnp.cos(3 * X), rtol=1e-5)


def test_vmap_of_jit():
    xs = jnp.stack([X, X + 1])
    np.testing.assert_allclose(jax.jit(jax.vmap(lambda x: scale(x, InterpretParams())))(xs), xs * 3)


def test_register_interpret_rule_for_custom_primitive():
    double_p = Primitive("palladium_test_double")
    double_p.def_abstract_eval(lambda x: x)
    pi.register_interpret_rule(double_p, lambda x: x * 2)

    def kernel(x_ref, o_ref):
        o_ref[...] = double_p.bind(x_ref[...])

    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype), interpret=InterpretParams()
    )(X)
    np.testing.assert_allclose(out, X * 2)


def test_register_interpret_rule_with_refs():
    fill_p = Primitive("palladium_test_fill")
    fill_p.multiple_results = True
    fill_p.def_abstract_eval(lambda ref, v: [v])

    def fill(ref, v):  # fills the ref, returns its first element
        ref[...] = jnp.full(ref.shape, v, ref.dtype)
        return [ref[0, 0]]

    pi.register_interpret_rule(fill_p, fill)

    def kernel(o_ref, scratch):
        (first,) = fill_p.bind(scratch, jnp.float32(7.0))
        o_ref[...] = scratch[...] + first

    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
        interpret=InterpretParams(),
    )()
    np.testing.assert_array_equal(out, 14.0)


def test_one_host_callback_per_launch():
    text = jax.jit(lambda x: scale(x, InterpretParams())).lower(X).as_text()
    targets = ("custom_call_target = \"xla_python_cpu_callback\"",
               "xla_ffi_python_cpu_callback",
               "@palladium_host_call(")  # palladium's FFI handler
    assert sum(text.count(t) for t in targets) == 1


def test_interpret_params_hand_the_simulator_the_shared_options():
    from palladium.shared_memory import SimulationOptions

    params = InterpretParams(out_of_bounds_reads="uninitialized", uninitialized_memory="zero",
                             buffer_bounds="padded", dma_execution_mode="eager", random_seed=7)
    assert params.simulation_options(3) == SimulationOptions(
        seed=7, out_of_bounds="uninitialized", uninitialized="zero", bounds="padded",
        dma_execution_mode="eager", tpu_generation=3, watchdog=300.0,
        uninitialized_reads="on_use")


def test_a_rule_registered_by_name_is_never_fused_into_a_compiled_segment():
    """A primitive with a rule registered by name runs that rule, also inside a loop of
    small operations that becomes a compiled segment (which would otherwise run the
    primitive's own XLA lowering)."""
    from jax.interpreters import mlir

    from palladium.interpret.eval.registry import register_interpret_rule_by_name

    halve_p = Primitive("palladium_test_by_name_halve")
    halve_p.def_abstract_eval(lambda x: x)
    halve_p.def_impl(lambda x: x * 5.0)
    mlir.register_lowering(halve_p, mlir.lower_fun(lambda x: x * 5.0, multiple_results=False))
    register_interpret_rule_by_name("palladium_test_by_name_halve", lambda x: x * 0.5)

    def kernel(x_ref, o_ref):
        def step(i, acc):
            return halve_p.bind(acc) + 1.0

        o_ref[...] = jax.lax.fori_loop(0, 300, step, x_ref[...])

    x = jnp.full((8, 128), 4.0, jnp.float32)
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                         interpret=InterpretParams(check_lowering=False))(x)
    expected = np.full((8, 128), 4.0, np.float32)
    for _ in range(300):
        expected = expected * np.float32(0.5) + np.float32(1.0)
    np.testing.assert_array_equal(np.asarray(out), expected)
