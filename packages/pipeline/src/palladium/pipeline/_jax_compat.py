"""Every ``jax._src`` name palladium.pipeline uses, in one place.

The Pallas kernel language (block specs and block-dim kinds, refs and indexers, TPU
memory spaces, semaphores, the DMA primitives, the Mosaic lowering hooks) lives in
``jax._src``. Keeping every such import here makes a jax upgrade a one-file change.
Nothing here implements the pipeline: that is palladium's own code.
"""

from __future__ import annotations

import inspect

from jax._src import api_util as _api_util
from jax._src import config as _config
from jax._src import core as jax_core
from jax._src import effects as jax_effects
from jax._src import linear_util as _lu
from jax._src import mesh as _mesh_lib
from jax._src import state as _state
from jax._src import tree_util as _tree_util
from jax._src.interpreters import batching, mlir
from jax._src.interpreters import partial_eval as pe
from jax._src.pallas import core as _pallas_core
from jax._src.pallas import helpers as _pallas_helpers
from jax._src.pallas import hlo_interpreter as _hlo_interpreter
from jax._src.pallas import primitives as _pallas_primitives
from jax._src.pallas.mosaic import core as _tpu_core
from jax._src.pallas.mosaic import helpers as _tpu_helpers
from jax._src.pallas.mosaic import lowering as _tpu_lowering
from jax._src.pallas.mosaic import primitives as _tpu_primitives
from jax._src.pallas.mosaic import tpu_info as _tpu_info
from jax._src.state import discharge as state_discharge
from jax._src.state import indexing as _indexing

# --- block specs and block-dim kinds -------------------------------------------------
BlockSpec = _pallas_core.BlockSpec
Blocked = _pallas_core.Blocked
BoundedSlice = _pallas_core.BoundedSlice
Element = _pallas_core.Element
Squeezed = _pallas_core.Squeezed
Indirect = getattr(_pallas_core, "Indirect", None)
get_block_size = _pallas_core.get_block_size
no_block_spec = _pallas_core.no_block_spec
JaxBuffered = _pallas_core.Buffered
RevisitMode = _pallas_core.RevisitMode
GridAxis = _pallas_core.GridAxis
grid_env = _pallas_core.grid_env
current_grid_env = _pallas_core.current_grid_env
is_dynamic_dim = _pallas_core.is_dynamic_dim
tracing_grid_env = _pallas_core.tracing_grid_env

# --- memory spaces and semaphores ----------------------------------------------------
ANY = _pallas_core.MemorySpace.ANY
PallasMemorySpace = _pallas_core.MemorySpace
TPUMemorySpace = _tpu_core.MemorySpace
VMEM = _tpu_core.MemorySpace.VMEM
SMEM = _tpu_core.MemorySpace.SMEM
HBM = _tpu_core.MemorySpace.HBM
CoreType = _tpu_core.CoreType
memory_space_to_tpu_memory_space = _tpu_core.memory_space_to_tpu_memory_space
SemaphoreType = _tpu_core.SemaphoreType
GridDimensionSemantics = _tpu_core.GridDimensionSemantics
PARALLEL = _tpu_core.PARALLEL
ARBITRARY = _tpu_core.ARBITRARY

# --- kernel primitives ---------------------------------------------------------------
run_scoped = _pallas_primitives.run_scoped
program_id = _pallas_primitives.program_id
num_programs = _pallas_primitives.num_programs
multiple_of = _pallas_primitives.multiple_of
when = _pallas_helpers.when
make_async_copy = _tpu_primitives.make_async_copy
AsyncCopyDescriptor = _tpu_primitives.AsyncCopyDescriptor
dma_start_p = _tpu_primitives.dma_start_p
dma_wait_p = _tpu_primitives.dma_wait_p
get_ref_and_transforms = _tpu_primitives._get_ref_and_transforms
# jax 0.10.0's DMA primitives carry every ref split from its transforms: operands
# (src, src_transforms, dst, dst_transforms, dst_sem, dst_sem_transforms, src_sem,
# src_sem_transforms, device_id); later ones (src, dst, dst_sem, src_sem, device_id).
_DMA_SPLITS_TRANSFORMS = (
    "src_transforms" in inspect.signature(_tpu_primitives._dma_flatten).parameters)


def dma_flatten(src, dst, dst_sem, src_sem=None, device_id=None):
    """``(flat operands, tree)`` of a ``dma_start``/``dma_wait`` of (transformed) refs."""
    if not _DMA_SPLITS_TRANSFORMS:
        return _tpu_primitives._dma_flatten(src, dst, dst_sem, src_sem, device_id)
    src_sem_parts = (None, None) if src_sem is None else get_ref_and_transforms(src_sem)
    return _tpu_primitives._dma_flatten(
        *get_ref_and_transforms(src), *get_ref_and_transforms(dst),
        *get_ref_and_transforms(dst_sem), *src_sem_parts, device_id)


# jax 0.10.0's dma_wait has no ``insert_dummy_device`` parameter.
DMA_WAIT_PARAMS: dict = (
    {"insert_dummy_device": False}
    if "insert_dummy_device"
    in inspect.signature(_tpu_primitives._dma_wait_abstract_eval).parameters
    else {}
)
DeviceIdType = _pallas_primitives.DeviceIdType
tpu_sync_copy = _tpu_helpers.sync_copy

# --- refs and indexers ---------------------------------------------------------------
TransformedRef = _state.TransformedRef
AbstractRef = _state.AbstractRef
ReadEffect = _state.ReadEffect
WriteEffect = _state.WriteEffect
Slice = _indexing.Slice
ds = _indexing.ds

