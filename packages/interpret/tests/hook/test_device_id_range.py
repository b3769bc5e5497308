"""Every form of a remote ``device_id`` is range-checked per mesh axis: an out-of-range
minor coordinate must not silently name another device (row-major ids)."""

import jax
import numpy as np
import pytest
from _multi_device_harness import remote_copy_on_2x2
from jax.experimental import pallas as pl

from palladium.interpret import InterpretParams, KernelError, errors_as_raised


def _send_to(device_id, device_id_type):
    return remote_copy_on_2x2(device_id, device_id_type, InterpretParams(check_lowering=False))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("device_id", [{"b": 2}, {"a": 2}, {"a": -1}, {"a": 0, "b": 5}])
def test_dict_device_id_out_of_range_on_any_axis_raises(device_id):
    axis, value = [(k, v) for k, v in device_id.items() if not 0 <= v < 2][0]
    with pytest.raises(KernelError, match=rf"coordinate {value} is outside mesh axis "
                                          rf"'{axis}' of size 2"), errors_as_raised():
        _send_to(device_id, pl.DeviceIdType.MESH)


@pytest.mark.timeout(120)
def test_tuple_device_id_out_of_range_raises():
    with pytest.raises(KernelError, match=r"coordinate 2 is outside mesh axis 'b' of size 2"), \
            errors_as_raised():
        _send_to((0, 2), pl.DeviceIdType.MESH)


@pytest.mark.timeout(120)
def test_in_range_dict_device_id_sends_along_the_named_axis():
    x, out = _send_to(lambda: {"b": 1 - jax.lax.axis_index("b")}, pl.DeviceIdType.MESH)
    blocks = np.asarray(x).reshape(2, 8, 2, 128)
    np.testing.assert_array_equal(np.asarray(out).reshape(2, 8, 2, 128), blocks[:, :, ::-1])
