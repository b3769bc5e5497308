"""Index maps that only pick grid indices and constants are projections of the grid
point (``kernel.grid_blocks``): each operand's block index is taken from the point and
the constants by position, whatever the constants' places (the last, alone, repeated)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from palladium.interpret import InterpretParams
from palladium.interpret.kernel.grid_blocks import _getter


def test_getters_pick_positions_of_the_point_then_the_constants():
    extended = (5, 6, 7) + (0, 9)  # a grid point, then the constants 0 and 9
    assert _getter([0, -2, 2])(extended) == (5, 0, 7)
    assert _getter([-1])(extended) == (9,)  # the last constant alone
    assert _getter([-2])(extended) == (0,)
    assert _getter([1])(extended) == (6,)
    assert _getter([])(extended) == ()


@pytest.mark.timeout(120)
def test_blocks_picked_by_grid_indices_and_constants_in_any_place():
    x = jnp.arange(32 * 256, dtype=jnp.float32).reshape(32, 256)  # blocks (8, 128): 4 x 2
    y = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)  # blocks (8, 128): 2 x 1
    z = jnp.arange(256, dtype=jnp.float32)  # blocks (128,): 2

    def kernel(x_ref, y_ref, z_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...] + z_ref[...][None, :]

    out = pl.pallas_call(
        kernel,
        grid=(4, 2),
        in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j)),
                  pl.BlockSpec((8, 128), lambda i, j: (1, 0)),  # constants only
                  pl.BlockSpec((128,), lambda i, j: (1,))],  # one constant, 1-D
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((32, 256), jnp.float32),
        interpret=InterpretParams(),
    )(x, y, z)
    want = np.asarray(x) + np.tile(np.asarray(y)[8:], (4, 2)) + np.tile(np.asarray(z)[128:], 2)
    np.testing.assert_array_equal(np.asarray(out), want)


class _Info:
    def __init__(self, fn, n_grid):
        self.index_map = jax.make_jaxpr(fn)(*[np.int32(0)] * n_grid)


def test_the_table_of_every_point_is_each_points_indices_side_by_side():
    from palladium.interpret.kernel.grid_blocks import GridBlocks

    maps = [lambda i, j, k: (i, k), lambda i, j, k: (0, j), lambda i, j, k: (7,),
            lambda i, j, k: ()]
    blocks = GridBlocks([_Info(m, 3) for m in maps], 3)
    points = np.array([(a, b, c) for a in range(3) for b in range(2) for c in range(4)])
    table = blocks.table(points)
    assert table.dtype == np.int32 and table.shape == (24, 5)
    for point, row in zip(points, table):
        want = [i for idx in blocks.indices(tuple(int(p) for p in point)) for i in idx]
        assert list(row) == want
    assert list(table[5]) == [0, 1, 0, 1, 7]  # point (0, 1, 1)


def test_a_map_that_computes_has_no_table():
    from palladium.interpret.kernel.grid_blocks import GridBlocks

    blocks = GridBlocks([_Info(lambda i, j: (i, j), 2), _Info(lambda i, j: (i + j,), 2)], 2)
    assert blocks.table(np.zeros((4, 2), np.int32)) is None
    assert blocks.indices((0, 0)) is None
