"""Block indices and block regions of a kernel's operands, per grid point, cheaply.

Most index maps only pick grid indices and constants (``lambda i, j, k: (i, k)``,
``lambda b, h, q, kv: (b, h, q, 0)``). Such a map is compiled once into a projection
of the grid point, so a grid step does not walk the map's jaxpr; any other map (one
that computes, or reads scalar-prefetch refs) is evaluated as a jaxpr, as before.
The grid loop resolves each block's region once into the simulator's plans and keeps
them by (operand, block index), so a region is built once per block here too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.kernel.blocks import BlockSpecInfo

# One output of a projection: ("grid", axis) or ("const", value).
_Pick = tuple[str, int]


def _projection(closed: Any, n_grid: int) -> tuple[_Pick, ...] | None:
    """The index map as picks from the grid point, or None if it does more."""
    jaxpr = closed.jaxpr
    if jaxpr.eqns or closed.consts:
        return None
    grid_vars = {v: axis for axis, v in enumerate(jaxpr.invars[:n_grid])}
    picks: list[_Pick] = []
    for out in jaxpr.outvars:
        if isinstance(out, jc.Literal):
            value = np.asarray(out.val)
            if value.shape != () or not np.issubdtype(value.dtype, np.integer):
                return None
            picks.append(("const", int(value)))
        elif out in grid_vars:
            picks.append(("grid", grid_vars[out]))
        else:
            return None
    return tuple(picks)


class GridBlocks:
    """The block index maps of a kernel's operands (inputs then outputs)."""

    def __init__(self, infos: Sequence[BlockSpecInfo], n_grid: int) -> None:
        self.infos = tuple(infos)
        projections = [_projection(info.index_map, n_grid) for info in self.infos]
        picks = [p for p in projections if p is not None]
        self._projections = picks if len(picks) == len(projections) else None
        # Each projection as one C call on the grid point followed by the constants the
        # projections pick (``indices``): an ``itemgetter`` of its positions there (a
        # one-element or empty block index: a slice of them).
        # (a constant by its position from the end: whatever the point's length)
        consts = sorted({v for p in picks for kind, v in p if kind == "const"})
        at = {v: i - len(consts) for i, v in enumerate(consts)}
        self._consts = tuple(consts)
        self._getters = [_getter([v if kind == "grid" else at[v] for kind, v in p])
                         for p in picks]

    def indices(self, point: tuple[int, ...]) -> list[tuple[int, ...]] | None:
        """Every operand's block index at ``point``, or None: evaluate the maps instead."""
        if self._projections is None:
            return None
        extended = tuple(point) + self._consts
        return [get(extended) for get in self._getters]

    def table(self, points: np.ndarray) -> np.ndarray | None:
        """Every operand's block index at each row of ``points`` (grid points, one a
        row), side by side in one int32 row per point (inputs, then outputs), or None:
        a map does more than pick (evaluate the maps instead)."""
        if self._projections is None:
            return None
        points = np.asarray(points, np.int32).reshape(len(points), -1)
        cols = [points[:, v] if kind == "grid" else np.full(len(points), v, np.int32)
                for p in self._projections for kind, v in p]
        return np.stack(cols, axis=1) if cols else np.zeros((len(points), 0), np.int32)


def _getter(positions: list[int]) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
    """The tuple of the elements at ``positions`` of a tuple."""
    if len(positions) >= 2:
        return itemgetter(*positions)
    if not positions:
        return itemgetter(slice(0, 0))
    at = positions[0]
    return itemgetter(slice(at, at + 1 if at != -1 else None))
