"""A whole kernel launch as one pure function of its operands, for ``jax.jit``.

The grid loop of ``run/grid_loop.py`` traced: the same grid order (``schedule``), the
same HBM buffers (padded to whole blocks, filled with the launch's uninitialised value),
a block copied HBM -> VMEM only when its index changes and back when the next grid
point's differs, the revisit check; the body is ``launch_trace.run_jaxpr``. The
function returns the outputs and the flags of ``launch_state.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from palladium.interpret.compiled.launch_state import (
    FLAG_BLOCK,
    FLAG_REVISIT,
    Handle,
    LaunchState,
    SemHandle,
    TraceFacts,
    View,
    read_view,
    write_view,
)
from palladium.interpret.compiled.launch_trace import GridContext, run_jaxpr
from palladium.interpret.errors import UnsupportedFeatureError
from palladium.interpret.kernel.blocks import BlockSpecInfo
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
    starts, sizes, ok = [], [], jnp.bool_(True)
    for d, i, n in zip(info.dims, index, info.padded_shape):
        size = 1 if d.kind == "squeezed" else d.size
        start = i * size if d.kind == "blocked" else i
        ok = ok & (start >= 0) & (start + size <= n)
        starts.append(jnp.asarray(start, jnp.int32))
        sizes.append(size)
    dropped = [d.kind == "squeezed" for d in info.dims]
    return View(starts, sizes, [1] * len(sizes), dropped), ok


def launch_function(kernel: PreparedKernel, grid: tuple[int, ...], points: list[tuple[int, ...]],
                    vmapped: tuple[int, ...], fill_mode: str,
                    facts: TraceFacts) -> Callable[..., Any]:
    """``f(*scalars, *inputs) -> (outputs, flags)`` of one launch of ``kernel`` over
    ``points`` (one core's grid order); ``facts``: what a first trace found (see
    ``TraceFacts``)."""
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

    def f(*args: Any) -> Any:
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
        st = LaunchState(bufs, jnp.zeros((2, max(n_sems, 1)), jnp.int32), jnp.int32(0),
                         LaunchState.empty_table(), jnp.int32(0), facts)
        if not points:
            return _outputs(st, hbm), st.flag
        visited = []
        for info in k.outputs:
            nb = math.prod(_blocks_per_dim(info))
            if nb > _MAX_BLOCKS:
                raise UnsupportedFeatureError(f"output '{info.name}' has {nb} blocks")
            visited.append(jnp.zeros((max(nb, 1),), jnp.bool_))

        def block_indices(point: Any, st: LaunchState) -> list[list[Any]]:
            out = []
            for info in infos:
                idx = run_jaxpr(info.index_map, [], [*(point[d] for d in range(len(grid))),
                                                     *operands[:n_idx]], st, grid_ctx(point))
                out.append([jnp.asarray(i, jnp.int32) for i in idx])
            return out

        def grid_ctx(point: Any) -> GridContext:
            return GridContext([point[d] for d in ids_of], counts)

        def copy_block(outer: LaunchState, j: int, index: list[Any], into_kernel: bool,
                       when: Any) -> None:
            """If ``when``: copy block ``index`` of operand ``j`` (inputs, then outputs)
            HBM -> its kernel buffer (``into_kernel``) or back."""
            def run(carry: Any) -> Any:
                st = outer.child(carry)
                view, ok = _block_view(infos[j], index)
                st.raise_flag(FLAG_BLOCK, ~ok)
                whole = View.whole(st.bufs[kernel_buf[j]].shape)
                src, sview, dst, dview = ((hbm[j], view, kernel_buf[j], whole) if into_kernel
                                          else (kernel_buf[j], whole, hbm[j], view))
                st.check_access(src, sview, write=False)
                st.check_access(dst, dview, write=True)
                st.write(dst, write_view(st.bufs[dst], dview, read_view(st.bufs[src], sview)))
                return st.carry()

            outer.restore(lax.cond(when, run, lambda c: c, outer.carry()))

        def step(s: Any, c: Any) -> Any:
            carry, cur, prev, last, visited = c
            st_ = st.child(carry)
            point = jnp.asarray(table)[s]
            for i, info in enumerate(k.inputs):
                if info.in_hbm:
                    continue
                changed = (s == 0) | jnp.any(jnp.stack(cur[i]) != jnp.stack(prev[i]))
                copy_block(st_, i, cur[i], True, changed)
            run_jaxpr(k.jaxpr, [], operands, st_, grid_ctx(point))
            is_last = s == len(points) - 1
            nxt = block_indices(jnp.asarray(table)[jnp.minimum(s + 1, len(points) - 1)], st_)
            last, visited = list(last), list(visited)
            for o, info in enumerate(k.outputs):
                j = n_in + o
                b = cur[j]
                if info.in_hbm:
                    continue
                moved = is_last | jnp.any(jnp.stack(nxt[j]) != jnp.stack(b))
                copy_block(st_, j, b, False, moved)
                if o in aliases:
                    continue
                dims = _blocks_per_dim(info)
                inside = jnp.all(jnp.stack([(x >= 0) & (x < n) for x, n in zip(b, dims)]))
                flat = jnp.int32(0)
                for x, n in zip(b, dims):
                    flat = flat * n + jnp.clip(x, 0, n - 1)
                flat = jnp.where(inside, flat, -1)
                again = (last[o] != flat) & visited[o][jnp.maximum(flat, 0)] & inside
                st_.raise_flag(FLAG_REVISIT, again)
                visited[o] = visited[o].at[jnp.maximum(flat, 0)].set(True)
                last[o] = flat
            return st_.carry(), nxt, cur, last, visited

        cur0 = block_indices(jnp.asarray(table)[0], st)
        init = (st.carry(), cur0, cur0, [jnp.int32(-1)] * len(k.outputs), visited)
        carry, *_ = lax.fori_loop(0, len(points), step, init)
        st.restore(carry)
        st.finish()
        return _outputs(st, hbm), st.flag

    def _outputs(st: LaunchState, hbm: list[int]) -> list[Any]:
        """The outputs' arrays (``hbm``: each operand's HBM buffer, inputs first)."""
        out = []
        for o, (info, aval) in enumerate(zip(k.outputs, k.out_avals)):
            value = st.bufs[hbm[n_in + o]]
            region = info.array_region(tuple(aval.shape))
            out.append(value[region].astype(aval.dtype).reshape(aval.shape))
        return out

    return f
