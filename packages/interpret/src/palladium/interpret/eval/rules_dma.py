"""Rules for DMAs (``dma_start`` queues a copy in the simulator, ``dma_wait`` waits for it)
and semaphores (signal, wait, read, the barrier semaphore)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import KernelError, TpuLoweringError, UnsupportedFeatureError
from palladium.interpret.eval.access_path import (
    DmaPlan,
    DmaWaitPlan,
    PlanCache,
    base_refs,
    operand_key,
    semaphore_at,
)
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.dma_view import dma_view, view_nbytes
from palladium.interpret.eval.memory import access_of
from palladium.interpret.eval.refs import (
    MemRef,
    SemaphoreRef,
    as_int,
    dims_region,
    indexed_dims,
    numpy_slice,
    split_transformed,
)
from palladium.interpret.eval.registry import Rule, rule, rule_compiler
from palladium.interpret.fidelity import compiler_rejects
from palladium.shared_memory import AccessPlan, MemorySpace, SemaphoreKind


def _mem(ev: KernelContext, value: Any, eqn: Equation, role: str) -> tuple[MemRef, Any]:
    ref, transforms = split_transformed(value)
    if not isinstance(ref, MemRef):
        raise KernelError(f"DMA {role} is not a memory ref ({ev.site(eqn)})")
    return ref, access_of(ref, transforms)


def _side(ref: MemRef, acc: Any) -> tuple[Any, np.dtype, str]:
    return acc, np.dtype(ref.buffer.dtype), ref.name


def _check_same_dtype(src: MemRef, dst: MemRef, site: Any) -> None:
    """A TPU DMA moves bytes, and Mosaic rejects a DMA between refs of different dtypes:
    converting the values (as ``astype`` would) is never what the hardware does."""
    src_dtype, dst_dtype = np.dtype(src.buffer.dtype), np.dtype(dst.buffer.dtype)
    if src_dtype != dst_dtype:
        raise KernelError(
            f"DMA from '{src.name}' ({src_dtype}) to '{dst.name}' ({dst_dtype}): the dtypes "
            f"differ; a DMA copies bytes and Mosaic rejects a DMA between refs of different "
            f"dtypes. Copy between refs of one dtype, or bitcast one side "
            f"(ref.bitcast(...)) to make the byte copy explicit ({site})"
        )


_HOST = MemorySpace.HOST


def _check_host_dma(ev: KernelContext, src: MemRef, dst: MemRef, eqn: Equation) -> None:
    """A DMA to or from the host's memory the TPU compiler rejects (``compiler_rejects``
    decides) is ``TpuLoweringError`` where the kernel starts it."""
    src_space, dst_space = src.buffer.space, dst.buffer.space
    if src_space is not _HOST and dst_space is not _HOST:
        return
    rejected = compiler_rejects.host_dma(ev.params.chip, src_space, dst_space)
    if rejected is not None:
        raise TpuLoweringError(
            f"DMA from '{src.name}' ({src_space.value}) to '{dst.name}' "
            f"({dst_space.value}): {rejected} ({ev.site(eqn)})")


def sem_id(ev: KernelContext, value: Any, eqn: Equation, transforms: Any = ()) -> int:
    ref, own = split_transformed(value)
    transforms = (*own, *transforms)
    if not isinstance(ref, SemaphoreRef):
        raise KernelError(f"expected a semaphore, got {ref!r} ({ev.site(eqn)})")
    return ref.index(transforms).scalar_id()


# --- dma_start / dma_wait ---------------------------------------------------------------
# A kernel starts and waits for its DMAs at the same few places on every grid step (paged
# attention: several per step). Per equation, everything derived from the operands is
# resolved once per structure of the operands (``access_path``) into a ``DmaPlan`` /
# ``DmaWaitPlan``, which names the refs and semaphores by their position among the
# operands. Operands without a structure (a plugin's ref with transforms, an array-valued
# index) resolve to a plan for that call alone, whose positions are among the operands'
# base refs (``base_refs``).
def _position(invals: list[Any], ref: Any) -> int:
    return next(i for i, x in enumerate(invals) if x is ref)


def _sem_position(ev: KernelContext, value: Any, eqn: Equation, invals: list[Any]) -> tuple[int, int]:
    """(operand position of the semaphore array, flat position of the one semaphore)."""
    ref, transforms = split_transformed(value)
    if not isinstance(ref, SemaphoreRef):
        raise KernelError(f"expected a semaphore, got {ref!r} ({ev.site(eqn)})")
    flat = SemaphoreRef(np.arange(ref.ids.size).reshape(ref.ids.shape), ref.kind, ref.name)
    return _position(invals, ref), flat.index(transforms).scalar_id()


def _operands(invals: list[Any], cached: bool) -> list[Any]:
    """Where a plan finds the refs it names: the operands themselves when the plan is
    kept, their base refs when it serves one call."""
    return invals if cached else base_refs(invals)


def _indices(entries: Any, invals: Any) -> tuple[int | slice, ...]:
    """One indexer's entries as numpy indices: an index, or a slice (its start read
    from the operands where it is dynamic)."""
    index: list[int | slice] = []
    for entry in entries:
        if entry[0] == "index":
            index.append(as_int(invals[entry[1]], "ref indexer"))
        else:
            _, at, start, size, stride = entry
            if at is not None:
                start = as_int(invals[at], "ref indexer")
            index.append(numpy_slice(start, size, stride))
    return tuple(index)


def _region(shape: tuple[int, ...], indexers: tuple[Any, ...],
            invals: list[Any]) -> tuple[int | slice, ...]:
    """The region indexers (``jc.dma_index_layout``'s) select of a buffer of ``shape``,
    from the operands: what ``refs.resolve`` makes of them, without jax's objects."""
    if len(indexers) == 1 and len(indexers[0]) == len(shape):
        # one indexer of the whole buffer (a page of paged attention): its entries are
        # the region's, an index or a slice per dimension
        return _indices(indexers[0], invals)
    dims: list[Any] = [[0, 1, n] for n in shape]
    for entries in indexers:
        dims = indexed_dims(dims, _indices(entries, invals))
    return dims_region(dims)[0]


def _placement(shape: tuple[int, ...], indexers: tuple[Any, ...]) -> Any:
    """``_region`` of a buffer of ``shape`` composed once: ``(positions, dims)``, the
    operands the region depends on and per dimension of the region a constant (an int
    or a slice) or ``(const, terms, size, step)``, whose start is ``const`` plus each
    ``(position, factor)``'s operand times the factor (``size`` None: an index, the
    dimension dropped). None where it is not that simple (a stride below one, an
    indexer of another rank): ``_region`` then answers."""
    dims: list[Any] = [[0, (), 1, n] for n in shape]  # const, terms, step, size (None: index)
    for entries in indexers:
        kept = [d for d in dims if d[3] is not None]
        if len(entries) != len(kept):
            return None
        for d, entry in zip(kept, entries):
            const, terms, step, _ = d
            if entry[0] == "index":
                d[1], d[3] = (*terms, (entry[1], step)), None
                continue
            _, at, start, size, stride = entry
            if stride < 1:
                return None
            if at is None:
                d[0] = const + start * step
            else:
                d[1] = (*terms, (at, step))
            d[2], d[3] = step * stride, size
    out: list[Any] = []
    for const, terms, step, size in dims:
        if terms:
            out.append((const, terms, size, step))
        else:
            out.append(const if size is None else numpy_slice(const, size, step))
    positions = tuple(sorted({at for _, terms, _, _ in dims for at, _ in terms}))
    return positions, tuple(out)


def _placed_region(dims: tuple[Any, ...], values: Any) -> tuple[int | slice, ...]:
    """The region ``dims`` (``_placement``'s) select where ``values[position]`` is each
    operand's integer value: what ``_region`` answers (the same ints and slices)."""
    region: list[int | slice] = []
    for dim in dims:
        if dim.__class__ is not tuple:
            region.append(dim)
            continue
        start, terms, size, step = dim
        for at, factor in terms:
            start += values[at] * factor
        region.append(start if size is None else numpy_slice(start, size, step))
    return tuple(region)


def _picker(positions: Any) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """What takes the items at ``positions`` of a key, as a tuple (built in C: a page DMA
    keys its plans by them)."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    return lambda key: tuple(key[i] for i in positions)


def _picked(key: tuple[Any, ...], positions: tuple[int, ...]) -> tuple[Any, ...]:
    return tuple(map(key.__getitem__, positions))


def _side_plan(sim: Any, buffer: Any, dims: tuple[Any, ...], key: Any,
               paged: dict[Any, Any], structure: Any) -> Any:
    """The plan of the region ``dims`` place at ``key``'s values. Where only index
    dimensions vary (a page's, a head's) and they lie in bounds, the plan is the one
    ``resolve`` made of the first such region (``paged``, per ref ``structure``) with
    this region and its ints in the index: nothing else of it depends on them."""
    region = _placed_region(dims, key)
    known = paged.get(structure)
    if known is not None:
        plan, axes = known
        if plan is not None:
            logical = plan.logical
            index = list(plan.index)
            for a in axes:
                at = region[a]
                if not 0 <= at < logical[a]:
                    return sim.plan(buffer, region)
                index[a] = at
            return AccessPlan(region, plan.full, tuple(index), plan.shape, plan.pos,
                              plan.oob, plan.box, logical, plan.bound)
        return sim.plan(buffer, region)
    plan = sim.plan(buffer, region)
    axes = tuple(i for i, d in enumerate(dims) if d.__class__ is tuple)
    reusable = (plan.index is not None and len(region) == len(plan.logical)
                and all(dims[a][2] is None and 0 <= region[a] < plan.logical[a]
                        for a in axes))
    paged[structure] = (plan if reusable else None, axes)
    return plan


#: Plans a placing DMA keeps per side (its destination's few slots; its sources, pages
#: that seldom repeat, are resolved again when this many have been)
_SIDE_PLANS = 64


@rule_compiler(jc.dma_start_p)
def _dma_start(eqn: Equation, used: frozenset[Any]) -> Rule:
    cache: PlanCache[DmaPlan] = PlanCache()
    tree, id_type = eqn.params["tree"], eqn.params["device_id_type"]
    add = bool(eqn.params.get("add", False))

    def build(ev: KernelContext, invals: list[Any], cached: bool) -> DmaPlan:
        src, dst, dst_sem, src_sem, device_id = jc.dma_operands(tree, invals)
        src_ref, src_acc = _mem(ev, src, eqn, "source")
        dst_ref, dst_acc = _mem(ev, dst, eqn, "destination")
        _check_host_dma(ev, src_ref, dst_ref, eqn)
        view = dma_view(_side(src_ref, src_acc), _side(dst_ref, dst_acc), ev.site(eqn))
        if view is None:
            _check_same_dtype(src_ref, dst_ref, ev.site(eqn))
        sim = ev.sim
        ops = _operands(invals, cached)
        return DmaPlan(
            _position(ops, src_ref), sim.plan(src_ref.buffer, src_acc.region),
            _position(ops, dst_ref), sim.plan(dst_ref.buffer, dst_acc.region), view,
            _sem_position(ev, dst_sem, eqn, ops),
            None if src_sem is None else _sem_position(ev, src_sem, eqn, ops), device_id,
            None if cached else ops)

    # A DMA whose regions its data places (paged attention's pages) starts at new slice
    # starts each time: its plan is the plan of the same DMA at other starts (kept by the
    # other operands) with this call's regions, computed from the starts alone.
    layout = jc.dma_index_layout(tree)
    placing = jc.dma_placing_leaves(tree) if layout is not None else frozenset()
    keep = [i for i in range(tree.num_leaves) if i not in placing] if placing else None
    kept = _picker(keep or ())
    templates: PlanCache[DmaPlan] = PlanCache()
    template_entries = templates.entries  # (its hits looked up in place: every page DMA)
    # per side and buffer shape, the side's indexers composed once (``_placement``); per
    # side, its plans by the ref's structure and the values placing it
    placements: dict[tuple[int, tuple[int, ...]], Any] = {}
    side_plans: tuple[PlanCache[Any], PlanCache[Any]] = (PlanCache(_SIDE_PLANS),
                                                          PlanCache(_SIDE_PLANS))
    # per side, by ref structure: a plan whose index dimensions alone vary (_side_plan)
    paged: tuple[dict[Any, Any], dict[Any, Any]] = ({}, {})

    def side_plan(ev: KernelContext, side: int, indexers: Any, at: int, invals: list[Any],
                  key: tuple[Any, ...]) -> Any:
        buffer = invals[at].buffer
        shape = tuple(buffer.shape)
        placement = placements.get((side, shape), placements)
        if placement is placements:
            placement = placements[(side, shape)] = _placement(shape, indexers)
        if placement is None:
            return ev.sim.plan(buffer, _region(shape, indexers, invals))
        positions, dims = placement
        structure = key[at]
        known = paged[side].get(structure)
        if known is not None and known[0] is not None:
            # (a page's plan from its side's first: made again, not kept, since pages
            # seldom repeat and a miss in a cache costs more than the plan)
            return _side_plan(ev.sim, buffer, dims, key, paged[side], structure)
        # (the key holds each index operand as an int: operand_key)
        return side_plans[side].get((structure, *_picked(key, positions)), _side_plan,
                                    ev.sim, buffer, dims, key, paged[side], structure)

    def placed(ev: KernelContext, invals: list[Any], key: tuple[Any, ...],
               ) -> tuple[DmaPlan, Any, Any]:
        """The kept plan of the same DMA at other starts, and this start's region plans."""
        assert keep is not None and layout is not None
        others = kept(key)
        template = template_entries.get(others) or templates.get(others, build, ev, invals, True)
        src_side, dst_side = layout
        src_plan, dst_plan = template.src_plan, template.dst_plan
        if src_side is not None:
            src_plan = side_plan(ev, 0, src_side, template.src_at, invals, key)
        if dst_side is not None:
            dst_plan = side_plan(ev, 1, dst_side, template.dst_at, invals, key)
        return template, src_plan, dst_plan

    def run(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        key = operand_key(invals)
        if key is not None and keep is not None:
            # (not kept by the whole key: pages seldom repeat, and a cache of a plan per
            # page DMA is a heap the collector walks; its sides' plans are kept)
            plan, src_plan, dst_plan = placed(ev, invals, key)
        else:
            plan = cache.get(key, build, ev, invals, key is not None)
            src_plan, dst_plan = plan.src_plan, plan.dst_plan
        ops = invals if plan.operands is None else plan.operands
        src_ref, dst_ref = ops[plan.src_at], ops[plan.dst_at]
        target = ev.remote_core(plan.device_id, None, id_type, eqn)
        dst_buffer = dst_ref.buffer
        if target is not None and target != ev.core:
            dst_buffer = ev.memory.peer_buffer(dst_buffer, target)
        ev.sim.dma_start(
            src_ref.buffer, src_plan, dst_buffer, dst_plan, core=ev.core,
            dst_sem=semaphore_at(ops, plan.dst_sem),
            src_sem=None if plan.src_sem is None else semaphore_at(ops, plan.src_sem),
            dst_core=target, site=ev.site(eqn), name=f"{src_ref.name}->{dst_ref.name}",
            view=plan.view, add=add,
        )
        return []

    return run


@rule_compiler(jc.dma_wait_p)
def _dma_wait(eqn: Equation, used: frozenset[Any]) -> Rule:
    cache: PlanCache[DmaWaitPlan] = PlanCache()
    entries = cache.entries  # (its hits looked up in place: every wait)
    tree = eqn.params["tree"]
    # A wait needs its DMA's size and its semaphore, not where the DMA's regions lie: a
    # kernel that copies pages from places its data picks (paged attention) waits with
    # new slice starts each time. Its plans are kept by the other operands alone.
    placing = jc.dma_placing_leaves(tree)
    keep = ([i for i in range(tree.num_leaves) if i not in placing] if placing else None)
    kept = _picker(keep or ())

    def build(ev: KernelContext, invals: list[Any], cached: bool) -> DmaWaitPlan:
        src, _dst, sem, _src_sem, _device_id = jc.dma_operands(tree, invals)
        src_ref, src_acc = _mem(ev, src, eqn, "source")
        nbytes = view_nbytes(src_acc, np.dtype(src_ref.buffer.dtype))
        ops = _operands(invals, cached)
        return DmaWaitPlan(nbytes, _sem_position(ev, sem, eqn, ops), None if cached else ops)

    def run(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
        key = operand_key(invals)
        if key is not None and keep is not None:
            key = kept(key)
        plan = (None if key is None else entries.get(key)) or cache.get(
            key, build, ev, invals, key is not None)
        ops = invals if plan.operands is None else plan.operands
        ev.sim.dma_wait(semaphore_at(ops, plan.sem), plan.nbytes, core=ev.core,
                        site=ev.site(eqn))
        return []

    return run


@rule(jc.semaphore_signal_p)
def _signal(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    sem, transforms, inc, device_id, core_index = eqn.params["args_tree"].unflatten(invals)
    target = ev.remote_core(device_id, core_index, eqn.params["device_id_type"], eqn)
    sid = sem_id(ev, sem, eqn, transforms)
    ev.sim.semaphore_signal(
        sid, int(np.asarray(inc)), core=ev.core, target=target, site=ev.site(eqn)
    )
    return []


@rule(jc.semaphore_wait_p)
def _wait(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    sem, transforms, value, decrement = eqn.params["args_tree"].unflatten(invals)
    if not decrement:
        raise UnsupportedFeatureError(f"semaphore_wait with decrement=False ({ev.site(eqn)})")
    sid = sem_id(ev, sem, eqn, transforms)
    ev.sim.semaphore_wait(sid, int(np.asarray(value)), core=ev.core, site=ev.site(eqn))
    return []


@rule(jc.semaphore_read_p)
def _read(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    sem, transforms = eqn.params["args_tree"].unflatten(invals)
    sid = sem_id(ev, sem, eqn, transforms)
    return [np.int32(ev.sim.semaphore_read(sid, core=ev.core, site=ev.site(eqn)))]


@rule(jc.get_barrier_semaphore_p)
def _barrier_semaphore(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    if ev.collective_id is None:
        # Mosaic allocates the barrier semaphore per collective_id, and both it and jax's
        # TPU interpreter reject a kernel that asks for one without it.
        raise KernelError(
            f"pltpu.get_barrier_semaphore() in a kernel without a collective_id: pass "
            f"compiler_params=pltpu.CompilerParams(collective_id=<int>) to the pallas_call "
            f"(a TPU has no barrier semaphore without one) ({ev.site(eqn)})"
        )
    ids = np.asarray(ev.sim.barrier_semaphore(ev.core[0]), dtype=np.int64)
    return [SemaphoreRef(ids, SemaphoreKind.BARRIER, "barrier semaphore")]
