"""Grid arithmetic: stepping grid indices, comparing block indices, megacore splits.

Every index is an int32 (traced or Python); a grid dimension may be a traced value
(dynamic grid).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from palladium.pipeline import _jax_compat as jc
from palladium.pipeline.errors import PipelineConfigError, PipelineNotImplementedError

Index = Any  # int | jax.Array
Grid = tuple[Any, ...]


def cdiv(a, b):
    """Ceiling division for Python ints or traced ints."""
    if isinstance(a, int) and isinstance(b, int):
        return -(-a // b)
    return lax.div(a + b - 1, b)


def align_to(x, multiple: int):
    """``x`` rounded up to a multiple of ``multiple``."""
    return cdiv(x, multiple) * multiple


def i32(x):
    """``x`` as an int32 scalar without adding an op when it already is one.

    Python ints become numpy scalars (literals in the jaxpr), int32 jax values pass
    through; only other dtypes are converted. Tracing cost is per op, so the grid
    arithmetic below avoids every op it can decide statically.
    """
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return np.int32(x)
    if getattr(x, "dtype", None) == np.int32 and getattr(x, "shape", None) == ():
        return x
    return lax.convert_element_type(x, np.int32)


def zero_unit_dims(indices: Sequence[Index], grid: Grid) -> tuple[Index, ...]:
    """int32 indices, with a literal 0 on every size-1 dimension (a constant for XLA)."""
    return tuple(
        np.int32(0) if isinstance(g, int) and g == 1 else i32(i)
        for i, g in zip(indices, grid, strict=True)
    )


def next_index(indices: Sequence[Index], grid: Grid, *, overflow: bool = False) -> tuple:
    """The grid indices one step later in row-major order.

    Without ``overflow`` the last step wraps to all zeros; with it the outermost index
    keeps counting past its bound (used to detect the end of a lookahead).
    """
    out: list[Index] = []
    carry: Any = True
    rank = len(grid)
    for depth, (i, g) in enumerate(reversed(list(zip(indices, grid, strict=True)))):
        bumped = i32(i + 1) if carry is True else lax.select(carry, i32(i + 1), i32(i))
        carry = False if (overflow and depth == rank - 1) else bumped == g
        out.append(bumped if carry is False else lax.select(carry, np.int32(0), bumped))
    result = tuple(reversed(out))
    return result if overflow else zero_unit_dims(result, grid)


def prev_index(indices: Sequence[Index], grid: Grid) -> tuple:
    """The grid indices one step earlier (the first step wraps to the last)."""
    out: list[Index] = []
    borrow: Any = True
    for i, g in reversed(list(zip(indices, grid, strict=True))):
        lowered = i32(i - 1) if borrow is True else lax.select(borrow, i32(i - 1), i32(i))
        borrow = lowered == -1
        out.append(lax.select(borrow, i32(g - 1), lowered))
    return zero_unit_dims(tuple(reversed(out)), grid)


def _or(a, b):
    # Static booleans fold away so that a block index that never changes costs nothing.
    if a is True or b is True:
        return True
    if a is False:
        return b
    if b is False:
        return a
    return a | b


def _differ(x, y):
    return x is not y and x != y


def indices_differ(xs, ys):
    """Whether two block-index tuples differ (static bool when decidable, else traced)."""

    def leaf_differs(x, y):
        if isinstance(x, jc.Slice):
            parts = (_differ(x.start, y.start), _differ(x.size, y.size),
                     _differ(x.stride, y.stride))
            return functools.reduce(_or, parts, False)
        return _differ(x, y)

    is_slice = lambda v: isinstance(v, jc.Slice)  # noqa: E731
    diffs = jax.tree.map(leaf_differs, xs, ys, is_leaf=is_slice)
    return functools.reduce(_or, jax.tree.leaves(diffs), False)


def all_less(xs, ys):
    """Whether every index of ``xs`` is below the matching bound of ``ys``."""
    return functools.reduce(lambda a, b: a & b,
                            jax.tree.leaves(jax.tree.map(lambda x, y: x < y, xs, ys)), True)


def num_steps(grid: Grid):
    """The number of grid steps (a Python int for a static grid)."""
    return math.prod(grid)


def core_info(core_axis) -> tuple[Any, Any]:
    """``(num_cores, core_id)`` of a grid axis (int) or mesh axis name(s), or Nones."""
    if core_axis is None:
        return None, None
    if isinstance(core_axis, int):
        return jc.num_programs(core_axis), jc.program_id(core_axis)
    return lax.axis_size(core_axis), lax.axis_index(core_axis)


def _with(values: tuple, position: int, value) -> tuple:
    return (*values[:position], value, *values[position + 1:])


def partition_grid(grid: Grid, dimension_semantics, num_cores, core_id) -> tuple[Grid, tuple]:
    """This core's share of ``grid`` and the offset of its share, for megacore.

    The first parallel dimension divisible by the core count is split evenly. Otherwise
    the single dynamic parallel dimension, or else the largest static parallel one, is
    split as evenly as possible: the first ``size % num_cores`` cores get one extra
    step each.
    """
    if num_cores is None or core_id is None:
        return grid, (0,) * len(grid)
    if not isinstance(num_cores, int):
        raise PipelineNotImplementedError(
            "Cannot partition grid over dynamic number of cores."
        )
    if num_cores == 1:
        return grid, (0,) * len(grid)
    if dimension_semantics is None:
        dimension_semantics = (jc.ARBITRARY,) * len(grid)
    if len(dimension_semantics) != len(grid):
        raise PipelineConfigError(
            f"dimension_semantics must be the same length as grid: {dimension_semantics=}"
            f" for {grid=}"
        )
    parallel = [i for i, d in enumerate(dimension_semantics) if _is_parallel(d)]
    if not parallel:
        raise PipelineNotImplementedError(
            "Cannot partition over cores without parallel grid dimensions:"
            f" {dimension_semantics=}"
        )
    core_id = jnp.int32(core_id)
    zeros = (0,) * len(grid)
    for i in parallel:
        if isinstance(grid[i], int) and grid[i] % num_cores == 0:
            share = grid[i] // num_cores
            return _with(grid, i, share), _with(zeros, i, core_id * share)
    dynamic = [i for i in parallel if not isinstance(grid[i], int)]
    static = [i for i in parallel if isinstance(grid[i], int)]
    if len(dynamic) > 1:
        raise PipelineNotImplementedError(
            f"Cannot partition over multiple dynamic parallel dimensions: {grid=}"
        )
    if dynamic and not static:
        dim = dynamic[0]
    else:
        largest = max(grid[i] for i in static)
        dim = next(i for i in static if grid[i] == largest)
    base, rem = divmod(grid[dim], num_cores)
    share = jnp.where(core_id < rem, jnp.int32(base + 1), jnp.int32(base))
    offset = jnp.where(core_id < rem, core_id * share, jnp.int32(core_id * base + rem))
    return _with(grid, dim, share), _with(zeros, dim, offset)


def _is_parallel(semantics) -> bool:
    if isinstance(semantics, str):
        return semantics == "parallel"
    return semantics == jc.PARALLEL
