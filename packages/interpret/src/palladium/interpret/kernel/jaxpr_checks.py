"""Checks of a kernel's jaxpr when it is prepared (at trace time), before any launch.

A kernel that reads or writes an HBM ref directly, or allocates HBM in ``run_scoped``
(unless ``InterpretParams.allow_hbm_allocation_in_run_scoped``), is wrong whatever its
inputs: Mosaic rejects it when it compiles the kernel, and so does palladium when it
lowers the ``pallas_call``, with an ``InvalidKernelError`` (a ``KernelError`` and a
``ValueError``, as jax's interpreter raises). Only refs whose type names HBM or ANY are
checked here; the evaluator still checks every access at run time.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

from palladium.interpret import _jax_compat as jc
from palladium.interpret import errors
from palladium.interpret.eval.jaxprs import jaxprs_in
from palladium.interpret.eval.primitive_groups import REF_ACCESSES
from palladium.interpret.kernel.blocks import memory_space_of
from palladium.interpret.params_validation import check_cores_per_device
from palladium.shared_memory import MemorySpace


def _in_hbm(aval: Any) -> bool:
    space = getattr(aval, "memory_space", None)
    return space is not None and memory_space_of(space) in (MemorySpace.HBM, MemorySpace.HOST)


def _home(aval: Any) -> str:
    """How messages name where an HBM or host ref lives."""
    host = memory_space_of(aval.memory_space) == MemorySpace.HOST
    return "the host's memory" if host else "HBM"


def _where(kernel_name: str, eqn: Any) -> str:
    frame = jc.user_frame(eqn.source_info)
    line = f" ({os.path.basename(frame[0])}:{frame[1]})" if frame is not None else ""
    return f"kernel '{kernel_name}'{line}"


def _arg_names(jaxpr: Any) -> list[Any]:
    names = getattr(jaxpr.debug_info, "arg_names", None) if jaxpr.debug_info else None
    return list(names) if names is not None else []


def _sub_jaxprs(eqn: Any) -> Iterator[tuple[Any, list[Any]]]:
    """Each nested jaxpr of ``eqn`` with the outer operands its invars stand for (None
    where the correspondence is not positional)."""
    for value in eqn.params.values():
        for jx in jaxprs_in(value):
            n, m = len(jx.invars), len(eqn.invars)
            if n == m:
                yield jx, list(eqn.invars)
            elif n == m - 1:  # cond: the branch index is not passed on
                yield jx, list(eqn.invars[1:])
            else:
                yield jx, [None] * n


def check_jaxpr(jaxpr: Any, kernel_name: str, arg_names: list[str], *,
                 allow_hbm_allocation_in_run_scoped: bool) -> None:
    """Raise ``InvalidKernelError`` for the first direct HBM access or (not allowed)
    ``run_scoped`` HBM allocation in ``jaxpr`` (the kernel's, with its operands' names)."""
    seen: set[int] = set()

    def walk(jx: Any, names: dict[int, str]) -> None:
        if id(jx) in seen:
            return
        seen.add(id(jx))
        for eqn in jx.eqns:
            access = REF_ACCESSES.get(eqn.primitive)
            if access is not None and eqn.invars and _in_hbm(eqn.invars[0].aval):
                ref = names.get(id(eqn.invars[0]), "a ref")
                raise errors.InvalidKernelError(
                    f"{_where(kernel_name, eqn)}: {access.verb} of '{ref}', which lives in "
                    f"{_home(eqn.invars[0].aval)} (memory space "
                    f"{eqn.invars[0].aval.memory_space}): a TPU kernel cannot read or write "
                    f"{_home(eqn.invars[0].aval)} directly; copy it with pltpu.sync_copy or "
                    f"pltpu.async_copy. {errors.jax_hbm_reference_phrase(access[1])}"
                )
            if eqn.primitive is jc.run_scoped_p and not allow_hbm_allocation_in_run_scoped:
                body = eqn.params["jaxpr"]
                scoped = _arg_names(body)
                for i, var in enumerate(body.invars):
                    if _in_hbm(var.aval):
                        name = scoped[i] if i < len(scoped) and scoped[i] else f"run_scoped[{i}]"
                        raise errors.InvalidKernelError(
                            f"{_where(kernel_name, eqn)}: run_scoped allocates '{name}' in "
                            f"{_home(var.aval)}, which a TPU kernel cannot do; pass InterpretParams("
                            f"allow_hbm_allocation_in_run_scoped=True) to simulate it anyway. "
                            f"{errors.JAX_HBM_IN_RUN_SCOPED}"
                        )
            for sub, outer in _sub_jaxprs(eqn):
                own = _arg_names(sub)
                sub_names = {}
                for i, var in enumerate(sub.invars):
                    if i < len(outer) and id(outer[i]) in names:
                        sub_names[id(var)] = names[id(outer[i])]
                    elif i < len(own) and own[i]:
                        sub_names[id(var)] = str(own[i])
                walk(sub, sub_names)

    walk(jaxpr, {id(v): n for v, n in zip(jaxpr.invars, arg_names) if n})


def is_parallel(semantic: Any) -> bool:
    """Whether a ``dimension_semantics`` entry splits its dimension over the cores."""
    text = str(getattr(semantic, "name", semantic)).lower()
    return text in ("parallel", "core_parallel", "subcore_parallel")


def check_grid(kernel: Any) -> None:
    """Raise ``InvalidKernelError`` for a negative static grid size and
    ``DynamicParallelDimensionError`` if a parallel grid dimension is dynamic."""
    gm = kernel.grid_mapping
    for d, size in enumerate(gm.grid):
        if isinstance(size, int) and size < 0:
            raise errors.InvalidKernelError(negative_grid_message(kernel, d, size, tuple(gm.grid)))
    cp = kernel.compiler_params
    semantics = getattr(cp, "dimension_semantics", None) if cp is not None else None
    if not semantics or kernel.is_core_map:
        return
    vmapped = set(gm.vmapped_dims)
    own_dims = [d for d in range(len(gm.grid)) if d not in vmapped]
    for d, semantic in zip(own_dims, semantics):
        size = gm.grid[d]
        if is_parallel(semantic) and (size is None or isinstance(size, jc.DynamicGridDim)):
            raise errors.DynamicParallelDimensionError(
                f"{kernel.named()}: grid dimension {d} has parallel semantics "
                f"(dimension_semantics={tuple(semantics)}) but a size known only at run "
                f"time; the cores split a parallel dimension when the kernel is compiled, so "
                f"its size must be static: make it 'arbitrary' or pass a static size"
            )


def negative_grid_message(kernel: Any, dim: int, size: int, grid: tuple[Any, ...],
                          dynamic: bool = False) -> str:
    """The message of a grid dimension of negative ``size`` (static or at run time)."""
    shown = tuple(g if isinstance(g, int) else "dynamic" for g in grid)
    return (
        f"{kernel.named()}: grid dimension {dim} has size {size}"
        + (" at run time" if dynamic else "")
        + f" (grid {shown}); a grid size must be >= 0 (0 runs no grid point). "
        + ("Check the value passed as the dynamic grid size." if dynamic
           else "Check how the grid is computed (pl.cdiv of the array and block sizes).")
    )


def check_prepared_kernel(kernel: Any, params: Any) -> None:
    """``check_grid`` and ``check_jaxpr`` for a ``PreparedKernel`` launched with
    ``params``; a ``core_map`` mesh of more cores than palladium simulates is a
    ``ConfigError``."""
    check_grid(kernel)
    if kernel.is_core_map:
        check_cores_per_device(math.prod(kernel.mesh.shape.values()), "the core_map mesh",
                               kernel=kernel.named())
    names = [*kernel.scalar_names, *(i.name for i in kernel.inputs),
             *(o.name for o in kernel.outputs), *(s.name for s in kernel.scratch)]
    check_jaxpr(kernel.jaxpr, kernel.name, names,
                 allow_hbm_allocation_in_run_scoped=params.allow_hbm_allocation_in_run_scoped)
