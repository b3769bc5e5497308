"""palladium.shared_memory's tile padding equals jax's Mosaic tiling inference.

``buffer_bounds="padded"`` in jax's TPU interpreter pads with ``tpu_info.infer_tiling``;
palladium's jax-free ``padded_shape`` must give the same shapes for every TPU generation.
"""

import inspect

import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from jax._src.pallas.mosaic import tpu_info  # the reference we compare with
from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

from palladium.shared_memory import padded_shape

KINDS = {3: "TPU v3", 4: "TPU v4", 5: "TPU v5 lite", 6: "TPU v6 lite"}
DTYPES = [np.float32, np.int32, ml_dtypes.bfloat16, np.int16, np.int8, np.uint8]


def _mesh(kind):
    extra = {"platform": "tpu"} if "platform" in inspect.signature(AbstractDevice).parameters else {}
    return AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(device_kind=kind, num_cores=1, **extra))


def _jax_padded(shape, dtype, kind):
    with use_abstract_mesh(_mesh(kind)):
        tiles = tpu_info.infer_tiling(_aval(shape, dtype))
    return tuple(-(-d // t) * t for d, t in zip(shape, tiles))


def _aval(shape, dtype):
    from jax.core import ShapedArray

    return ShapedArray(shape, np.dtype(dtype))


@settings(max_examples=150, deadline=None)
@given(
    shape=st.lists(st.integers(1, 300), min_size=1, max_size=3).map(tuple),
    dtype=st.sampled_from(DTYPES),
    generation=st.sampled_from(sorted(KINDS)),
)
def test_padded_shape_matches_jax_infer_tiling(shape, dtype, generation):
    expected = _jax_padded(shape, dtype, KINDS[generation])
    assert padded_shape(shape, dtype, generation=generation) == expected
