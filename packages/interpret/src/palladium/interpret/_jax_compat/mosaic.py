"""jax's Mosaic (the TPU compiler's front end) and its TPU compile, as palladium's fidelity
checks use them: part of ``palladium.interpret._jax_compat`` (every ``jax._src`` name
palladium uses), re-exported there."""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
from jax._src import core as jax_core
from jax._src.interpreters import mlir
from jax._src.pallas.mosaic import core as mosaic_core
from jax._src.pallas.mosaic import tpu_info
from jax._src.pallas.pallas_call import pallas_call_p

__all__ = ["abstract_device", "answer_for_cpu", "compile_for_devices", "module_bytecode", "mosaic_context", "mosaic_failing_equations", "mosaic_lower", "mosaic_lowering_available", "simulated_tpu", "with_pallas_interpret"]

_MOSAIC_LOWERING = "jax._src.pallas.mosaic.lowering"

# --- Mosaic (the TPU compiler's front end), for the lowering check -------------------------
def mosaic_lowering_available() -> bool:
    """Whether this jax has the Mosaic entry point the lowering check uses (jax 0.10.0
    lacks ``lower_jaxpr_to_pipelined_module``; the check is then skipped)."""
    return hasattr(importlib.import_module(_MOSAIC_LOWERING),
                   "lower_jaxpr_to_pipelined_module")


def module_bytecode(lowered: Any) -> bytes:  # a jax.stages.Lowered's, locations kept
    return mlir.module_to_bytecode(lowered.compiler_ir("stablehlo"))


def compile_for_devices(bytecode: bytes, devices: np.ndarray, num_args: int,
                        num_outputs: int) -> str:
    """Compile ``module_bytecode``'s program for ``devices`` (a TPU topology's) as
    ``jax.jit``'s ``compile()`` does: its HLO text, or what the compiler raises."""
    from jax._src import compiler
    from jax._src.interpreters import pxla
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir

    backend = devices.flat[0].client
    with mlir.make_ir_context():
        module = ir.Module.parse(bytecode)
        options = pxla.create_compile_options(
            module, False, [False] * num_args, [False] * num_outputs, backend, devices, {})
        executable = compiler.backend_compile_and_load(
            backend, module, xla_client.DeviceList(tuple(devices.flat)), options, [])
    return "\n".join(m.to_string() for m in executable.hlo_modules())


def abstract_device(*, device_kind: str, num_cores: int) -> Any:
    """jax's abstract TPU device of ``device_kind`` (for an ``AbstractMesh``)."""
    from jax._src import mesh as mesh_lib

    has_platform = "platform" in inspect.signature(mesh_lib.AbstractDevice).parameters
    return mesh_lib.AbstractDevice(device_kind=device_kind, num_cores=num_cores,
                                   **({"platform": "tpu"} if has_platform else {}))


def mosaic_lower(ctx: Any, grid_mapping: Any, jaxpr: Any, compiler_params: Any, *,
                 device_kind: str, num_cores: int) -> Any:
    """Lower a ``pallas_call``'s kernel to a Mosaic module as jax's TPU lowering rule does
    (``lower_jaxpr_to_pipelined_module``, then the verifier the serialisation pass runs),
    with ``tpu_info`` answering for the TPU ``device_kind``; raises what Mosaic raises.

    ``ctx`` is the CPU lowering context of the ``pallas_call`` equation: it makes Mosaic
    assume a current libtpu and no forward-compatibility mode, as ``jax.jit`` on a TPU.
    """
    import copy

    from jax._src import mesh as mesh_lib
    from jax._src import sharding_impls
    from jax._src.lib.mlir import ir
    from jax._src.pallas.mosaic import lowering as mosaic_lowering
    from jax.experimental.mosaic.dialects import tpu as tpu_dialect

    params = (compiler_params if isinstance(compiler_params, mosaic_core.CompilerParams)
              else None)
    semantics = params.dimension_semantics if params is not None else None
    fuse = bool(getattr(params, "fuse_transposed_lhs_in_matmul", False))
    axis_context = ctx.module_context.axis_context
    jax_mesh = (axis_context.mesh if isinstance(axis_context, sharding_impls.SPMDAxisContext)
                else None)
    current = mesh_lib.get_abstract_mesh()
    device = abstract_device(device_kind=device_kind, num_cores=num_cores)
    tpu_mesh = mesh_lib.AbstractMesh(
        tuple(current.axis_sizes), tuple(current.axis_names),
        axis_types=tuple(current.axis_types), abstract_device=device)
    # A fresh MLIR context, and a module context of our own with an empty cache of
    # lowered functions (the caller's cache holds functions of its own context).
    mlir_ctx = mlir.make_ir_context()
    tpu_dialect.register_dialect(mlir_ctx)
    module_context = copy.copy(ctx.module_context)
    module_context.pallas_lowering_cache = {}
    ctx = ctx.replace(module_context=module_context)
    kwargs = {"fuse_transposed_lhs_in_matmul": fuse} if "fuse_transposed_lhs_in_matmul" in (
        inspect.signature(mosaic_lowering.lower_jaxpr_to_pipelined_module).parameters) else {}
    with (simulated_tpu(device_kind, num_cores), mesh_lib.use_abstract_mesh(tpu_mesh),
          mlir_ctx, ir.Location.unknown(mlir_ctx)):
        module = mosaic_lowering.lower_jaxpr_to_pipelined_module(
            ctx, grid_mapping, jaxpr, dimension_semantics=semantics,
            kernel_type=mosaic_core.CoreType.TC, mesh=jax_mesh, **kwargs)
        if not module.operation.verify():
            raise ValueError(f"Mosaic module failed verification:\n{module}")
    return module


