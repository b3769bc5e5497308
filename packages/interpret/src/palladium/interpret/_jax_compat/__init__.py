"""Every ``jax._src`` name the interpreter uses, in one place.

The kernel language (Pallas primitives, block-dim types, refs, indexers, memory spaces,
``pallas_call_p``) lives in jax's private modules; keeping every such import here makes a
jax upgrade a one-file change. Nothing here is jax's own TPU interpreter.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax import lax
from jax._src import api_util, source_info_util
from jax._src import config as jax_config
from jax._src import core as jax_core
from jax._src import linear_util as lu
from jax._src.custom_derivatives import custom_jvp_call_p, custom_vjp_call_p
from jax._src.interpreters import mlir
from jax._src.interpreters import partial_eval as pe
from jax._src.lax.control_flow.conditionals import cond_p
from jax._src.lax.control_flow.loops import scan_p, while_p
from jax._src.lax.parallel import axis_index_p
from jax._src.pallas import core as pallas_core
from jax._src.pallas import primitives as pallas_primitives
from jax._src.pallas.mosaic import core as mosaic_core
from jax._src.pallas.mosaic import primitives as mosaic_primitives
from jax._src.pallas.mosaic import tpu_info
from jax._src.pallas.pallas_call import pallas_call_p
from jax._src.pjit import jit_p
from jax._src.state import indexing
from jax._src.state import primitives as state_primitives
from jax._src.state import types as state_types

# --- pallas_call and its parameters ---------------------------------------------------
PALLAS_CALL_P = pallas_call_p
Blocked = pallas_core.Blocked
Element = pallas_core.Element
Squeezed = pallas_core.Squeezed
BoundedSlice = getattr(pallas_core, "BoundedSlice", None)
DynamicGridDim = pallas_core.DynamicGridDim
GridMapping = pallas_core.GridMapping
BlockMapping = pallas_core.BlockMapping
TensorCoreMesh = mosaic_core.TensorCoreMesh
PARALLEL = getattr(mosaic_core, "PARALLEL", None)

# --- memory spaces and semaphore dtypes -------------------------------------------------
ANY = pallas_core.MemorySpace.ANY
#: ``pl.HOST``: the host's memory (jax 0.10.2); None in a jax without it.
HOST = getattr(pallas_core.MemorySpace, "HOST", None)
# jax 0.10.0 has no MemorySpace.DEFAULT (a block without a memory space keeps None).
DEFAULT = getattr(pallas_core.MemorySpace, "DEFAULT", None)
HBM = mosaic_core.MemorySpace.HBM
VMEM = mosaic_core.MemorySpace.VMEM
SMEM = mosaic_core.MemorySpace.SMEM
SEMAPHORE = mosaic_core.MemorySpace.SEMAPHORE
VMEM_SHARED = mosaic_core.MemorySpace.VMEM_SHARED
BarrierSemaphoreDType = pallas_core.BarrierSemaphore
DMASemaphoreDType = mosaic_core.DMASemaphore

# --- refs and transforms -----------------------------------------------------------------
AbstractRef = state_types.AbstractRef
TransformedRef = state_types.TransformedRef
NDIndexer = indexing.NDIndexer
Slice = indexing.Slice
ReshapeTransform = state_types.ReshapeTransform
BitcastTransform = state_types.BitcastTransform
TransposeTransform = state_types.TransposeTransform

# --- primitives ---------------------------------------------------------------------------
program_id_p = pallas_primitives.program_id_p
num_programs_p = pallas_primitives.num_programs_p
multiple_of_p = pallas_primitives.multiple_of_p
load_p = pallas_primitives.load_p
masked_swap_p = pallas_primitives.swap_p
run_scoped_p = pallas_primitives.run_scoped_p
semaphore_read_p = pallas_primitives.semaphore_read_p
semaphore_signal_p = pallas_primitives.semaphore_signal_p
semaphore_wait_p = pallas_primitives.semaphore_wait_p
delay_p = pallas_primitives.delay_p
DeviceIdType = pallas_primitives.DeviceIdType

get_p = state_primitives.get_p
swap_p = state_primitives.swap_p
addupdate_p = state_primitives.addupdate_p

dma_start_p = mosaic_primitives.dma_start_p
dma_wait_p = mosaic_primitives.dma_wait_p
get_barrier_semaphore_p = mosaic_primitives.get_barrier_semaphore_p
prng_seed_p = mosaic_primitives.prng_seed_p
prng_random_bits_p = mosaic_primitives.prng_random_bits_p
trace_value_p = mosaic_primitives.trace_value_p
touch_p = mosaic_primitives.touch_p
tpu_bitcast_p = mosaic_primitives.bitcast_p
tpu_roll_p = mosaic_primitives.roll_p
reciprocal_p = getattr(pallas_primitives, "reciprocal_p", None)
# Primitives the interpreter refuses by name (see eval/rules_unsupported.py); None where
# the installed jax lacks one.
matmul_push_rhs_p = getattr(mosaic_primitives, "matmul_push_rhs_p", None)
matmul_acc_lhs_p = getattr(mosaic_primitives, "matmul_acc_lhs_p", None)
matmul_pop_p = getattr(mosaic_primitives, "matmul_pop_p", None)
pack_elementwise_p = getattr(mosaic_primitives, "pack_elementwise_p", None)
unpack_elementwise_p = getattr(mosaic_primitives, "unpack_elementwise_p", None)
stochastic_round_p = getattr(mosaic_primitives, "stochastic_round_p", None)
split_key_p = getattr(mosaic_primitives, "split_key_p", None)
join_key_p = getattr(mosaic_primitives, "join_key_p", None)
empty_ref_p = getattr(jax_core, "empty_ref_p", None)


def mosaic_lowering_primitives() -> set:
    """Every primitive jax's Pallas TPU lowering has a rule for (any core type): the
    primitives a TPU kernel can contain."""
    from jax._src.pallas.mosaic import lowering as mosaic_lowering

    return {p for table in mosaic_lowering.lowering_rules.values() for p in table}


# jax 0.10.0's DMA primitives carry every ref split from its transforms: operands
# (src, src_transforms, dst, dst_transforms, dst_sem, dst_sem_transforms, src_sem,
# src_sem_transforms, device_id); later ones (src, dst, dst_sem, src_sem, device_id)
# with transformed refs as pytree nodes.
_DMA_SPLITS_TRANSFORMS = (
    "src_transforms" in inspect.signature(mosaic_primitives._dma_flatten).parameters)


def dma_operands(tree: Any, invals: Any) -> tuple:
    """``(src, dst, dst_sem, src_sem, device_id)`` of a ``dma_start``/``dma_wait``
    equation's operands; a ref with transforms comes back as a ``TransformedRef``."""
    if not _DMA_SPLITS_TRANSFORMS:
        return tuple(tree.unflatten(invals))
    (src, src_t, dst, dst_t, dst_sem, dst_sem_t, src_sem, src_sem_t,
     device_id) = mosaic_primitives._dma_unflatten(tree, invals)

    def join(ref: Any, transforms: Any) -> Any:
        return state_types.TransformedRef(ref, tuple(transforms)) if transforms else ref

    return (join(src, src_t), join(dst, dst_t), join(dst_sem, dst_sem_t),
            join(src_sem, src_sem_t), device_id)


