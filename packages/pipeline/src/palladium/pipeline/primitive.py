"""The ``emit_pipeline`` primitive path: the pipeline as one jaxpr equation.

With ``emit_pipeline(..., use_primitive=True)`` (or jax's switch
``jax_use_emit_pipeline_primitive``) the pipeline is not inlined while the kernel is
traced. The body and every index map are traced to jaxprs once and carried by one
``palladium_emit_pipeline`` equation together with the pipeline configuration. The
equation is expanded into the regular (inlined) emitter only when it is lowered to
Mosaic or discharged for ``interpret=True``; the expansion is the same code as the
inlined path, so both produce the same DMAs and results.

Operands of ``emit_pipeline_p``, in order: the constants of the index maps, the
dynamic grid sizes, the core id (megacore), the constants of the body, then the
flattened operand refs (a transformed ref flattens to its base ref and the leaves of
its transforms) and scratch refs. The body is run by a second primitive,
``palladium_pipeline_body``, whose operands are the body constants, the step indices
and the (transformed) block refs; its Mosaic rule resolves the transforms into memref
views and lowers the body jaxpr in place.

This module defines the primitives, traces and binds them and expands them into the
emitter core (:mod:`palladium.pipeline.core`); their Mosaic lowering, discharge and vmap
rules are :mod:`palladium.pipeline.primitive_rules`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline.blocks import window_shape
from palladium.pipeline.buffered_ref import ref_memory_space, ref_value_aval
from palladium.pipeline.core import emit_inline
from palladium.pipeline.errors import PipelineNotImplementedError
from palladium.pipeline.grid import partition_grid
from palladium.pipeline.step import PipelineStep

emit_pipeline_p = jc.Primitive("palladium_emit_pipeline")
emit_pipeline_p.multiple_results = True
pipeline_body_p = jc.Primitive("palladium_pipeline_body")
pipeline_body_p.multiple_results = True
# Both need the enclosing grid and memory context, which Mosaic's per-equation
# lowering cache does not key on.
jc.mosaic_uncacheable_primitives.add(emit_pipeline_p)
jc.mosaic_uncacheable_primitives.add(pipeline_body_p)

_INT32 = jc.ShapedArray((), jnp.int32)


def _trace(fun, avals, what: str):
    """``fun`` traced over ``avals``: a jaxpr whose constants are leading invars."""
    dbg = jc.debug_info(what, fun, tuple(avals), {})
    with jc.mutable_array_checks(False):
        jaxpr, _, consts = jc.trace_to_jaxpr_dynamic(jc.wrap_init(fun, debug_info=dbg), avals)
    with jc.enable_checks(False):
        jaxpr = jc.convert_constvars_jaxpr(jaxpr)
    return jaxpr, tuple(consts)


# -- index maps -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class IndexMap:
    """An index map as a jaxpr: static (Python int) outputs stay static."""

    jaxpr: Any
    num_consts: int
    out_tree: Any
    static_leaves: tuple[int | None, ...]

    @classmethod
    def trace(cls, index_map, avals: Sequence[Any], num_consts: int = 0) -> tuple[IndexMap, tuple]:
        """Trace ``index_map(*args)`` over ``avals``, the first ``num_consts`` constants."""
        found: dict[str, Any] = {}

        def flat(*args):
            leaves, tree = jax.tree.flatten(index_map(*args))
            static = tuple(x if isinstance(x, int) and not isinstance(x, bool) else None
                           for x in leaves)
            found.update(tree=tree, static=static)
            return [x for x, s in zip(leaves, static, strict=True) if s is None]

        jaxpr, consts = _trace(flat, list(avals), "emit_pipeline index_map")
        return cls(jaxpr, num_consts + len(consts), found["tree"], found["static"]), consts

    def with_batch_index(self, dim: int | None) -> IndexMap:
        """The index map of the batched grid ``(b, *grid)``: ``b`` goes in at ``dim``."""
        const_avals = [v.aval for v in self.jaxpr.invars[:self.num_consts]]
        rank = len(self.jaxpr.invars) - self.num_consts

        def batched(*args):
            consts, (b, *indices) = args[:self.num_consts], args[self.num_consts:]
            out = self.bind(consts)(*indices)
            out = out if isinstance(out, tuple) else (out,)
            return out if dim is None else (*out[:dim], b, *out[dim:])

        traced, extra = IndexMap.trace(batched, [*const_avals, *[_INT32] * (rank + 1)],
                                       self.num_consts)
        assert not extra
        return traced

    def bind(self, consts: Sequence[Any]):
        """A Python index map evaluating the jaxpr with ``consts``."""

        def index_map(*indices):
            dynamic = iter(jc.eval_jaxpr(self.jaxpr, (), *consts, *indices))
            dynamic = iter(list(dynamic))
            leaves = [next(dynamic) if s is None else s for s in self.static_leaves]
            return jax.tree.unflatten(self.out_tree, leaves)

        return index_map


@dataclasses.dataclass(frozen=True, eq=False)
class SpecMeta:
    """The static part of a block spec; the index map is an :class:`IndexMap`."""

    block_shape: Any
    index_map: IndexMap | None
    memory_space: Any
    pipeline_mode: Any

    def to_spec(self, consts: Sequence[Any]):
        index_map = None if self.index_map is None else self.index_map.bind(consts)
        return jc.BlockSpec(self.block_shape, index_map, memory_space=self.memory_space,
                            pipeline_mode=self.pipeline_mode)

    @property
    def num_consts(self) -> int:
        return 0 if self.index_map is None else self.index_map.num_consts


# -- binding ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class Config:
    """Everything static about one pipeline: the parameters of ``emit_pipeline_p``."""

    in_specs: tuple[SpecMeta | None, ...]  # one per leaf of the in_specs pytree
    out_specs: tuple[SpecMeta | None, ...]
    static_grid: tuple[int | None, ...]
    num_cores: int | None
    has_core_id: bool
    options: tuple[tuple[str, Any], ...]
    explicit_indices: bool
    body_jaxpr: Any
    num_body_consts: int
    body_dynamic_sizes: tuple[int, ...]  # per-core grid dims the body gets as args
    refs_tree: Any  # ref_tree_flatten((in_refs, out_refs, scratches))
    num_ref_leaves: int
    num_in: int
    num_out: int
    num_batch_dims: int = 0
    in_tree: Any = None  # the pytree of in_specs (None: a flat tuple)
    out_tree: Any = None
    has_allocations: bool = False  # the caller passed allocations= (the refs' 4th group)

    @property
    def rank(self) -> int:
        return len(self.static_grid)

    def split(self, args: Sequence[Any]) -> dict[str, Any]:
        """The operands of ``emit_pipeline_p`` by role."""
        specs = [s for s in (*self.in_specs, *self.out_specs) if s is not None]
        sizes = {
            "index_consts": sum(s.num_consts for s in specs),
            "grid": sum(1 for g in self.static_grid if g is None),
            "core_id": int(self.has_core_id),
            "body_consts": self.num_body_consts,
            "refs": self.num_ref_leaves,
        }
        out: dict[str, Any] = {}
        start = 0
        for name, size in sizes.items():
            out[name] = list(args[start:start + size])
            start += size
        assert start == len(args), (start, len(args))
        return out


def _spec_meta(spec, rank: int) -> tuple[SpecMeta | None, tuple]:
    if spec is None:
        return None, ()
    if not isinstance(spec, jc.BlockSpec):
        raise PipelineNotImplementedError(
            "use_primitive=True takes BlockSpecs (or pl.no_block_spec), one per operand or"
            f" in pytrees matching the operands: got {spec!r}")
    if spec.index_map is None:
        return SpecMeta(spec.block_shape, None, spec.memory_space, spec.pipeline_mode), ()
    index_map, consts = IndexMap.trace(spec.index_map, [_INT32] * rank)
    return SpecMeta(spec.block_shape, index_map, spec.memory_space, spec.pipeline_mode), consts


def _block_aval(bref, ref):
    """The aval of the block ref the body sees for one operand."""
    aval = ref_value_aval(ref)
    if bref.is_buffered:
        window = bref.window_ref  # a memory-space type, e.g. VMEM((slots, *block))
        shape = tuple(window.shape)
        if not bref.is_trivial_windowing:
            if len(shape) == 1:
                shape = (shape[0] // bref.buffer_count,)
            else:
                shape = shape[1:]
        return jc.AbstractRef(jc.ShapedArray(shape, aval.dtype), window.memory_space)
    shape = aval.shape if bref.is_trivial_windowing else window_shape(bref.spec)
    return jc.AbstractRef(jc.ShapedArray(shape, aval.dtype), ref_memory_space(ref))


def _ref_aval(ref):
    if isinstance(ref, jc.TransformedRef):
        return jc.AbstractRef(jc.ShapedArray(ref.shape, ref.dtype), ref.memory_space)
    return jax.typeof(ref)


def _is_spec_leaf(spec) -> bool:
    return spec is None or isinstance(spec, jc.BlockSpec)


def bind_pipeline(body, *, grid, in_specs, in_refs, out_specs, out_refs, scratches,
                  num_cores, core_id, options: dict[str, Any], explicit_indices: bool,
                  make_allocations, allocations=None) -> None:
    """Trace ``body`` and the index maps and bind one ``emit_pipeline_p`` equation.

    ``in_specs`` / ``out_specs`` may be pytrees (matching the operands'); the caller's
    ``allocations`` (BufferedRefs allocated once, see ``emit_pipeline_with_allocations``)
    become operands of the equation, handed back to the emitter when it is expanded."""
    rank = len(grid)
    in_leaves, in_tree = jax.tree.flatten(tuple(in_specs), is_leaf=_is_spec_leaf)
    out_leaves, out_tree = jax.tree.flatten(tuple(out_specs), is_leaf=_is_spec_leaf)
    metas: list[SpecMeta | None] = []
    index_consts: list[Any] = []
    for spec in (*in_leaves, *out_leaves):
        meta, consts = _spec_meta(spec, rank)
        metas.append(meta)
        index_consts.extend(consts)
    in_metas, out_metas = tuple(metas[:len(in_leaves)]), tuple(metas[len(in_leaves):])
    static_grid = tuple(g if isinstance(g, int) else None for g in grid)
    dynamic_grid = [jnp.asarray(g, jnp.int32) for g in grid if not isinstance(g, int)]
    core_grid, _ = partition_grid(tuple(grid), options["dimension_semantics"], num_cores,
                                  core_id)
    body_dynamic = tuple(i for i, g in enumerate(core_grid) if not isinstance(g, int))
    brefs = make_allocations(in_refs, out_refs, core_grid)
    is_bref = lambda x: x is not None and hasattr(x, "is_buffered")  # noqa: E731
    block_avals = jax.tree.map(_block_aval, brefs,
                               (*in_refs, *out_refs), is_leaf=is_bref)
    blocks_leaves, blocks_tree = jax.tree.flatten(block_avals)
    scratch_leaves, scratch_tree = jax.tree.flatten(scratches, is_leaf=_is_ref_like)
    scratch_avals = [_ref_aval(r) for r in scratch_leaves]
    num_scalars = rank + (1 if explicit_indices else len(body_dynamic))

    def traced_body(*args):
        scalars, refs = args[:num_scalars], args[num_scalars:]
        blocks = jax.tree.unflatten(blocks_tree, refs[:len(blocks_leaves)])
        scratch = jax.tree.unflatten(scratch_tree, refs[len(blocks_leaves):])
        if explicit_indices:
            body(PipelineStep(tuple(scalars[:rank]), scalars[rank]), *blocks, *scratch)
            return []
        dynamic = iter(scalars[rank:])
        sizes = [next(dynamic) if i in body_dynamic else g for i, g in enumerate(core_grid)]
        with jc.grid_env([jc.GridAxis(i, s)
                          for i, s in zip(scalars[:rank], sizes, strict=True)]):
            body(*blocks, *scratch)
        return []

    body_jaxpr, body_consts = _trace(
        traced_body, [_INT32] * num_scalars + [*blocks_leaves, *scratch_avals],
        "emit_pipeline body")
    allocated = () if allocations is None else tuple(allocations)
    ref_leaves, refs_tree = jc.ref_tree_flatten(tuple(in_refs), tuple(out_refs), scratches,
                                                allocated)
    config = Config(
        in_specs=in_metas, out_specs=out_metas, static_grid=static_grid,
        num_cores=num_cores, has_core_id=core_id is not None,
        options=tuple(sorted(options.items())), explicit_indices=explicit_indices,
        body_jaxpr=body_jaxpr, num_body_consts=len(body_consts),
        body_dynamic_sizes=body_dynamic, refs_tree=refs_tree,
        num_ref_leaves=len(ref_leaves), num_in=len(in_refs), num_out=len(out_refs),
        in_tree=in_tree, out_tree=out_tree, has_allocations=allocations is not None,
    )
    core = [] if core_id is None else [jnp.asarray(core_id, jnp.int32)]
    emit_pipeline_p.bind(*index_consts, *dynamic_grid, *core, *body_consts, *ref_leaves,
                         config=config)


# -- abstract evaluation ----------------------------------------------------------------
def _base_positions(refs_tree, offset: int, count: int):
    """``(in, out, scratch, allocations)`` lists of the operand positions of every base
    ref."""
    positions = refs_tree.unflatten(list(range(offset, offset + count)))
    base = lambda r: jc.get_ref_and_transforms(r)[0]  # noqa: E731
    return tuple([base(r) for r in jax.tree.leaves(group, is_leaf=_is_ref_like)]
                 for group in positions)


def _is_ref_like(x) -> bool:
    return isinstance(x, jc.TransformedRef)


def _map_body_effects(jaxpr, position_of_invar: Sequence[int | None]) -> set:
    num_constvars = len(jaxpr.constvars)
    out = set()
    for effect in jaxpr.effects:
        if not isinstance(effect, jc.JaxprInputEffect):
            out.add(effect)
            continue
        position = position_of_invar[jc.input_effect_position(effect, jaxpr) - num_constvars]
        if position is not None:
            out.add(jc.input_effect_at(effect, position))
    return out


@emit_pipeline_p.def_effectful_abstract_eval
def _emit_pipeline_abstract_eval(*avals, config: Config):
    parts = config.split(list(range(len(avals))))
    ref_offset = parts["refs"][0] if parts["refs"] else len(avals)
    ins, outs, scratch, allocated = _base_positions(config.refs_tree, ref_offset,
                                                    config.num_ref_leaves)
    effects: set = set()
    for pos in ins:
        effects.add(jc.ReadEffect(pos))
    for pos in outs:
        effects.add(jc.WriteEffect(pos))
    for pos in (*scratch, *allocated):
        effects.update((jc.ReadEffect(pos), jc.WriteEffect(pos)))
    for pos in parts["index_consts"]:
        if isinstance(avals[pos], jc.AbstractRef):
            effects.add(jc.ReadEffect(pos))
    # The body's own effects on its constants (refs it closes over).
    num_scalars = len(config.body_jaxpr.invars) - config.num_body_consts
    positions = [*parts["body_consts"], *([None] * num_scalars)]
    effects |= _map_body_effects(config.body_jaxpr, positions)
    return (), frozenset(effects)


# -- expansion into the inlined emitter --------------------------------------------------
def _expand(*args, config: Config) -> list:
    """Run the regular emitter on the operands of one ``emit_pipeline_p`` equation."""
    parts = config.split(args)
    consts = iter(parts["index_consts"])

    def spec(meta):
        if meta is None:
            return None
        return meta.to_spec([next(consts) for _ in range(meta.num_consts)])

    in_specs = tuple(spec(m) for m in config.in_specs)
    out_specs = tuple(spec(m) for m in config.out_specs)
    if config.in_tree is not None:
        in_specs = jax.tree.unflatten(config.in_tree, in_specs)
        out_specs = jax.tree.unflatten(config.out_tree, out_specs)
    dynamic = iter(parts["grid"])
    grid = tuple(next(dynamic) if g is None else g for g in config.static_grid)
    core_id = parts["core_id"][0] if config.has_core_id else None
    in_refs, out_refs, scratches, allocated = config.refs_tree.unflatten(parts["refs"])
    body_consts = parts["body_consts"]
    nb = config.num_batch_dims

    def run_body(*blocks_and_scratch):
        if config.explicit_indices:
            step, *rest = blocks_and_scratch
            scalars = [*step.index[nb:], step.local_index]
        else:
            rest = list(blocks_and_scratch)
            env = jc.current_grid_env()
            scalars = [jnp.asarray(a.index, jnp.int32) for a in env[nb:]]
            scalars += [jnp.asarray(env[nb + i].size, jnp.int32)
                        for i in config.body_dynamic_sizes]
        leaves, tree = jc.ref_tree_flatten(*rest)
        pipeline_body_p.bind(*body_consts, *scalars, *leaves, jaxpr=config.body_jaxpr,
                             num_consts=len(body_consts), num_scalars=len(scalars),
                             refs_tree=tree)

    options = dict(config.options)
    pipeline = emit_inline(run_body, grid=grid, in_specs=in_specs, out_specs=out_specs,
                              num_cores=config.num_cores, core_id=core_id,
                              _explicit_indices=config.explicit_indices, **options)
    pipeline(*in_refs, *out_refs, scratches=tuple(scratches) or None,
             allocations=tuple(allocated) if config.has_allocations else None)
    return []


def _unflatten_refs(refs_tree, leaves):
    return jax.tree.leaves(refs_tree.unflatten(list(leaves)), is_leaf=_is_ref_like)
