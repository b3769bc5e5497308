"""The rules of the ``emit_pipeline`` primitives: Mosaic lowering, state discharge, vmap.

The primitives themselves (and their expansion into the emitter core) are
:mod:`palladium.pipeline.primitive`; importing this module registers their rules with
jax (``palladium.pipeline`` does so when imported).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline.errors import PipelineNotImplementedError
from palladium.pipeline.primitive import (
    Config,
    SpecMeta,
    base_positions,
    emit_pipeline_p,
    expand,
    is_ref_like,
    map_body_effects,
    pipeline_body_p,
    trace_fun,
    unflatten_refs,
)


def _mosaic_emit_pipeline_rule(ctx, *args, config: Config):
    return jc.mosaic_lower_fun(expand)(ctx, *args, config=config)


for _core_type in jc.CoreType:
    jc.register_mosaic_lowering_rule(emit_pipeline_p, kernel_types=[_core_type])(
        _mosaic_emit_pipeline_rule)


@jc.register_partial_discharge_rule(emit_pipeline_p)
def _emit_pipeline_discharge(should_discharge, in_avals, out_avals, *args, config: Config):
    del out_avals
    jaxpr, consts = trace_fun(lambda *a: expand(*a, config=config), list(in_avals),
                           "emit_pipeline discharge")
    if consts:
        raise PipelineNotImplementedError(
            "emit_pipeline primitive: the expanded pipeline captured constants")
    # Semaphores allocated by the expansion become int32 arrays, as in the kernel.
    physical, physical_consts = jc.resolve_physical_types(jaxpr, ())
    discharged = jc.discharge_state(jc.ClosedJaxpr(physical, physical_consts),
                                    should_discharge=list(should_discharge))
    updated = iter(jc.eval_jaxpr(discharged.jaxpr, discharged.consts, *args))
    return [next(updated) if s else None for s in should_discharge], []


# -- the body primitive -----------------------------------------------------------------
def _body_positions(num_consts: int, num_scalars: int, refs_tree) -> list[int]:
    """The operand position of every body invar (a block ref maps to its base)."""
    offset = num_consts + num_scalars
    refs = refs_tree.unflatten(list(range(offset, offset + refs_tree.num_leaves)))
    bases = [jc.get_ref_and_transforms(r)[0]
             for r in jax.tree.leaves(refs, is_leaf=is_ref_like)]
    return [*range(offset), *bases]


@pipeline_body_p.def_effectful_abstract_eval
def _pipeline_body_abstract_eval(*avals, jaxpr, num_consts, num_scalars, refs_tree,
                                  grid=None):
    del avals, grid
    return (), frozenset(map_body_effects(
        jaxpr, _body_positions(num_consts, num_scalars, refs_tree)))


def _mosaic_pipeline_body_rule(ctx, *args, jaxpr, num_consts, num_scalars, refs_tree,
                               grid=None):
    del grid  # interpreters' information (jax's emit_pipeline primitive expanded)
    head = num_consts + num_scalars
    refs = unflatten_refs(refs_tree, args[head:])
    ref_avals = unflatten_refs(refs_tree, ctx.avals_in[head:])
    shapes = unflatten_refs(refs_tree, ctx.block_shapes[head:])
    resolved, resolved_shapes = [], []
    for ref, aval, shape in zip(refs, ref_avals, shapes, strict=True):
        base, transforms = jc.get_ref_and_transforms(ref)
        view, view_shape = jc.mosaic_transform_ref(base, aval, shape, transforms)
        resolved.append(view)
        resolved_shapes.append(view_shape)
    lowering = ctx.lowering_context.replace(
        block_shapes=(*ctx.block_shapes[:head], *resolved_shapes))
    return jc.mosaic_jaxpr_subcomp(lowering, jaxpr, *args[:head], *resolved)


for _core_type in jc.CoreType:
    jc.register_mosaic_lowering_rule(pipeline_body_p, kernel_types=[_core_type])(
        _mosaic_pipeline_body_rule)


@jc.register_partial_discharge_rule(pipeline_body_p)
def _pipeline_body_discharge(should_discharge, in_avals, out_avals, *args, jaxpr,
                             num_consts, num_scalars, refs_tree, grid=None):
    del in_avals, out_avals, grid
    head = num_consts + num_scalars
    refs = unflatten_refs(refs_tree, args[head:])
    should_refs = [jc.get_ref_and_transforms(s)[0]
                   for s in unflatten_refs(refs_tree, should_discharge[head:])]
    body_args, body_should = list(args[:head]), list(should_discharge[:head])
    for ref, should in zip(refs, should_refs, strict=True):
        base, transforms = jc.get_ref_and_transforms(ref)
        if should:
            body_args.append(jc.transform_array(base, transforms))
        elif transforms:
            raise PipelineNotImplementedError(
                "emit_pipeline primitive: a transformed block ref must be discharged")
        else:
            body_args.append(base)
        body_should.append(bool(should))
    discharged = jc.discharge_state(jc.ClosedJaxpr(jaxpr, ()), should_discharge=body_should)
    updated = iter(jc.eval_jaxpr(discharged.jaxpr, discharged.consts, *body_args))
    new = [next(updated) if s else None for s in body_should[:head]]
    positions = _body_positions(num_consts, num_scalars, refs_tree)[head:]
    bases: dict[int, Any] = {}
    for ref, should, pos in zip(refs, should_refs, positions, strict=True):
        if should:
            base, transforms = jc.get_ref_and_transforms(ref)
            base = bases.get(pos, base)
            _, bases[pos] = jc.transform_swap_array(base, transforms, next(updated))
    result = new + [None] * (len(args) - head)
    for pos, value in bases.items():
        result[pos] = value
    return result, []


# -- vmap -------------------------------------------------------------------------------
def _batched_spec(meta: SpecMeta | None, dim: int | None, name: str) -> SpecMeta | None:
    if meta is None:
        if dim is not None:
            raise PipelineNotImplementedError(
                f"vmap of emit_pipeline: {name} has no block spec but is batched")
        return None
    if meta.index_map is None:
        raise PipelineNotImplementedError(
            f"vmap of emit_pipeline: {name} has no index_map to add the batch index to")
    block = tuple(meta.block_shape)
    if dim is not None:
        block = (*block[:dim], jc.Squeezed(), *block[dim:])
    return dataclasses.replace(meta, block_shape=block,
                               index_map=meta.index_map.with_batch_index(dim))


def _align(metas, dims) -> list:
    # Operands without a block spec have no ref leaf.
    found = iter(dims)
    return [None if m is None else next(found) for m in metas]


def _emit_pipeline_batch(axis_data, args, dims, *, config: Config):
    """vmap: one more leading PARALLEL grid dimension over the batch.

    A batched operand gets a squeezed leading block dim indexed by the batch index;
    the body never sees the batch dimension (its indices and refs are unchanged).
    """
    size = axis_data.size
    if not isinstance(size, int):
        raise PipelineNotImplementedError("vmap of emit_pipeline needs a static batch size")
    parts = config.split(list(dims))
    for role in ("index_consts", "grid", "core_id", "body_consts"):
        if any(d is not None for d in parts[role]):
            raise PipelineNotImplementedError(
                f"vmap of emit_pipeline over its {role.replace('_', ' ')} is not supported")
    positions = base_positions(config.refs_tree, 0, config.num_ref_leaves)
    leaves = config.refs_tree.unflatten(list(range(config.num_ref_leaves)))
    ref_dims = parts["refs"]
    for group in leaves:
        for ref in jax.tree.leaves(group, is_leaf=is_ref_like):
            base, transforms = jc.get_ref_and_transforms(ref)
            if transforms and ref_dims[base] is not None:
                raise PipelineNotImplementedError(
                    "vmap of emit_pipeline over a transformed (.at[...]) operand ref")
    if any(ref_dims[p] is not None for p in (*positions[2], *positions[3])):
        raise PipelineNotImplementedError(
            "vmap of emit_pipeline over scratch refs or allocations")
    in_dims = _align(config.in_specs, [ref_dims[p] for p in positions[0]])
    out_dims = _align(config.out_specs, [ref_dims[p] for p in positions[1]])
    options = dict(config.options)
    options["dimension_semantics"] = (jc.PARALLEL, *options["dimension_semantics"])
    batched = dataclasses.replace(
        config,
        in_specs=tuple(_batched_spec(m, d, f"in_specs[{i}]")
                       for i, (m, d) in enumerate(zip(config.in_specs, in_dims, strict=True))),
        out_specs=tuple(_batched_spec(m, d, f"out_specs[{i}]")
                        for i, (m, d) in enumerate(zip(config.out_specs, out_dims,
                                                       strict=True))),
        static_grid=(size, *config.static_grid),
        options=tuple(sorted(options.items())),
        num_batch_dims=config.num_batch_dims + 1,
    )
    emit_pipeline_p.bind(*args, config=batched)
    return [], []


jc.fancy_primitive_batchers[emit_pipeline_p] = _emit_pipeline_batch
