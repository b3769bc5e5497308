"""A whole kernel launch as one pure function of its operands, for ``jax.jit``: the grid
loop of ``run/grid_loop.py`` traced over the traced evaluator (``traced_eval.run_jaxpr``)
with a DMA table and a grid (what it keeps of the simulator's loop: docs/architecture.md).
It returns the outputs and the flags of ``traced_state.py``.

Every grid point's block indices are computed before the loop, at once (the index maps
``vmap``-ed over the grid order), and so are which blocks each step copies and the
revisit check: the loop carries only the launch state. Carried from step to step, the
indices cost XLA a copy per index and step (RG-LRU: 112 thunks, 62 of them copies,
against 47 and 9; its executable ~20% faster).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from palladium.interpret.compiled import index_math as im
from palladium.interpret.compiled.dma_table import DmaTable
from palladium.interpret.compiled.traced_eval import run_jaxpr
from palladium.interpret.compiled.traced_state import (
    FLAG_BLOCK,
    FLAG_PREFETCH,
    FLAG_REVISIT,
    GridContext,
    Handle,
    SemHandle,
    TracedState,
    TraceFacts,
    View,
    read_view,
    write_view,
)
from palladium.interpret.errors import UnsupportedFeatureError
from palladium.interpret.kernel.blocks import BlockSpecInfo
from palladium.interpret.kernel.grid_blocks import GridBlocks
from palladium.interpret.kernel.prepared_kernel import PreparedKernel
from palladium.shared_memory import MemorySpace, uninitialized_value

__all__ = ["launch_function"]

#: Blocks an output may have for the revisit check's bitmap (more: not compiled).
_MAX_BLOCKS = 1 << 16


def _blocks_per_dim(info: BlockSpecInfo) -> list[int]:
    return [math.ceil(n / d.size) if d.kind == "blocked" else n
            for n, d in zip(info.padded_shape, info.dims)]


def _check_blocked(info: BlockSpecInfo) -> None:
    if any(d.kind not in ("blocked", "squeezed") for d in info.dims):
        raise UnsupportedFeatureError(f"operand '{info.name}': pl.Element or pl.BoundedSlice")
    if info.space not in (MemorySpace.VMEM, MemorySpace.SMEM, MemorySpace.HBM):
        raise UnsupportedFeatureError(f"operand '{info.name}' in {info.space}")


def _block_view(info: BlockSpecInfo, index: list[Any]) -> tuple[View, Any]:
    """The HBM region of block ``index`` and whether it lies in the padded array."""
    starts: list[Any] = []
    sizes: list[int] = []
    ok: Any = True
    for d, i, n in zip(info.dims, index, info.padded_shape):
        size = 1 if d.kind == "squeezed" else d.size
        blocked = d.kind == "blocked"
        start = im.mul(i, size) if blocked else im.as_index(i)
        # (checked on the block index itself: ``i * size`` may wrap in int32)
        ok = im.all_of(ok, im.fits(i, size, n, size if blocked else 1))
        starts.append(start)
        sizes.append(size)
    dropped = [d.kind == "squeezed" for d in info.dims]
    return View(starts, sizes, [1] * len(sizes), dropped), ok


class _Lazy:
    """``x[i]`` is ``fn(i)``."""

    def __init__(self, fn: Callable[[int], Any]) -> None:
        self.fn = fn

    def __getitem__(self, i: int) -> Any:
        return self.fn(i)


def _scalars_read(index_map: Any, n_grid: int) -> set[int]:
    """The scalar operands (by position) ``index_map`` reads: its inputs after the grid
    indices that an equation or its result uses."""
    jaxpr = getattr(index_map, "jaxpr", index_map)
    used = {id(v) for eqn in jaxpr.eqns for v in eqn.invars}
    used |= {id(v) for v in jaxpr.outvars}
    return {i for i, v in enumerate(jaxpr.invars[n_grid:]) if id(v) in used}


def _differs(a: Any, b: Any, cols: list[slice]) -> Any:
    """Per row and operand (its columns ``cols``): whether rows of ``a`` and ``b`` differ."""
    if not cols:
        return jnp.zeros((a.shape[0], 0), jnp.bool_)
    return jnp.stack([jnp.any(a[:, c] != b[:, c], axis=1) for c in cols], axis=1)


def _revisited(blocks: Any, dims: list[int]) -> Any:
    """Whether an output's blocks (a row of block indices per grid step) come back to a
    block after leaving it: a block starts two runs of consecutive steps (an index out
    of the output's blocks is no block)."""
    inside = jnp.all((blocks >= 0) & (blocks < jnp.asarray(dims, jnp.int32)), axis=1)
    flat = jnp.zeros(blocks.shape[:1], jnp.int32)
    for d, n in enumerate(dims):
        flat = flat * n + jnp.clip(blocks[:, d], 0, n - 1)
    flat = jnp.where(inside, flat, -1)
    starts = inside & jnp.concatenate([jnp.ones((1,), jnp.bool_), flat[1:] != flat[:-1]])
    total = math.prod(dims)
    runs = jnp.zeros((max(total, 1),), jnp.int32).at[
        jnp.where(starts, flat, total)].add(1, mode="drop")
    return jnp.any(runs > 1)


def _always_copied(block_indices: Callable[[Any], Any], table: np.ndarray,
                   infos: list[BlockSpecInfo], n_grid: int) -> list[bool]:
    """Per operand, whether its block is copied in at every step (its block index changes
    at every step), then per operand whether it is copied back at every step: known
    before the loop where no index map reads a scalar operand (the indices are then
    constants, computed here once more: in numpy where every map picks grid indices and
    constants (``GridBlocks.table``), else eagerly, by XLA (~150 ms of small compiles
    per kernel: the matmul's whole first trace took 216 ms with them, 25 without). Such a
    copy runs without a conditional (the RG-LRU scan's 4 inputs and its output: ~8% of
    its executable)."""
    never = [False] * (2 * len(infos))
    if len(table) < 2 or any(_scalars_read(info.index_map, n_grid) for info in infos):
        return never
    idx = GridBlocks(infos, n_grid).table(table)
    if idx is None:
        try:
            with jax.ensure_compile_time_eval():
                idx = np.asarray(jax.vmap(block_indices)(jnp.asarray(table))[0])
        except Exception:  # noqa: BLE001 - traced after all (a float product, ...): not known
            return never
    at, changes = 0, []
    for info in infos:
        n = len(info.dims)
        changes.append(bool(np.all(np.any(idx[1:, at:at + n] != idx[:-1, at:at + n], axis=1))))
        at += n
    return changes + changes  # (in: the first step always copies; out: the last)


def launch_function(kernel: PreparedKernel, grid: tuple[int, ...], points: list[tuple[int, ...]],
                    vmapped: tuple[int, ...], fill_mode: str,
                    facts: TraceFacts) -> Callable[..., Any]:
    """``f(budget, *scalars, *inputs) -> (outputs, flags, loops)`` of one launch of
    ``kernel`` over ``points`` (one core's grid order): ``loops``, the iterations its
    ``while`` loops ran, which stop past ``budget`` (raising ``FLAG_BUDGET``); ``facts``:
    what a first trace found (see ``TraceFacts``)."""
    k = kernel
    n_idx, n_in = len(k.scalar_names), len(k.inputs)
    infos = [*k.inputs, *k.outputs]
    for info in infos:
        _check_blocked(info)
    aliases = {o: i - n_idx for i, o in k.input_output_aliases}
    ids_of = [d for d in range(len(grid)) if d not in vmapped]
    counts = [grid[d] for d in ids_of]
    table = np.asarray(points, np.int32).reshape(len(points), len(grid))

    def fill(shape: tuple[int, ...], dtype: Any) -> Any:
        return jnp.full(shape, uninitialized_value(np.dtype(dtype), fill_mode), dtype)

    def f(budget: Any, *args: Any) -> Any:
        scalars, inputs = args[:n_idx], args[n_idx:]
        bufs: list[Any] = [jnp.asarray(s) for s in scalars]
        operands: list[Any] = [Handle(i) for i in range(n_idx)]
        hbm: list[int] = []
        for info, x in zip(k.inputs, inputs):
            x = jnp.asarray(x, info.dtype)
            if info.padded_shape != tuple(x.shape):
                x = fill(info.padded_shape, info.dtype).at[
                    tuple(slice(0, n) for n in x.shape)].set(x)
            hbm.append(len(bufs))
            bufs.append(x)
        for o, info in enumerate(k.outputs):
            if o in aliases:
                hbm.append(hbm[aliases[o]])
            else:
                hbm.append(len(bufs))
                bufs.append(fill(info.padded_shape, info.dtype))
        kernel_buf: list[int] = []
        for info, h in zip(infos, hbm):
            if info.in_hbm:
                kernel_buf.append(h)
            else:
                kernel_buf.append(len(bufs))
                bufs.append(fill(info.block_shape, info.dtype))
            operands.append(Handle(kernel_buf[-1]))
        n_sems = 0
        for i, s in enumerate(k.scratch):
            space = k.scratch_space(i)
            shape = tuple(s.aval.shape)
            if space == "semaphore":
                operands.append(SemHandle(n_sems, shape))
                n_sems += math.prod(shape)
            elif space in (MemorySpace.VMEM, MemorySpace.SMEM):
                operands.append(Handle(len(bufs)))
                bufs.append(fill(shape, s.aval.dtype))
            else:
                raise UnsupportedFeatureError(f"scratch '{s.name}' in {space}")
        st = TracedState(bufs, jnp.int32(0), facts, DmaTable.empty(n_sems))
        st.loops, st.budget = jnp.int32(0), budget
        if not points:
            return _outputs(st, hbm), st.flag, st.loops
        for info in k.outputs:
            nb = math.prod(_blocks_per_dim(info))
            if nb > _MAX_BLOCKS:
                raise UnsupportedFeatureError(f"output '{info.name}' has {nb} blocks")

        def grid_ctx(point: Any) -> GridContext:
            # (indexed where a program id is asked for: XLA keeps every slice of the
            # point that is made as one operation of its own)
            return GridContext(_Lazy(lambda axis: point[ids_of[axis]]), counts)

        def block_indices(point: Any) -> tuple[Any, Any]:
            """The block indices of every operand at grid point ``point``, as one vector,
            and the flags their index maps raised."""
            st_ = st.child(st.carry())
            st_.grid = grid_ctx(point)
            before = [*st_.bufs, *st_.dma.arrays()] if st_.dma is not None else []
            out: list[Any] = []
            for info in infos:
                ix = run_jaxpr(info.index_map, [], [*(point[d] for d in range(len(grid))),
                                                    *operands[:n_idx]], st_)
                out.extend(jnp.asarray(i, jnp.int32) for i in ix)
            after = [*st_.bufs, *st_.dma.arrays()] if st_.dma is not None else []
            if any(a is not b for a, b in zip(before, after)):
                raise UnsupportedFeatureError("an index map with effects")
            return (jnp.stack(out) if out else jnp.zeros((0,), jnp.int32)), st_.flag

        # Every grid point's block indices at once, before the loop (an index map is a
        # pure function of the grid point and the scalar operands, which it can only
        # read): the loop carries no indices from step to step. A kernel that writes a
        # scalar operand an index map reads (the simulator's index maps read it as it is
        # at each step) stays simulated.
        if facts.carried is not None and any(
                h in facts.carried for info in infos
                for h in _scalars_read(info.index_map, len(grid))):
            raise UnsupportedFeatureError("an index map reading a scalar operand the kernel writes")
        points_table = jnp.asarray(table)
        idx, flags = jax.vmap(block_indices)(points_table)
        always = _always_copied(block_indices, table, infos, len(grid))
        st.flag = st.flag | lax.reduce(flags, jnp.int32(0), lax.bitwise_or, (0,))
        cols, at = [], 0
        for info in infos:
            cols.append(slice(at, at + len(info.dims)))
            at += len(info.dims)
        one = jnp.ones((1, len(infos)), jnp.bool_)
        # per step and operand: the block differs from the step before's / the next's
        changed = jnp.concatenate([one, _differs(idx[1:], idx[:-1], cols)])
        moved = jnp.concatenate([_differs(idx[1:], idx[:-1], cols), one])
        # The pipeline copies step s + 1's input blocks in before step s's outputs are
        # written back; here blocks move strictly between steps. They differ only where
        # a write-back reaches the next step's input block: an aliased output's block
        # that the next step copies in (else the launch runs simulated, which models
        # the pipeline), or anything else the kernel writes into a copied input's HBM.
        for o, j in aliases.items():
            info = k.outputs[o]
            if info.in_hbm != k.inputs[j].in_hbm:
                raise UnsupportedFeatureError("an output aliasing an input of another memory space")
            if info.in_hbm or len(points) < 2:
                continue
            same = jnp.all(idx[:-1, cols[n_in + o]] == idx[1:, cols[j]], axis=1)
            st.raise_flag(FLAG_PREFETCH, jnp.any(same & moved[:-1, n_in + o] & changed[1:, j]))
        if facts.dma_dst is not None and any(
                hbm[j] in facts.dma_dst for j, info in enumerate(k.inputs) if not info.in_hbm):
            raise UnsupportedFeatureError("a DMA into the HBM array of a pipelined input")
        for o, info in enumerate(k.outputs):
            if not info.in_hbm and o not in aliases:
                st.raise_flag(FLAG_REVISIT,
                              _revisited(idx[:, cols[n_in + o]], _blocks_per_dim(info)))

        def copy_block(outer: TracedState, j: int, row: Any, into_kernel: bool,
                       when: Any) -> None:
            """If ``when``: copy operand ``j``'s (inputs, then outputs) block (its indices
            in ``row``, every operand's) HBM -> its kernel buffer (``into_kernel``) or
            back."""
            def run(carry: Any) -> Any:
                st = outer.child(carry)
                index = [row[d] for d in range(cols[j].start, cols[j].stop)]
                view, ok = _block_view(infos[j], index)
                st.raise_flag(FLAG_BLOCK, im.negate(ok))
                whole = View.whole(st.bufs[kernel_buf[j]].shape)
                src, sview, dst, dview = ((hbm[j], view, kernel_buf[j], whole) if into_kernel
                                          else (kernel_buf[j], whole, hbm[j], view))
                st.check_access(src, sview, write=False)
                st.check_access(dst, dview, write=True)
                st.write(dst, write_view(st.bufs[dst], dview, read_view(st.bufs[src], sview)))
                return st.carry()

            if always[j if into_kernel else len(infos) + j]:  # (no conditional to carry
                outer.restore(run(outer.carry()))  # the state in and out: see ``_always_copied``)
            else:
                outer.restore(lax.cond(when, run, lambda c: c, outer.carry()))

        def step(s: Any, carry: Any) -> Any:
            st_ = st.child(carry)
            cur = idx[s]
            for j, info in enumerate(infos):
                if j < n_in and not info.in_hbm:
                    copy_block(st_, j, cur, True, changed[s, j])
            st_.grid = grid_ctx(points_table[s])
            run_jaxpr(k.jaxpr, [], operands, st_)
            for j, info in enumerate(infos):
                if j >= n_in and not info.in_hbm:
                    copy_block(st_, j, cur, False, moved[s, j])
            return st_.carry()

        carry = lax.fori_loop(0, len(points), step, st.carry())
        st.restore(carry)
        assert st.dma is not None
        st.dma.finish(st)
        return _outputs(st, hbm), st.flag, st.loops

    def _outputs(st: TracedState, hbm: list[int]) -> list[Any]:
        """The outputs' arrays (``hbm``: each operand's HBM buffer, inputs first)."""
        out = []
        for o, (info, aval) in enumerate(zip(k.outputs, k.out_avals)):
            value = st.bufs[hbm[n_in + o]]
            region = info.array_region(tuple(aval.shape))
            out.append(value[region].astype(aval.dtype).reshape(aval.shape))
        return out

    return f