@functools.cache
def xla_divides_by_scalar_reciprocal() -> bool:
    """Whether XLA on CPU computes ``x / s`` (an array by a rank-0 divisor) as
    ``x * (1 / s)``; the numpy rule of ``div`` must round the same way."""
    # jaxlib 0.10.0's XLA divides exactly; 0.10.2's multiplies by the reciprocal.
    x, divisor = np.arange(1, 65, dtype=np.float32), np.float32(3.0)
    return not np.array_equal(np.asarray(lax.div_p.bind(x, divisor)), x / divisor)


# jax 0.10.0 has no lax.mulhi_p (None there: no numpy rule is registered for it).
mulhi_p = getattr(lax, "mulhi_p", None)
cond_p = cond_p
while_p = while_p
scan_p = scan_p
jit_p = jit_p
custom_jvp_call_p = custom_jvp_call_p
custom_vjp_call_p = custom_vjp_call_p
axis_index_p = axis_index_p

# --- jax core ------------------------------------------------------------------------------
Primitive = jax_core.Primitive
Jaxpr = jax_core.Jaxpr
ClosedJaxpr = jax_core.ClosedJaxpr
Literal = jax_core.Literal
Var = jax_core.Var
DropVar = jax_core.DropVar
ShapedArray = jax_core.ShapedArray
trace_to_jaxpr_dynamic = pe.trace_to_jaxpr_dynamic


