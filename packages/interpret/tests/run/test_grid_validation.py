"""Grid sizes and kernel names checked before a launch runs: a negative grid dimension
(static or dynamic) is a palladium error naming the dimension and its size, not an
empty grid; a ``core_map`` body named ``_`` is reported under the function that wrote
it."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import (
    ConfigError,
    InterpretParams,
    InvalidKernelError,
    KernelError,
    errors_as_raised,
)


def add_one_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1


def _call(grid):
    return pl.pallas_call(
        add_one_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), grid=grid,
        in_specs=[pl.BlockSpec((8, 128), lambda *i: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda *i: (0, 0)),
        interpret=InterpretParams())


@pytest.mark.timeout(120)
def test_a_negative_static_grid_size_is_rejected_when_lowered():
    with pytest.raises(InvalidKernelError,
                       match=r"^kernel 'add_one_kernel' \(test_grid_validation.py:\d+\): grid "
                             r"dimension 1 has size -2 \(grid \(3, -2\)\); a grid size must be "
                             r">= 0 \(0 runs no grid point\)\. Check how the grid is computed"):
        _call((3, -2))(jnp.zeros((8, 128)))


@pytest.mark.timeout(120)
def test_a_negative_dynamic_grid_size_fails_the_launch():
    @jax.jit
    def f(n, x):
        return _call((n,))(x)

    with pytest.raises(
            KernelError,
            match=r"^kernel 'add_one_kernel' \(test_grid_validation.py:\d+\): grid dimension 0 "
                  r"has size -3 at run time \(grid \(-3,\)\); a grid size must be >= 0 \(0 runs "
                  r"no grid point\)\. Check the value passed as the dynamic grid size"), \
            errors_as_raised():
        jax.block_until_ready(f(-3, jnp.zeros((8, 128))))


@pytest.mark.timeout(120)
def test_more_cores_than_simulated_in_a_core_map_mesh_are_rejected():
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=1000)

    @jax.jit
    def f(x):
        def body(refs):
            x_ref, o_ref = refs

            @pl.core_map(mesh, interpret=InterpretParams())
            def many_cores():
                pltpu.sync_copy(x_ref, o_ref)

        return pl.run_state(body)((x, jnp.zeros_like(x)))[1]

    with pytest.raises(ConfigError, match=r"^kernel 'many_cores' .*: the core_map mesh has "
                                          r"1000 cores per device; palladium simulates at most "
                                          r"16 TensorCores per device \(a TPU chip has 1 or 2\)"):
        f(jnp.zeros((8, 128)))


@pytest.mark.timeout(120)
def test_a_core_map_body_named_underscore_is_reported_under_its_enclosing_function():
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=2)

    @jax.jit
    def gather_rows(x):
        def body(refs):
            x_ref, o_ref = refs

            @pl.core_map(mesh, interpret=InterpretParams())
            def _():
                o_ref[...] = x_ref[...]  # HBM read: rejected when lowered

        return pl.run_state(body)((x, jnp.zeros_like(x)))[1]

    with pytest.raises(InvalidKernelError, match=r"^kernel 'body\._' \(test_grid_validation"):
        gather_rows(jnp.zeros((8, 128)))
