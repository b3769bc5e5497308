"""palladium's TPU facts equal jax's, for every dtype a kernel can hold on every chip jax models.

Three homes, one truth: ``palladium.shared_memory.tpu_facts`` (jax-free plain data: tiles,
padding, fills), ``palladium.pipeline.tiling`` (the emitter's ragged-block tiles; it may
not import shared_memory) and ``palladium.interpret.chip`` (the chip table, read from jax)
are each compared with jax's ``tpu_info`` / the TPU interpreter's fill, case by case.
"""

import inspect

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax._src.pallas.mosaic import tpu_info  # the reference we compare with
from jax._src.pallas.mosaic.interpret import utils as jax_interpret_utils  # reference fills
from jax.core import ShapedArray
from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

from palladium.interpret import CHIPS, chip_facts
from palladium.interpret.chip import (
    DEFAULT_SCOPED_VMEM_LIMIT_BYTES,
    chip_of_device_kind,
    device_kind,
)
from palladium.pipeline.tiling import infer_tiling as pipeline_infer_tiling
from palladium.shared_memory import tpu_facts
from palladium.shared_memory.tpu_facts import padded_shape, tile_shape, uninitialized_value

# Every dtype of 32 bits or less a jax array (so a kernel) can hold in this jax: every
# float (fp8 and fp4 variants included), int and uint width down to 2 bits, and bool.
# (jax names float6, which XLA's arrays cannot hold, and 1-bit ints, which leave jax as
# bool.)
_DTYPE_NAMES = [
    "bool_", "float32", "float16", "bfloat16",
    "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz",
    "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn",
    "int32", "int16", "int8", "int4", "int2",
    "uint32", "uint16", "uint8", "uint4", "uint2",
]


def _holdable(name):
    if not hasattr(jnp, name):
        return False
    try:
        return jnp.zeros((), getattr(jnp, name)).dtype == np.dtype(getattr(jnp, name))
    except Exception:  # jax names it but XLA has no such array type
        return False


DTYPES = [np.dtype(getattr(jnp, n)) for n in _DTYPE_NAMES if _holdable(n)]

# Device kinds of every chip jax's tpu_info knows (the test below checks none is missing).
_KINDS = ["TPU v2", "TPU v3", "TPU v4", "TPU v4 lite", "TPU v5 lite", "TPU v5", "TPU v6 lite",
          "TPU7", "TPU7x", "TPU8i"]
KINDS = {tpu_info.chip_version_from_device_kind(k): k for k in _KINDS
         if tpu_info.chip_version_from_device_kind(k) is not None}

EDGE_SHAPES = [(1,), (5,), (128,), (129,), (1025,), (1, 1), (1, 128), (2, 128), (3, 128),
               (4, 5), (7, 129), (8, 128), (9, 128), (16, 256), (17, 1), (31, 300),
               (33, 128), (64, 64), (2, 3, 128), (4, 1, 1)]


def _mesh(kind):
    extra = {"platform": "tpu"} if "platform" in inspect.signature(AbstractDevice).parameters else {}
    return AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(device_kind=kind, num_cores=1, **extra))


def _jax_tiles(shape, dtype, kind):
    with use_abstract_mesh(_mesh(kind)):
        return tuple(tpu_info.infer_tiling(ShapedArray(shape, dtype)))


def _generation(kind):
    return tpu_info.get_tpu_info_for_chip(tpu_info.chip_version_from_device_kind(kind), 1).generation


