"""An out-of-bounds block copy names the likely bug: which index map returned which
block against the valid range, that index map's own line, and a hint to fix it (not the
switches that would read past the array and hide it)."""

import inspect

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

import palladium.interpret as pi

pytestmark = pytest.mark.timeout(120)

X = jnp.arange(64 * 256, dtype=jnp.float32).reshape(64, 256)


def copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def one_block_ahead(i):
    return (i + 1, 0)  # BUG: block 8 of 8 at the last grid point


def _line_of(fn):
    return f"{fn.__name__} at test_block_messages.py:{inspect.getsourcelines(fn)[1]}"


def _first_line(error):
    return str(error).splitlines()[0]


@pytest.mark.parametrize("call_number", [1, 2, 3])  # 3: the compiled launch's flag
def test_an_index_map_one_block_ahead_names_the_block_the_range_and_its_line(call_number):
    call = pl.pallas_call(
        copy_kernel, grid=(8,), in_specs=[pl.BlockSpec((8, 256), one_block_ahead)],
        out_specs=pl.BlockSpec((8, 256), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((64, 256), jnp.float32), interpret=pi.InterpretParams())
    for _ in range(call_number - 1):
        with pytest.raises(pi.OutOfBoundsError):
            call(X)
    with pytest.raises(pi.OutOfBoundsError) as info:
        call(X)
    assert _first_line(info.value) == (
        "device 0 core 0: index_map returned block 8 for input 'x_ref' (dimension 0 of "
        "block index (8, 0) at grid point (7,)); valid blocks are 0..7 (index_map "
        f"{_line_of(one_block_ahead)}).")
    text = str(info.value)
    assert text.endswith(
        "Fix the index_map (or the grid) so that every grid point maps to an existing "
        "block: dimension 0 of 'x_ref' (64 elements) has pl.cdiv(64, 8) = 8 blocks of 8 (a "
        "partial last block is allowed).")
    assert "out_of_bounds_reads" not in text and "buffer_bounds" not in text
    # jax's own phrase stays (tests written against jax's interpreter match it)
    assert 'Out-of-bounds block index (8, 0) for input "x_ref" in iteration (7,)' in text


def test_an_output_index_map_in_the_second_dimension_and_a_ragged_array():
    def column_past_the_end(i, j):
        return (i, j + 2)

    call = pl.pallas_call(
        copy_kernel, grid=(1, 2), in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((8, 128), column_past_the_end),
        out_shape=jax.ShapeDtypeStruct((8, 300), jnp.float32), interpret=pi.InterpretParams())
    with pytest.raises(pi.OutOfBoundsError) as info:
        call(jnp.ones((8, 300), jnp.float32))
    # 300 columns: 3 blocks of 128, the last one partial (block 2 is legal)
    assert _first_line(info.value) == (
        "device 0 core 0: index_map returned block 3 for output 'o_ref' (dimension 1 of "
        "block index (0, 3) at grid point (0, 1)); valid blocks are 0..2 (index_map "
        f"{_line_of(column_past_the_end)}).")
    assert str(info.value).endswith("dimension 1 of 'o_ref' (300 elements) has "
                                    "pl.cdiv(300, 128) = 3 blocks of 128 (a partial last "
                                    "block is allowed).")


def test_a_negative_block_is_out_of_range_too():
    call = pl.pallas_call(
        copy_kernel, grid=(2,), in_specs=[pl.BlockSpec((8, 256), lambda i: (i - 1, 0))],
        out_specs=pl.BlockSpec((8, 256), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((16, 256), jnp.float32), interpret=pi.InterpretParams())
    with pytest.raises(pi.OutOfBoundsError,
                       match=r"^device 0 core 0: index_map returned block -1 for input 'x_ref' "
                             r"\(dimension 0 of block index \(-1, 0\) at grid point \(0,\)\); "
                             r"valid blocks are 0\.\.1 \(index_map <lambda> at "
                             r"test_block_messages\.py:\d+\)\."):
        call(X[:16])
