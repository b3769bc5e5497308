"""palladium's ``InterpretParams`` accepts everything jax 0.10.2's ``pltpu.InterpretParams``
accepts: every field with the same default, every value of every ``Literal`` field, jax's
own ``LoggingMode`` flag, the same ``ValueError``s, ``get_vector_clock_size`` and
``num_cores_per_device``. Checked field by field against jax's class itself."""

import dataclasses
import itertools
import logging
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.pallas.mosaic.interpret.params import LoggingMode as JaxLoggingMode
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import ConfigError, InterpretParams, LoggingMode

JAX_FIELDS = {f.name: f for f in dataclasses.fields(pltpu.InterpretParams)}
HINTS = typing.get_type_hints(pltpu.InterpretParams)


def test_every_jax_field_exists_with_jaxs_default():
    ours = {f.name: f for f in dataclasses.fields(InterpretParams)}
    assert set(JAX_FIELDS) <= set(ours)
    for name, field in JAX_FIELDS.items():
        assert ours[name].default == field.default, name


@pytest.mark.parametrize("name", [n for n in JAX_FIELDS
                                  if typing.get_origin(HINTS[n]) is typing.Literal])
def test_every_value_of_every_literal_field_is_accepted(name):
    for value in typing.get_args(HINTS[name]):
        pltpu.InterpretParams(**{name: value})  # jax accepts it ...
        assert getattr(InterpretParams(**{name: value}), name) == value  # ... and so do we


def test_a_jax_params_instance_converts_field_by_field():
    theirs = pltpu.InterpretParams(
        detect_races=True, out_of_bounds_reads="uninitialized", skip_floating_point_ops=True,
        uninitialized_memory="zero", num_cores_or_threads=2, vector_clock_size=8,
        logging_mode=JaxLoggingMode.SEMAPHORE, dma_execution_mode="eager", random_seed=3,
        grid_point_recorder=lambda token, point, core: token,
        allow_hbm_allocation_in_run_scoped=True, buffer_bounds="padded")
    ours = InterpretParams(**{name: getattr(theirs, name) for name in JAX_FIELDS})
    assert ours.logging_mode == LoggingMode.SEMAPHORE
    assert ours.num_cores_per_device == theirs.num_cores_per_device == 2
    for name in JAX_FIELDS:
        if name != "logging_mode":
            assert getattr(ours, name) == getattr(theirs, name), name


@pytest.mark.parametrize("bits", range(1, 8))
def test_jaxs_logging_mode_values_map_to_ours(bits):
    members = [m for i, m in enumerate(JaxLoggingMode) if bits >> i & 1]
    theirs = JaxLoggingMode(0)
    for m in members:
        theirs |= m
    expected = LoggingMode(0)
    for m in members:
        expected |= {"BARRIER": LoggingMode.BARRIER, "SEMAPHORE": LoggingMode.SEMAPHORE,
                     "SHARED_MEMORY": LoggingMode.MEMORY}[m.name]
    assert InterpretParams(logging_mode=theirs).logging_mode == expected


def test_other_logging_modes_are_still_rejected():
    with pytest.raises(ConfigError, match="InterpretParams.logging_mode must be None or a "
                       "LoggingMode flag"):
        InterpretParams(logging_mode="SEMAPHORE")


@pytest.mark.parametrize("devices,cores,size", list(itertools.product(
    [1, 2, 4], [1, 2], [None, 1, 3, 8, 9])))
def test_get_vector_clock_size_answers_as_jax(devices, cores, size):
    theirs = pltpu.InterpretParams(num_cores_or_threads=cores, vector_clock_size=size)
    ours = InterpretParams(num_cores_or_threads=cores, vector_clock_size=size)
    try:
        expected = theirs.get_vector_clock_size(devices)
    except ValueError:
        with pytest.raises(ValueError, match=r"vector_clock_size \(\d+\) must be greater than "
                           r"the total number of cores"):
            ours.get_vector_clock_size(devices)
    else:
        assert ours.get_vector_clock_size(devices) == expected


@pytest.mark.parametrize("kwargs", [{"num_cores_or_threads": 0}, {"vector_clock_size": 0}])
def test_jaxs_value_errors_are_value_errors_here(kwargs):
    with pytest.raises(ValueError):
        pltpu.InterpretParams(**kwargs)
    with pytest.raises(ValueError):
        InterpretParams(**kwargs)


@pytest.mark.timeout(120)
def test_jaxs_semaphore_and_barrier_modes_log_signals_and_waits(caplog):
    def kernel(x_ref, o_ref, sem):
        pl.semaphore_signal(sem, 1)
        pl.semaphore_wait(sem, 1)
        o_ref[...] = x_ref[...]

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                       scratch_shapes=[pltpu.SemaphoreType.REGULAR],
                       interpret=InterpretParams(logging_mode=JaxLoggingMode.SEMAPHORE))
    with caplog.at_level(logging.DEBUG, logger="palladium.interpret"):
        np.testing.assert_array_equal(f(jnp.ones((8, 128), jnp.float32)), 1.0)
    messages = [r.getMessage() for r in caplog.records]
    assert "kernel: device 0 core 0 signals semaphore 'sem' of device 0 core 0 by 1" in messages
    assert "kernel: device 0 core 0 waits for 1 on semaphore 'sem'" in messages
    assert "kernel: device 0 core 0 got 1 from semaphore 'sem'" in messages
