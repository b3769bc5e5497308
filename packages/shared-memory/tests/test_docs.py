"""The runnable examples in the package's docstrings."""

import doctest

import pytest

import palladium.shared_memory.observer
import palladium.shared_memory.options
import palladium.shared_memory.simulation
import palladium.shared_memory.tpu_facts


@pytest.mark.parametrize(
    "module",
    [palladium.shared_memory.observer, palladium.shared_memory.options,
     palladium.shared_memory.tpu_facts,
     palladium.shared_memory.simulation],
)
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0