def sub_jaxpr(invars: Sequence[Any], outvars: Sequence[Any], eqns: Sequence[Any],
              what: str) -> Any:
    """A jaxpr of some equations of another (``what`` names it in jax's debug info)."""
    info = jax_core.DebugInfo(what, what, tuple(str(v) for v in invars), None)
    return jax_core.Jaxpr([], list(invars), list(outvars), list(eqns), debug_info=info)
eval_jaxpr = jax_core.eval_jaxpr
source_info_util = source_info_util
register_lowering = mlir.register_lowering
lower_fun = mlir.lower_fun


def original_cpu_lowering(primitive: Any, platform: str = "cpu") -> Any:
    """The lowering rule jax itself uses for ``primitive`` on ``platform`` (before ours)."""
    specific = mlir._platform_specific_lowerings.get(platform, {}).get(primitive)
    entry = specific if specific is not None else mlir._lowerings[primitive]
    return entry.rule


def has_cpu_lowering(primitive: Any) -> bool:
    """Whether jax can lower ``primitive`` for CPU (so ``bind`` evaluates it)."""
    return (primitive in mlir._platform_specific_lowerings.get("cpu", {})
            or primitive in mlir._lowerings)


def route_direct_pallas_call_lowering(rule: Any) -> None:
    """Make jax code that calls ``pallas_call._pallas_call_lowering`` directly (the CPU
    fallback lowering of ``core_map``/``mpmd_map``) go through ``rule`` too. ``rule``
    must hand non-palladium calls to ``original_cpu_lowering(PALLAS_CALL_P)``."""
    from jax._src.pallas import pallas_call as pallas_call_module

    pallas_call_module._pallas_call_lowering = rule


def tpu_interpret_mode_config() -> Any:
    """The config option ``pl.pallas_call`` consults for a forced interpret mode."""
    return jax_config.pallas_tpu_interpret_mode_context_manager


def pallas_debug_checks_enabled() -> bool:
    """Whether ``pl.debug_check`` checks (``pl.enable_debug_checks``) in this context
    (jax 0.10.0 has no ``pallas_core.debug_checks_enabled``; the config state is in both)."""
    from jax.experimental import pallas as pl

    return bool(pl.enable_debug_checks.value)


def checkify_check_parts(err_tree: Any, args: Any) -> tuple[Any, str]:
    """The failure predicate and the formatted message of one ``check_p`` equation (what
    jax's Mosaic lowering reads of it): the predicate is True when the check fails."""
    from jax import tree_util
    from jax._src import checkify

    error = tree_util.tree_unflatten(err_tree, list(args))
    [pred] = error._pred.values()
    [exception_tree] = error._metadata.values()
    [payload] = error._payload.values()
    exception = tree_util.tree_unflatten(exception_tree, payload)
    if isinstance(exception, checkify.FailedCheckError):
        message = exception.fmt_string.format(*exception.args, **exception.kwargs)
    else:
        message = str(exception)
    return pred, message


def _check_p() -> Any:
    from jax._src import checkify

    return checkify.check_p


check_p = _check_p()


