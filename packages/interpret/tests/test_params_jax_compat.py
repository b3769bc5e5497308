"""InterpretParams validation and compatibility with jax's InterpretParams: the
grid_point_recorder signature, accepted-but-unused fields, and the jax callback log."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import (
    InterpretParams,
    LoggingMode,
    OutOfBoundsError,
    errors_as_raised,
)

X = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
CALLBACK_LOGGER = "jax._src.callback"


def copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1


def _grid_call(interpret, grid=(2, 3), semantics=("arbitrary", "arbitrary")):
    return pl.pallas_call(
        copy_kernel,
        out_shape=jax.ShapeDtypeStruct((8 * grid[0], 128), jnp.float32),
        grid=grid,
        in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
        interpret=interpret,
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("random_seed", 1.5),
        ("vector_clock_size", 0),
        ("logging_mode", "grid"),
        ("grid_point_recorder", 3),
        ("dma_order_trials", -1),
        ("rendezvous_timeout", 0),
        ("detect_races", "yes"),
        ("skip_floating_point_ops", 1),
        ("allow_hbm_allocation_in_run_scoped", None),
    ],
)
def test_more_invalid_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"InterpretParams.{field}"):
        InterpretParams(**{field: value})


def test_every_field_of_jax_interpret_params_is_accepted():
    import dataclasses

    ours = {f.name for f in dataclasses.fields(InterpretParams)}
    theirs = {f.name for f in dataclasses.fields(pltpu.InterpretParams)}
    assert theirs <= ours, theirs - ours


def test_vector_clock_size_is_accepted_and_races_still_found():
    out = _grid_call(InterpretParams(vector_clock_size=4, detect_races=True))(X)
    np.testing.assert_array_equal(out, X + 1)


def _recorded(interpret_cls, recorder, **kw):
    out = jax.jit(lambda x: _grid_call(interpret_cls(grid_point_recorder=recorder, **kw))(x))(X)
    jax.block_until_ready(out)
    jax.effects_barrier()
    np.testing.assert_array_equal(out, X + 1)


def test_grid_point_recorder_with_jax_0_10_2_signature_matches_jax():
    """jax 0.10.2 calls recorder(token, grid_point, core_id) and needs the token back;
    the same recorder sees the same grid points, in the same order, under palladium."""
    def recorder_into(seen):
        def recorder(token, grid_point, core_id):
            seen.append((tuple(int(c) for c in grid_point), int(core_id)))
            return token
        return recorder

    ours, theirs = [], []
    _recorded(InterpretParams, recorder_into(ours))
    # Grid iteration order: row-major, last dimension fastest.
    assert ours == [((i, j), 0) for i in range(2) for j in range(3)]
    if jax.__version_info__ >= (0, 10, 2):  # the form this signature was taken from
        _recorded(pltpu.InterpretParams, recorder_into(theirs))
        assert theirs == ours


def test_grid_point_recorder_with_two_arguments():
    seen = []
    _recorded(InterpretParams, lambda grid_point, core: seen.append((grid_point, core)),
              num_cores_or_threads=1)
    assert seen == [((i, j), 0) for i in range(2) for j in range(3)]
    assert all(type(c) is int for point, _ in seen for c in point)


def _oob_call():
    def oob_kernel(s_ref, x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(s_ref[0], 8), :]

    return pl.pallas_call(
        oob_kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec((16, 128), lambda: (0, 0))],
        interpret=InterpretParams(),
    )


def test_palladium_failures_are_not_logged_by_jax_callback(caplog):
    with caplog.at_level(logging.DEBUG, logger=CALLBACK_LOGGER):
        with pytest.raises(OutOfBoundsError, match="oob_kernel"), errors_as_raised():
            _oob_call()(jnp.array([12], jnp.int32), X)
        with pytest.raises(jax.errors.JaxRuntimeError, match="OutOfBoundsError"):
            jax.jit(_oob_call())(jnp.array([12], jnp.int32), X)
    assert [r for r in caplog.records if r.name == CALLBACK_LOGGER] == []


def test_other_callback_failures_are_still_logged(caplog):
    def fails(x):
        raise ZeroDivisionError("not palladium's")

    with (caplog.at_level(logging.DEBUG, logger=CALLBACK_LOGGER),
          pytest.raises(Exception, match="not palladium's")):
        jax.block_until_ready(jax.pure_callback(fails, jax.ShapeDtypeStruct((), jnp.float32), 1.0))
    messages = [r.getMessage() for r in caplog.records if r.name == CALLBACK_LOGGER]
    assert messages == ["jax.pure_callback failed"]


def test_logging_mode_launch_names_the_chip(caplog):
    with caplog.at_level("DEBUG", logger="palladium.interpret"):
        _grid_call(InterpretParams(logging_mode=LoggingMode.LAUNCH, chip="v6e"))(X)
    assert "launch copy_kernel: grid (2, 3) on 1 device(s) x 1 core(s), chip v6e" in caplog.text
