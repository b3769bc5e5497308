"""A region reused as the same tuple object, or one holding an array that changes, means
what it holds at each access: nothing is cached by a region's identity (a client that
reuses a region keeps its plan, ``test_access_plans.py``)."""

import numpy as np
import pytest

from palladium.shared_memory import MemorySpace, OutOfBoundsError, Simulation


def _sim_with(value):
    sim = Simulation()
    buf = sim.allocate(MemorySpace.VMEM, 0, 0, name="x", value=value)
    return sim, buf


def test_reused_region_tuple_reads_and_writes_the_same_elements():
    sim, buf = _sim_with(np.arange(12.0, dtype=np.float32).reshape(3, 4))
    region = (slice(1, 3), slice(0, 4, 2))
    for _ in range(3):
        np.testing.assert_array_equal(sim.read(buf, region, core=(0, 0)),
                                      [[4.0, 6.0], [8.0, 10.0]])
    sim.write(buf, region, np.zeros((2, 2), np.float32), core=(0, 0))
    np.testing.assert_array_equal(sim.read(buf, region, core=(0, 0)), np.zeros((2, 2)))
    assert sim.value(buf)[1, 1] == 5.0


def test_region_holding_an_array_is_not_cached():
    sim, buf = _sim_with(np.arange(4.0, dtype=np.float32))
    index = np.array(1)
    region = (index,)
    assert sim.read(buf, region, core=(0, 0)) == 1.0
    index[...] = 3  # the same tuple now means another element
    assert sim.read(buf, region, core=(0, 0)) == 3.0


def test_out_of_bounds_region_raises_every_time():
    sim, buf = _sim_with(np.zeros(4, np.float32))
    region = (slice(2, 6),)
    for _ in range(2):
        with pytest.raises(OutOfBoundsError, match="'x'"):
            sim.read(buf, region, core=(0, 0))