def mosaic_context(ctx: Any) -> tuple[str, ...]:
    """What ``mosaic_lower`` takes from the lowering context ``ctx`` besides the kernel:
    the mesh of the surrounding ``shard_map``, the current abstract mesh, the lowering's
    platforms, as text."""
    from jax._src import mesh as mesh_lib
    from jax._src import sharding_impls

    axis_context = ctx.module_context.axis_context
    jax_mesh = (axis_context.mesh if isinstance(axis_context, sharding_impls.SPMDAxisContext)
                else None)
    return (repr(jax_mesh), repr(mesh_lib.get_abstract_mesh()),
            repr(ctx.module_context.platforms), type(axis_context).__name__)


# Mosaic's rules that ask ``tpu_info.get_tpu_info()`` for "the current TPU" (``sign``...)
# see the default device (jax enters each equation's own, usually empty, abstract mesh):
# on a CPU the CPU. Within ``simulated_tpu`` they get the simulated chip's facts instead.
_SIMULATED_TPU: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "palladium_simulated_tpu", default=None)
_JAX_GET_TPU_INFO = tpu_info.get_tpu_info


#: Where jax asks for "the current TPU" and the current device is the CPU (a kernel traced
#: on a CPU: jax's own ``pltpu.emit_pipeline`` asks for the tiling, jax's TPU interpreter's
#: callbacks for padded shapes), what palladium simulates answers instead of jax's
#: "Unsupported TPU device kind: cpu". Set by :func:`answer_for_cpu`.
_CPU_ANSWER: list[Callable[[], tuple[str, int]]] = []


def _get_tpu_info() -> Any:
    simulated = _SIMULATED_TPU.get()
    if simulated is None and _CPU_ANSWER and tpu_info.get_device_kind() == "cpu":
        simulated = _CPU_ANSWER[0]()
    if simulated is None:
        return _JAX_GET_TPU_INFO()
    version = tpu_info.chip_version_from_device_kind(simulated[0])
    return tpu_info.get_tpu_info_for_chip(version, simulated[1])


def answer_for_cpu(simulated: Callable[[], tuple[str, int]]) -> None:
    """From now on jax's ``tpu_info.get_tpu_info()``, asked on a CPU device (no TPU
    abstract device in the current mesh), describes the TPU ``simulated()`` names (its
    device kind and cores per device) rather than raising; on a TPU it is jax's answer."""
    _CPU_ANSWER[:] = [simulated]
    tpu_info.get_tpu_info = _get_tpu_info


@contextlib.contextmanager
def simulated_tpu(device_kind: str, num_cores: int) -> Any:
    """Within this context jax's ``tpu_info.get_tpu_info()`` describes the TPU of
    ``device_kind`` (this thread and task only)."""
    if tpu_info.get_tpu_info is not _get_tpu_info:
        tpu_info.get_tpu_info = _get_tpu_info
    token = _SIMULATED_TPU.set((device_kind, max(num_cores, 1)))
    try:
        yield
    finally:
        _SIMULATED_TPU.reset(token)


_MOSAIC_LOWERING_FILE = importlib.import_module(_MOSAIC_LOWERING).__file__


def mosaic_failing_equations(exc: BaseException | None) -> list:
    """The kernel equations Mosaic was lowering when it raised ``exc``, outermost first
    (the ``eqn`` of each ``jaxpr_subcomp`` frame of its traceback, or of its cause's);
    empty when the error came from outside any equation (e.g. the block-shape checks)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        eqns = []
        tb = exc.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            # Mosaic's own jaxpr_subcomp (not XLA's, around the kernel in a jitted call).
            if (frame.f_code.co_name == "jaxpr_subcomp" and "eqn" in frame.f_locals
                    and frame.f_code.co_filename == _MOSAIC_LOWERING_FILE):
                eqns.append(frame.f_locals["eqn"])
            tb = tb.tb_next
        if eqns:
            return eqns
        exc = exc.__cause__
    return []


def with_pallas_interpret(jaxpr: Any, value: Any) -> Any:
    """``jaxpr`` (closed or open) with every ``pallas_call`` at any depth (inside
    ``jit``, ``cond``, loops, custom derivatives; not inside a kernel's body) given
    ``interpret=value``: a program traced under palladium's interpret mode as jax would
    lower it for a TPU (``value=False``)."""

    def param(v: Any) -> Any:
        if isinstance(v, jax_core.ClosedJaxpr):
            inner = walk(v.jaxpr)
            return v if inner is v.jaxpr else jax_core.ClosedJaxpr(inner, v.consts)
        if isinstance(v, jax_core.Jaxpr):
            return walk(v)
        if type(v) in (tuple, list):  # (not a NamedTuple of parameters)
            new = [param(x) for x in v]
            return v if all(a is b for a, b in zip(new, v)) else type(v)(new)
        return v

    def walk(j: Any) -> Any:
        eqns, changed = [], False
        for eqn in j.eqns:
            if eqn.primitive is pallas_call_p:
                new = eqn.replace(params={**eqn.params, "interpret": value})
            else:
                params = {k: param(v) for k, v in eqn.params.items()}
                same = all(params[k] is v for k, v in eqn.params.items())
                new = eqn if same else eqn.replace(params=params)
            changed |= new is not eqn
            eqns.append(new)
        return j.replace(eqns=eqns) if changed else j

    return param(jaxpr)
