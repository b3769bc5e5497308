"""jax's own ``emit_pipeline`` primitive, expanded into palladium's emitter for interpreters.

With ``jax.config.update("jax_use_emit_pipeline_primitive", True)``, jax 0.10.2's
``pltpu.emit_pipeline`` puts one ``emit_pipeline`` equation in the kernel jaxpr (its body
traced to a jaxpr, its block specs as a ``GridMapping``) and expands it only in its
Mosaic lowering rule; jax has no expansion an interpreter could call. This module is that
expansion, with palladium's emitter: the same multiple-buffered DMAs and semaphores as the
inlined pipeline (``pltpu.emit_pipeline`` with the flag off) so an interpreter's race
detector and timeline see them, and the body run as palladium's ``pipeline_body_p`` on
the block refs (the interpreter evaluates it, see ``interpret_rules``), its jaxpr traced
once with ``pl.program_id`` / ``pl.num_programs`` answering the pipeline's grid (as
jax's lowering has them). palladium.interpret finds it by the primitive's name (``interpret_rules``):
palladium imports no module of jax's pipeline emitter.

Operands of jax's equation, in order: the index maps' constants, the dynamic grid bounds
and grid offsets, the body's constants, then the flattened operand refs (``args_tree``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline.core import emit_inline
from palladium.pipeline.errors import PipelineNotImplementedError
from palladium.pipeline.interpret_rules import interpret_rules as own_rules
from palladium.pipeline.primitive import pipeline_body_p, trace_fun

_INT32 = jc.ShapedArray((), jnp.int32)

__all__ = ["JAX_EMIT_PIPELINE", "expand_jax_emit_pipeline", "interpret_rules"]

#: The name of jax's primitive (``jax._src.pallas.mosaic.pipeline.emit_pipeline_p``).
JAX_EMIT_PIPELINE = "emit_pipeline"


def _split(seq: list[Any], sizes: list[int]) -> list[list[Any]]:
    out, start = [], 0
    for size in sizes:
        out.append(seq[start:start + size])
        start += size
    out.append(seq[start:])
    return out


def expand_jax_emit_pipeline(*args: Any, body_jaxpr: Any, body_consts_len: int,
                             grid_mapping: Any, args_tree: Any, tiling: Any = None,
                             core_axis: Any = None, core_axis_name: Any = None,
                             dimension_semantics: Any = None, trace_scopes: bool = True,
                             no_pipelining: bool = False, _static_grid_offsets: Any = (),
                             _num_extra_dynamic: int = 0, **_: Any) -> list[Any]:
    """Run one equation of jax's ``emit_pipeline`` primitive as palladium's emitter does."""
    if core_axis is not None or core_axis_name is not None or any(
            not (isinstance(o, int) and o == 0) for o in _static_grid_offsets):
        raise PipelineNotImplementedError(
            "jax's emit_pipeline primitive (jax_use_emit_pipeline_primitive) with a "
            "core_axis / core_axis_name (megacore split) is not interpreted; use "
            "palladium.pipeline.emit_pipeline(..., core_axis_name=...), or leave the flag "
            "off")
    if grid_mapping.vmapped_dims:
        raise PipelineNotImplementedError(
            "jax's emit_pipeline primitive under vmap is not interpreted; use "
            "palladium.pipeline.emit_pipeline(..., use_primitive=True), which has a vmap "
            "rule")
    mappings = list(grid_mapping.block_mappings)
    counts = [len(bm.index_map_jaxpr.consts) for bm in mappings]
    num_dynamic = grid_mapping.num_dynamic_grid_bounds + _num_extra_dynamic
    index_consts, dynamic, body_consts, flat_refs = _split(
        list(args), [sum(counts), num_dynamic, body_consts_len])
    per_map = _split(index_consts, counts)
    specs = [bm.replace(index_map_jaxpr=jc.ClosedJaxpr(bm.index_map_jaxpr.jaxpr, consts))
             .to_block_spec() for bm, consts in zip(mappings, per_map, strict=False)]
    num_in = grid_mapping.num_inputs
    dynamic_values = iter(dynamic)
    grid = tuple(next(dynamic_values) if jc.is_dynamic_dim(d) else d
                 for d in grid_mapping.grid)
    refs = jax.tree.leaves(args_tree.unflatten(flat_refs),
                           is_leaf=lambda x: isinstance(x, jc.TransformedRef))
    body_jaxpr_on_grid, extra_consts = _on_grid(body_jaxpr, body_consts_len, grid)
    consts = [*extra_consts, *body_consts]
    dynamic_sizes = [jnp.asarray(d, jnp.int32) for d in grid if not isinstance(d, int)]
    # The body's program ids answer the pipeline's grid, also inside its control flow:
    # the step's scalars are (indices, dynamic sizes), which the interpreter is told.
    static_grid = tuple(d if isinstance(d, int) else None for d in grid)

    def body(step: Any, *blocks: Any) -> None:
        scalars = [jnp.asarray(i, jnp.int32) for i in step.index] + dynamic_sizes
        leaves, tree = jc.ref_tree_flatten(*blocks)
        pipeline_body_p.bind(*consts, *scalars, *leaves, jaxpr=body_jaxpr_on_grid,
                             num_consts=len(consts), num_scalars=len(scalars),
                             refs_tree=tree, grid=static_grid)

    options: dict[str, Any] = {"tiling": tiling, "trace_scopes": trace_scopes,
                               "no_pipelining": no_pipelining}
    if dimension_semantics is not None:
        options["dimension_semantics"] = tuple(dimension_semantics)
    pipeline = emit_inline(body, grid=grid, in_specs=tuple(specs[:num_in]),
                           out_specs=tuple(specs[num_in:]), num_cores=None, core_id=None,
                           _explicit_indices=True, **options)
    pipeline(*refs)
    return []


def _on_grid(body_jaxpr: Any, num_consts: int, grid: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
    """jax's body jaxpr as a jaxpr of (its ``num_consts`` constants, the step indices,
    the dynamic grid sizes, the block refs), traced once per expansion; its top-level
    ``pl.program_id`` and ``pl.num_programs`` read the step's scalars, those inside its
    control flow are answered by the interpreter (``pipeline_body_p``'s ``grid``)."""
    avals = [v.aval for v in (*body_jaxpr.constvars, *body_jaxpr.invars)]
    num_constvars, rank = len(body_jaxpr.constvars), len(grid)
    num_scalars = rank + sum(1 for d in grid if not isinstance(d, int))

    def on_grid(*args: Any) -> list[Any]:
        consts, scalars = args[:num_consts], args[num_consts:num_consts + num_scalars]
        inputs = [*consts, *args[num_consts + num_scalars:]]
        sizes = iter(scalars[rank:])
        axes = [jc.GridAxis(scalars[i], d if isinstance(d, int) else next(sizes))
                for i, d in enumerate(grid)]
        with jc.grid_env(axes):
            jc.eval_jaxpr(body_jaxpr, inputs[:num_constvars], *inputs[num_constvars:])
        return []

    return trace_fun(on_grid, [*avals[:num_consts], *[_INT32] * num_scalars,
                               *avals[num_consts:]], "emit_pipeline body")


def interpret_rules() -> dict[Any, Any]:
    """The entry point ``palladium.interpret_rules`` of palladium-pipeline: the rules of
    its own primitives, and jax's ``emit_pipeline`` by name (an interpreter registers a
    rule given by a primitive's name for the primitive of that name when it meets it)."""
    return {**own_rules(), JAX_EMIT_PIPELINE: expand_jax_emit_pipeline}