# --- TPU generation ------------------------------------------------------------------
Tiling = _tpu_info.Tiling
ChipVersion = _tpu_info.ChipVersion
chip_version_from_device_kind = _tpu_info.chip_version_from_device_kind


def abstract_device():
    """The abstract device of the current abstract mesh, or None."""
    return _mesh_lib.get_abstract_mesh().abstract_device


def abstract_tpu_device_kind() -> str | None:
    """The device kind of the current abstract mesh's abstract device if it is a TPU."""
    device = abstract_device()
    if device is None:
        return None
    # jax 0.10.0's AbstractDevice has no ``platform``: a kind naming a TPU chip is a TPU.
    platform = getattr(device, "platform", None)
    if platform is None:
        is_tpu = chip_version_from_device_kind(device.device_kind) is not None
    else:
        is_tpu = platform == "tpu"
    return device.device_kind if is_tpu else None


def tpu_generation_of_chip(chip_version) -> int:
    """The TPU generation number of a ``ChipVersion`` (v5e -> 5, TPU7x -> 7)."""
    return _tpu_info.get_tpu_info_for_chip(chip_version, 1).generation


# --- tracing, lowering, discharge ----------------------------------------------------
mutable_array_checks = _config.mutable_array_checks
Tracer = jax_core.Tracer
ShapedArray = jax_core.ShapedArray
AbstractValue = jax_core.AbstractValue
Primitive = jax_core.Primitive
ClosedJaxpr = jax_core.ClosedJaxpr
eval_jaxpr = jax_core.eval_jaxpr
JaxprInputEffect = jax_effects.JaxprInputEffect


def input_effect_position(effect, jaxpr) -> int:
    """Index in ``jaxpr.constvars + jaxpr.invars`` of the input ``effect`` is on."""
    # jax 0.10.0: ``effect.input_index`` is that index; later ``effect.input`` is the Var.
    if hasattr(effect, "input_index"):
        return effect.input_index
    return [*jaxpr.constvars, *jaxpr.invars].index(effect.input)


def input_effect_at(effect, position: int):
    """``effect`` moved to the operand at ``position`` (of an equation)."""
    # jax 0.10.0's ``replace`` takes the keyword ``input_index``.
    if hasattr(effect, "input_index"):
        return effect.replace(input_index=position)
    return effect.replace(position)


register_mosaic_lowering_rule = _tpu_lowering.register_lowering_rule
mosaic_jaxpr_subcomp = _tpu_lowering.jaxpr_subcomp
# jax 0.10.0's Mosaic lowering has no per-equation cache (no ``_uncacheable_primitives``):
# registering there is then a no-op.
mosaic_uncacheable_primitives: set = getattr(_tpu_lowering, "_uncacheable_primitives", set())
trace_to_jaxpr_dynamic = pe.trace_to_jaxpr_dynamic
convert_constvars_jaxpr = pe.convert_constvars_jaxpr
register_discharge_rule = state_discharge.register_discharge_rule


def discharge_state(closed_jaxpr, *, should_discharge=True):
    """``closed_jaxpr`` with its ref inputs discharged to values (a ClosedJaxpr)."""
    # jax 0.10.0: ``discharge_state(jaxpr, consts) -> (jaxpr, consts)``, and the
    # ClosedJaxpr form is ``discharge_state2``.
    legacy = getattr(state_discharge, "discharge_state2", None)
    if legacy is not None:
        return legacy(closed_jaxpr, should_discharge)
    return state_discharge.discharge_state(closed_jaxpr, should_discharge=should_discharge)


fancy_primitive_batchers = batching.fancy_primitive_batchers
primitive_batchers = batching.primitive_batchers
register_lowering = mlir.register_lowering
lower_fun = mlir.lower_fun
register_partial_discharge_rule = state_discharge.register_partial_discharge_rule
transform_array = state_discharge.transform_array
transform_swap_array = state_discharge.transform_swap_array
mosaic_lower_fun = _tpu_lowering.lower_fun


def mosaic_transform_ref(ref, ref_ty, block_shape, transforms):
    """``(memref view, its block shape)`` of ``ref`` under ``transforms`` (Mosaic)."""
    # jax 0.10.0's ``_transform_ref`` needs the base aval and block shape; later ones
    # also accept them as transformed refs and unwrap them.
    if isinstance(ref_ty, TransformedRef):
        ref_ty = ref_ty.ref
    if isinstance(block_shape, TransformedRef):
        block_shape = block_shape.ref
    return _tpu_lowering._transform_ref(ref, ref_ty, block_shape, transforms)


enable_checks = _config.enable_checks
#: jax's switch for the emit_pipeline primitive path (``jax_use_emit_pipeline_primitive``);
#: None on a jax without it.
use_emit_pipeline_primitive = getattr(_config, "use_emit_pipeline_primitive", None)
wrap_init = _lu.wrap_init
debug_info = _api_util.debug_info


def ref_tree_flatten(*trees):
    """``(leaves, treedef)`` of ``trees`` with transformed refs as internal nodes."""
    return _tree_util.tracing_registry.flatten(trees)
resolve_physical_types = _hlo_interpreter.resolve_physical_types


def exclude_from_user_frames(path: str) -> None:
    """Treat source files under ``path`` as library code, like jax's own, when jax (and
    interpreters reading equations' source info) look for the user's line."""
    from jax._src import source_info_util

    source_info_util.register_exclusion(path)
