"""TPU tile shapes used to round the DMA of a ragged last block.

When an array dimension is not a multiple of its block size, the last block is copied
with its size rounded up to the TPU tile (for example 8 sublanes x 128 lanes for
32-bit types), never the whole block. The tile depends on the dtype and, for 1-D
arrays, on the TPU generation. The generation comes from, in order:

1. the abstract device of the current abstract mesh
   (``jax.sharding.use_abstract_mesh(AbstractMesh(..., abstract_device=...))``), when
   it is a TPU;
2. the default device, when it is a TPU;
3. otherwise :data:`DEFAULT_TPU_GENERATION` (on a CPU host, e.g. under an
   interpreter). jax 0.10.2's own emitter raises "Unsupported TPU device kind: cpu"
   there; palladium assumes a v4-or-newer TensorCore, whose tiles are the same for
   every generation >= 4.

Example::

    >>> import jax.numpy as jnp
    >>> from palladium.pipeline.tiling import infer_tiling
    >>> infer_tiling(jnp.zeros((600, 600), jnp.float32))
    (8, 128)
"""

from __future__ import annotations

import jax
import numpy as np

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline.errors import PipelineConfigError

Tiling = jc.Tiling

#: The TPU generation assumed when neither the abstract mesh nor the default device
#: is a TPU. Tiles are identical for every generation >= 4.
DEFAULT_TPU_GENERATION = 5

# The tile shapes are jax's own (``tpu_info.Tiling``): (sublanes, lanes) of 32-bit data.
_SUBLANES, _LANES = jc.Tiling.COMPACT.shape
(_SPARSE_CORE_TILE,) = jc.Tiling.SPARSE_CORE.shape


def _generation_of_kind(device_kind: str) -> int | None:
    chip = jc.chip_version_from_device_kind(device_kind)
    if chip is None:
        return None
    return jc.tpu_generation_of_chip(chip)


def tpu_generation() -> int:
    """The TPU generation to tile for (see the module docstring for the order)."""
    kind = jc.abstract_tpu_device_kind()
    if kind is not None:
        found = _generation_of_kind(kind)
        if found is not None:
            return found
    default = jax.devices()[0]
    if default.platform == "tpu":
        found = _generation_of_kind(default.device_kind)
        if found is not None:
            return found
    return DEFAULT_TPU_GENERATION


def _packing(dtype) -> int:
    # Elements per 32-bit word as Mosaic's tiling inference counts them: int4 by its bit
    # width, every other type by its itemsize. The same fact as the jax-free
    # ``palladium.shared_memory.tpu_facts.packing`` (this package may not import it);
    # integration_tests/test_tpu_facts_match_jax.py holds both to jax for every dtype.
    dtype = np.dtype(dtype)
    if dtype.name == "int4":
        return 8
    return max(4 // dtype.itemsize, 1)


def infer_tiling(value, tiling: Tiling | None = None) -> tuple[int | None, ...]:
    """The tile size of every dimension of ``value`` (an array, aval or ShapeDtypeStruct).

    Leading dimensions get 1, the tiled minor dimensions their tile size. A value
    without a dtype has an unknown tiling: ``None`` for every dimension.
    """
    shape = tuple(value.shape)
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return (None,) * len(shape)
    if not shape:
        raise PipelineConfigError("cannot tile a scalar: it has no dimension")
    packing = _packing(dtype)
    tiling = Tiling.COMPACT if tiling is None else tiling
    # Generations before v4 pack two rows per sublane tile.
    base = (2 if tpu_generation() < 4 else 1) * packing
    if tiling == Tiling.SPARSE_CORE:
        return (*(1,) * (len(shape) - 1), _SPARSE_CORE_TILE * packing)
    if len(shape) == 1:
        return (base * _LANES,)
    second_minor = shape[-2]
    rows = base
    while rows < min(second_minor, _SUBLANES):
        rows *= 2
    return (*(1,) * (len(shape) - 2), rows, _LANES)