def user_frame(source_info: Any) -> tuple[str, int] | None:
    """(file, line) of the innermost user frame of an equation's source info."""
    if source_info is None or source_info.traceback is None:
        return None
    frame = source_info_util.user_frame(source_info.traceback)
    if frame is None:
        return None
    return frame.file_name, frame.start_line


def trace_to_closed_jaxpr(fn: Any, avals: Any, name: str) -> Any:
    """Trace ``fn(*args) -> list`` on ``avals`` (refs allowed) to a ClosedJaxpr."""
    dbg = api_util.debug_info(name, fn, tuple(avals), {})
    jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(lu.wrap_init(fn, debug_info=dbg), list(avals))
    return jax_core.ClosedJaxpr(jaxpr, consts)


def axis_sizes() -> dict:
    """``{axis name: size}`` of the named axes in scope (a ``shard_map``'s mesh axes)."""
    return dict(jax_core.get_axis_env().axis_sizes)


def lowering_call_frame(ctx: Any) -> tuple[str, int, str] | None:
    """(file, line, function name) of the user code that called ``pl.pallas_call(...)(x)``
    (or ``pl.core_map``) whose equation a lowering rule lowers, or None.

    jax lowers without the equation's traceback in ``ctx`` (lowerings are cached), but
    under ``jit`` the equation's traceback is the current source-info context. An eager
    call binds the primitive inside jax's own wrapper, so there the live stack holds the
    user's call (jax reuses the executable for identical eager calls: the first call's
    line).
    """
    import os
    import sys
    import types

    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # interpret/

    def ours(file_name: str) -> bool:
        return os.path.abspath(file_name).startswith(own)

    for traceback in (getattr(ctx, "traceback", None), source_info_util.current().traceback):
        for frame in source_info_util.user_frames(traceback):
            if not ours(frame.file_name):
                return frame.file_name, frame.start_line, frame.function_name
    live: types.FrameType | None = sys._getframe(1)
    while live is not None:
        file_name = live.f_code.co_filename
        if source_info_util.is_user_filename(file_name) and not ours(file_name):
            return file_name, live.f_lineno, live.f_code.co_name
        live = live.f_back
    return None


def emit_cpu_host_callback(ctx: Any, callback: Callable[..., Any], operands: Sequence[Any]) -> Any:
    """Lower a call of ``callback(*numpy views of the operands) -> tuple of arrays``.

    The FFI handler hands the callback read-only numpy views of the operand buffers as
    they are (no ``device_put`` onto CPU device 0, unlike ``jax.pure_callback``'s
    implementation) and copies the returned arrays into the result buffers. Under a
    fully manual ``shard_map`` the call runs once per device; else once, on device 0.
    """
    from jax._src import callback as jax_callback

    sharding = jax_callback._callback_op_sharding(
        ctx.module_context.axis_context, None, ctx.avals_out)
    results, _, _ = jax_callback.emit_python_callback(
        ctx, callback, None, list(operands), ctx.avals_in, ctx.avals_out,
        has_side_effect=False, returns_token=False, sharding=sharding)
    return results


def itemsize_bits(dtype: Any) -> int:
    """Bits per element of ``dtype`` as XLA stores it (4 for int4: packed two to a byte,
    whatever numpy's ``itemsize`` says; 8 for bool)."""
    from jax._src import dtypes

    return int(dtypes.itemsize_bits(dtype))


def register_cpu_ffi_target(name: str, function_pointer: int) -> None:
    """Register a C function pointer (an XLA FFI handler) as the CPU custom call
    target ``name``."""
    import jax.ffi

    capsule = jax.ffi.pycapsule(ctypes.cast(function_pointer, ctypes.c_void_p))
    jax.ffi.register_ffi_target(name, capsule, platform="cpu")