def _pad(shape, tiles):
    return tuple(-(-d // t) * t for d, t in zip(shape, tiles))


def test_every_chip_jax_models_is_covered():
    assert set(KINDS) == set(tpu_info.ChipVersion)


@pytest.mark.parametrize("kind", sorted(KINDS.values()))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tiles_and_padding_match_jax_infer_tiling(dtype, kind):
    generation = _generation(kind)
    for shape in EDGE_SHAPES:
        expected = _jax_tiles(shape, dtype, kind)
        assert tile_shape(shape, dtype, generation=generation) == expected, shape
        assert padded_shape(shape, dtype, generation=generation) == _pad(shape, expected), shape


@settings(max_examples=150, deadline=None)
@given(
    shape=st.lists(st.integers(1, 300), min_size=1, max_size=3).map(tuple),
    dtype=st.sampled_from(DTYPES),
    kind=st.sampled_from(sorted(KINDS.values())),
)
def test_padded_shape_matches_jax_infer_tiling(shape, dtype, kind):
    expected = _pad(shape, _jax_tiles(shape, dtype, kind))
    assert padded_shape(shape, dtype, generation=_generation(kind)) == expected


@pytest.mark.parametrize("kind", sorted(KINDS.values()))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pipeline_tiling_matches_jax_and_the_facts(dtype, kind):
    for shape in EDGE_SHAPES:
        expected = _jax_tiles(shape, dtype, kind)
        with use_abstract_mesh(_mesh(kind)):
            assert pipeline_infer_tiling(ShapedArray(shape, dtype)) == expected, shape
    assert tpu_facts.packing(dtype) == (8 if dtype.name == "int4" else max(1, 4 // dtype.itemsize))


@pytest.mark.parametrize("mode", ["nan", "zero"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_uninitialized_value_matches_jax_interpreter(dtype, mode):
    try:
        reference = jax_interpret_utils.get_uninitialized_value(dtype, mode)
    except NotImplementedError:  # jax has no fill for this type (a float without NaN ...)
        reference = np.nan
    expected = np.asarray(jnp.full((), reference, dtype))
    got = np.asarray(uninitialized_value(dtype, mode), dtype=dtype)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got.astype(np.float64), expected.astype(np.float64))


@pytest.mark.parametrize("name", CHIPS)
def test_chip_table_is_jax_tpu_info(name):
    facts = chip_facts(name)
    version = tpu_info.ChipVersion(facts.jax_chip_version)
    info = tpu_info.get_tpu_info_for_chip(version, 1)
    assert (facts.generation, facts.vmem_capacity_bytes, facts.smem_capacity_bytes) == (
        info.generation, info.vmem_capacity_bytes, info.smem_capacity_bytes)
    assert (facts.hbm_capacity_bytes, facts.hbm_bandwidth_bytes_per_second) == (
        info.hbm_capacity_bytes, info.mem_bw_bytes_per_second)
    assert (facts.bf16_ops_per_second, facts.int8_ops_per_second, facts.fp8_ops_per_second,
            facts.int4_ops_per_second) == (
        info.bf16_ops_per_second, info.int8_ops_per_second, info.fp8_ops_per_second,
        info.int4_ops_per_second)
    assert (facts.num_lanes, facts.num_sublanes, facts.mxu_column_size, facts.num_mxus) == (
        info.num_lanes, info.num_sublanes, info.mxu_column_size, info.num_mxus)
    assert facts.tensor_cores_per_chip == version.num_physical_tensor_cores_per_chip
    assert (facts.megacore, facts.lite) == (version.supports_megacore, version.is_lite)
    assert (facts.num_sublanes, facts.num_lanes) == tpu_facts.TILING_DEFAULT
    assert facts.generation in tpu_facts.GENERATIONS
    assert facts.default_scoped_vmem_limit_bytes == DEFAULT_SCOPED_VMEM_LIMIT_BYTES[facts.generation]
    assert facts.default_scoped_vmem_limit_bytes <= facts.vmem_capacity_bytes


def test_device_kinds_name_the_chip_jax_names():
    for version, kind in KINDS.items():
        name = chip_of_device_kind(kind)
        assert name is not None, kind
        assert chip_facts(name).jax_chip_version == version.value


def test_each_chip_s_device_kind_is_the_one_jax_reads_as_that_chip():
    for name in CHIPS:
        version = tpu_info.chip_version_from_device_kind(device_kind(name))
        assert version is not None and version.value == chip_facts(name).jax_chip_version
        assert chip_of_device_kind(device_kind(name)) == name


def test_default_scoped_vmem_limit_is_16_mib_up_to_v5_and_32_mib_from_v6e():
    limits = {name: chip_facts(name).default_scoped_vmem_limit_bytes // 2**20 for name in CHIPS}
    assert limits == {"v2": 16, "v3": 16, "v4": 16, "v4i": 16, "v5e": 16, "v5p": 16,
                      "v6e": 32, "v7": 32, "v7x": 32, "v8i": 32}


def test_every_chip_jax_s_tpu_info_knows_is_simulated():
    assert {chip_facts(name).jax_chip_version for name in CHIPS} == {
        v.value for v in tpu_info.ChipVersion}
    assert chip_of_device_kind("TPU8i") == "v8i"
    v8i = chip_facts("v8i")
    assert (v8i.generation, v8i.vmem_capacity_bytes, v8i.num_accumulators) == (
        8, 192 * 2**20, 256)
