"""The one record of a chip (``chip.chip_record``): what every part asks for by name."""

import doctest

import pytest

from palladium.interpret import chip
from palladium.interpret.chip import CHIPS, DEFAULT_CHIP, chip_facts, chip_record, compiler_facts
from palladium.interpret.errors import ConfigError
from palladium.interpret.perf.model import chip_model


def test_the_docstring_examples_run():
    failures, tried = doctest.testmod(chip)
    assert tried > 0 and failures == 0


@pytest.mark.parametrize("name", CHIPS)
def test_the_record_holds_the_chips_facts_and_compiler_facts(name):
    record = chip_record(name)
    assert record.name == name and record is chip_record(name)
    assert record.facts is chip_facts(name)
    assert record.compiler is compiler_facts(name)
    assert record.generation == record.facts.generation
    # a megacore chip's device is its two TensorCores; any other chip's device is one
    assert record.cores_per_device == (2 if record.facts.megacore else 1)
    # the performance model is derived from the same record
    model = chip_model(name)
    assert model.vmem_capacity_bytes == record.facts.vmem_capacity_bytes
    assert model.tensor_cores_per_chip == record.facts.tensor_cores_per_chip


def test_the_compiler_topologies_are_libtpus_names():
    assert chip_record("v7x").compiler_topology == ("tpu7x", True)
    assert chip_record(DEFAULT_CHIP).compiler_topology == ("v5e", False)
    assert chip_record("v4i").compiler_topology is None


def test_an_unknown_chip_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown TPU chip 'v9'"):
        chip_record("v9")
