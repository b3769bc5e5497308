"""A core's grid points in order, computed per index instead of built up front.

A launch used to build its whole schedule before the first grid step: a tuple per grid
point and, for a parallel dimension, a permutation of all its coordinates. A 10^9-point
grid spent 11-61 s and +3 GiB on it before the progress log or the watchdog started
(issue 42, item 5). :class:`GridPoints` is the same sequence computed on demand: grid
point ``i`` is the unravelled linear index ``lo + i``, each parallel coordinate mapped
through its dimension's order. Up to ``EAGER_POINTS`` points it is a plain list, as
before (the grid loop indexes a list fastest); a parallel dimension of up to
``LAZY_DIMENSION`` coordinates keeps jax's own permutation for the seed
(``grid_order.py``: a test recording grid points sees jax's order); a longer one (which
jax's interpreter would have to materialise too) is ordered by :class:`FeistelOrder`, a
bijection of ``range(n)`` computed per index, reproducible from the seed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, overload

from palladium.interpret.run.grid_order import parallel_orders

__all__ = ["EAGER_POINTS", "LAZY_DIMENSION", "FeistelOrder", "GridPoints", "grid_points"]

GridPoint = tuple[int, ...]

#: Grids of up to this many points per core are lists (built in ~1 us per point).
EAGER_POINTS = 1 << 16
#: Parallel dimensions longer than this are ordered by ``FeistelOrder``, not by jax's
#: permutation (a sort of all the coordinates: ~0.1 s and 12 bytes per coordinate).
LAZY_DIMENSION = 1 << 20
_ROUNDS = 4
_MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """A 64-bit finaliser (splitmix64's): every input bit reaches every output bit."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


class FeistelOrder:
    """A permutation of ``range(n)``, ``order[i]`` computed in O(1) memory: a balanced
    Feistel network over the smallest ``4**k >= n`` (a bijection whatever its round
    function), cycle-walked back into ``range(n)`` (at most 4 steps on average)."""

    def __init__(self, n: int, seed: int, dimension: int) -> None:
        self.n = n
        self.half = max(1, math.ceil(math.log2(max(n, 2)) / 2))
        self.mask = (1 << self.half) - 1
        self.keys = [_mix((seed & _MASK64) ^ _mix(dimension * _ROUNDS + r + 1))
                     for r in range(_ROUNDS)]

    def _once(self, x: int) -> int:
        left, right = x >> self.half, x & self.mask
        for key in self.keys:
            left, right = right, left ^ (_mix(right ^ key) & self.mask)
        return (left << self.half) | right

    def __getitem__(self, i: int) -> int:
        x = self._once(i)
        while x >= self.n:
            x = self._once(x)
        return x

    def __len__(self) -> int:
        return self.n


class GridPoints(Sequence[GridPoint]):
    """Points ``lo`` up to ``hi`` (linear, row-major) of ``grid``, each coordinate ``d``
    mapped through ``orders[d]`` (None: as it is)."""

    def __init__(self, grid: GridPoint, orders: Sequence[Any], lo: int, hi: int) -> None:
        self.grid, self.orders, self.lo, self.hi = tuple(grid), list(orders), lo, hi

    def __len__(self) -> int:
        return self.hi - self.lo

    def _point(self, linear: int) -> GridPoint:
        coords = []
        for n in reversed(self.grid):
            linear, c = divmod(linear, n)
            coords.append(c)
        coords.reverse()
        return tuple(int(o[c]) if o is not None else c for c, o in zip(coords, self.orders))

    @overload
    def __getitem__(self, i: int) -> GridPoint: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[GridPoint]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._point(self.lo + i)

    def __iter__(self) -> Iterator[GridPoint]:
        for linear in range(self.lo, self.hi):
            yield self._point(linear)


def grid_points(grid: GridPoint, parallel: Sequence[bool], seed: int, num_cores: int,
                shuffle: bool) -> list[Sequence[GridPoint]]:
    """Each core's grid points in order: the parallel dimensions (``shuffle``: ordered by
    ``seed``) split over ``num_cores`` cores (megacore)."""
    sizes = [n for n, p in zip(grid, parallel) if p] if shuffle else []
    small = tuple(n for n in sizes if n <= LAZY_DIMENSION)
    jax_orders = iter(parallel_orders(small, seed))
    orders: list[Any] = []
    for d, (n, p) in enumerate(zip(grid, parallel)):
        if not (p and shuffle):
            orders.append(None)
        elif n <= LAZY_DIMENSION:
            orders.append(next(jax_orders))
        else:
            orders.append(FeistelOrder(n, seed, d))
    total = math.prod(grid)
    par_size = math.prod(n for n, p in zip(grid, parallel) if p)
    per_core = math.ceil(par_size / num_cores) if par_size else 0
    per_point = total // par_size if par_size else 0
    out: list[Sequence[GridPoint]] = []
    for c in range(num_cores):
        lo = min(c * per_core * per_point, total)
        hi = min((c + 1) * per_core * per_point, total)
        points = GridPoints(grid, orders, lo, hi)
        out.append(list(points) if len(points) <= EAGER_POINTS else points)
    return out