def lower_ffi_call(ctx: Any, name: str, operands: Sequence[Any], **attrs: Any) -> Any:
    """The results of a call of FFI target ``name`` (``attrs``: its attributes), placed
    as jax places a host callback (under a manual ``shard_map``, once per device; else
    on device 0)."""
    import jax.ffi
    from jax._src import callback as jax_callback

    op = jax.ffi.build_ffi_lowering_function(name, has_side_effect=False)(
        ctx, *operands, **attrs)
    sharding = jax_callback._callback_op_sharding(
        ctx.module_context.axis_context, None, ctx.avals_out)
    if sharding is not None:
        if len(inspect.signature(mlir.set_sharding).parameters) == 3:  # jax 0.10.2
            mlir.set_sharding(ctx.module_context, op, sharding)
        else:  # jax 0.10.0: (op, sharding)
            mlir.set_sharding(op, sharding)  # type: ignore[call-arg]
    return op.results


def keep_with_executable(ctx: Any, obj: Any) -> None:
    """Keep the callable ``obj`` as long as the executable compiled from ``ctx``'s module
    (among its host callbacks, where jax keeps its own callbacks)."""
    ctx.module_context.add_host_callback(obj)


def callback_logger() -> Any:
    """The logger on which jax reports a failing host callback ("jax.pure_callback
    failed", with the traceback)."""
    import logging

    from jax._src import callback as jax_callback

    return getattr(jax_callback, "logger", None) or logging.getLogger(jax_callback.__name__)


# --- TPU hardware facts (jax's own table; palladium.interpret.chip reads it) -------------
TpuChipVersion = tpu_info.ChipVersion
tpu_chip_version_from_device_kind = tpu_info.chip_version_from_device_kind


def tpu_info_for_chip(chip_version: str) -> tpu_info.TpuInfo:
    """jax's per-TensorCore facts of a chip (``ChipVersion`` value: "v5e", "7x", ...), one
    TensorCore per logical device (split mode for the megacore chips)."""
    return tpu_info.get_tpu_info_for_chip(tpu_info.ChipVersion(chip_version), 1)


from palladium.interpret._jax_compat.mosaic import (  # noqa: E402  (re-exported)
    abstract_device as abstract_device,
)
from palladium.interpret._jax_compat.mosaic import answer_for_cpu as answer_for_cpu  # noqa: E402
from palladium.interpret._jax_compat.mosaic import (  # noqa: E402
    compile_for_devices as compile_for_devices,
)
from palladium.interpret._jax_compat.mosaic import (  # noqa: E402
    module_bytecode as module_bytecode,
)
from palladium.interpret._jax_compat.mosaic import (  # noqa: E402
    mosaic_context as mosaic_context,
)
from palladium.interpret._jax_compat.mosaic import (  # noqa: E402
    mosaic_failing_equations as mosaic_failing_equations,
)
from palladium.interpret._jax_compat.mosaic import mosaic_lower as mosaic_lower  # noqa: E402
from palladium.interpret._jax_compat.mosaic import (  # noqa: E402
    mosaic_lowering_available as mosaic_lowering_available,
)
from palladium.interpret._jax_compat.mosaic import simulated_tpu as simulated_tpu  # noqa: E402
from palladium.interpret._jax_compat.mosaic import (  # noqa: E402
    with_pallas_interpret as with_pallas_interpret,
)


def default_prng_is_partitionable_threefry() -> bool:
    """Whether jax's default PRNG is Threefry-2x32 in its partitionable layout (jax
    0.10's default; ``grid_order`` computes its permutations with numpy for it)."""
    return (getattr(jax.config, "jax_default_prng_impl", None) == "threefry2x32"
            and bool(getattr(jax.config, "jax_threefry_partitionable", False)))


# --- jax.distributed (a launch split over processes) --------------------------------------
def distributed_client() -> Any:
    """The coordination-service client of ``jax.distributed.initialize`` (None when
    this process is not part of a multi-process run)."""
    from jax._src import distributed

    return distributed.global_state.client


def coordinator_address() -> str:
    """``host:port`` of the coordination service this process's ``jax.distributed``
    client talks to."""
    from jax._src import distributed

    return str(distributed.global_state.coordinator_address)


from palladium.interpret._jax_compat.dma_tree import (  # noqa: E402,F401
    dma_index_layout,
    dma_placing_leaves,
)
