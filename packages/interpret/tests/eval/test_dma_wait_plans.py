"""A DMA wait's plan (its size and semaphore) is kept by the operands it depends on: a
kernel copying pages from starts its data picks builds one plan per wait, not one per
start, and waits exactly as before; where the leaves might size the region (or cannot
be shown not to), every operand keys the plan, as before."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams, OutOfBoundsError, errors_as_raised
from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval import rules_dma

PAGES, PAGE, LANES = 16, 8, 128


def _gather(table_ref, x_hbm, o_ref, buf, sems):
    """Copies the pages the table names, two in flight, and sums them into the output."""
    def copy(i, slot):
        return pltpu.make_async_copy(x_hbm.at[pl.ds(table_ref[i] * PAGE, PAGE)],
                                     buf.at[slot], sems.at[slot])

    copy(0, 0).start()
    o_ref[...] = jnp.zeros_like(o_ref)

    def body(i, carry):
        slot = i % 2

        @pl.when(i + 1 < table_ref.shape[0])
        def _():
            copy(i + 1, 1 - slot).start()

        copy(i, slot).wait()
        o_ref[...] += buf[slot]
        return carry

    jax.lax.fori_loop(0, table_ref.shape[0], body, 0)


def _call(n):
    return pl.pallas_call(
        _gather,
        out_shape=jax.ShapeDtypeStruct((PAGE, LANES), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((PAGE, LANES), lambda i, t: (0, 0)),
            scratch_shapes=[pltpu.VMEM((2, PAGE, LANES), jnp.float32),
                            pltpu.SemaphoreType.DMA((2,))]),
        interpret=InterpretParams(),
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("narrowed", [True, False])
def test_waits_with_new_page_starts_reuse_their_plan(monkeypatch, narrowed):
    built = []
    nbytes = rules_dma.view_nbytes
    monkeypatch.setattr(rules_dma, "view_nbytes",
                        lambda *a: built.append(1) or nbytes(*a))
    if not narrowed:  # every operand keys the plan, as before
        monkeypatch.setattr(jc, "dma_placing_leaves", lambda tree: frozenset())
    x = np.arange(PAGES * PAGE * LANES, dtype=np.float32).reshape(PAGES * PAGE, LANES)
    table = np.array([5, 2, 9, 14, 0, 7, 3, 11], np.int32)
    got = _call(len(table))(table, x)
    want = x.reshape(PAGES, PAGE, LANES)[table].sum(0)
    np.testing.assert_array_equal(np.asarray(got), want)
    # one wait equation, eight starts, two semaphore slots: a plan per slot, where every
    # start (and its slot) built its own before
    assert len(built) == (2 if narrowed else len(table))


def _tree(*indices):
    """The operand tree of a DMA from ``x.at[indices]`` (``x`` of shape (4, 32, 128)) to
    a VMEM buffer, traced as a kernel makes it."""
    trees = []

    def kernel(i_ref, x_hbm, o_ref, buf, sem):
        i = i_ref[0]
        built = [i if n == "i" else pl.ds(i, 8) if n == "start" else
                 pl.ds(0, i) if n == "size" else n for n in indices]
        pltpu.make_async_copy(x_hbm.at[tuple(built)], buf, sem).start()

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i, t: (0, 0)),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA]))
    jaxpr = jax.make_jaxpr(call)(jnp.zeros((1,), jnp.int32), jnp.zeros((4, 32, 128)))

    def find(j):
        for e in j.eqns:
            if e.primitive is jc.dma_start_p:
                trees.append(e.params["tree"])
            for v in e.params.values():
                inner = getattr(v, "jaxpr", v)
                if hasattr(inner, "eqns"):
                    find(inner)

    find(jaxpr.jaxpr)
    (tree,) = trees
    return tree


def test_slice_starts_and_scalar_indices_only_place_a_region():
    # operands: x, its two index leaves (the row, the slice's start), buf, sem
    assert jc.dma_placing_leaves(_tree("i", "start", slice(None))) == {1, 2}
    # (a constant row index is a leaf too: jax makes it an array)
    assert jc.dma_placing_leaves(_tree(0, slice(0, 8), slice(None))) == {1}


def test_a_slice_size_among_the_leaves_places_nothing():
    assert jc.dma_placing_leaves(_tree(0, "size", slice(None))) == set()


def _strided(table_ref, x_hbm, o_ref, buf, sem):
    """Copies, per table entry (row, column start), a strided 2-d piece into a slot of a
    3-d buffer: scalar indices and slices with static and dynamic starts on both sides,
    the source through two indexers."""
    for i in range(table_ref.shape[0] // 2):
        row, col = table_ref[2 * i], table_ref[2 * i + 1]
        copy = pltpu.make_async_copy(
            x_hbm.at[row].at[pl.ds(col, 4, stride=2), pl.ds(0, LANES)],
            buf.at[i % 2, pl.ds(2, 4), :], sem)
        copy.start()
        copy.wait()
        o_ref[i] = buf[i % 2]


def _strided_call(n):
    return pl.pallas_call(
        _strided,
        out_shape=jax.ShapeDtypeStruct((n, 8, LANES), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((n, 8, LANES), lambda i, t: (0, 0, 0)),
            scratch_shapes=[pltpu.VMEM((2, 8, LANES), jnp.float32),
                            pltpu.SemaphoreType.DMA]),
        # (Mosaic rejects strided DMAs: the interpreter's copies are what is tested; rows
        # 0:2 and 6:8 of each buffer slot are never written and reach the output)
        interpret=InterpretParams(check_lowering=False, uninitialized_reads="off"),
    )


@pytest.mark.timeout(300)
def test_a_start_placed_from_a_kept_plan_copies_and_fails_as_a_fully_built_one(monkeypatch):
    x = np.arange(4 * 24 * LANES, dtype=np.float32).reshape(4, 24, LANES)
    table = np.array([1, 3, 0, 10, 3, 0, 2, 15, 1, 7], np.int32)  # (row, column start)
    bad = table.copy()
    bad[5] = 20  # the third copy reads columns 20, 22, 24, 26 of 24
    regions, composed = [], []
    region, side_plan = rules_dma._region, rules_dma._side_plan
    monkeypatch.setattr(rules_dma, "_region", lambda *a: regions.append(a) or region(*a))
    monkeypatch.setattr(rules_dma, "_side_plan",
                        lambda *a: composed.append(a) or side_plan(*a))
    placed = np.asarray(_strided_call(5)(table, x))
    # every start placed from a kept plan, its regions from the indexers composed once
    # (``_placement``): a source plan per start, the destination's slots' kept
    assert regions == [] and 1 <= len(composed) <= 2 * 5
    with pytest.raises(OutOfBoundsError) as placed_error, errors_as_raised():
        _strided_call(5)(bad, x).block_until_ready()
    monkeypatch.setattr(jc, "dma_index_layout", lambda tree: None)  # every plan built whole
    regions.clear()
    built = np.asarray(_strided_call(5)(table, x))
    with pytest.raises(OutOfBoundsError) as built_error, errors_as_raised():
        _strided_call(5)(bad, x).block_until_ready()
    assert regions == []
    np.testing.assert_array_equal(placed, built)
    for i in range(5):  # each copy as numpy slices it
        row, col = table[2 * i], table[2 * i + 1]
        np.testing.assert_array_equal(placed[i, 2:6], x[row, col:col + 8:2])
    assert str(placed_error.value) == str(built_error.value)
    assert "Out-of-bounds read by a DMA" in str(placed_error.value)
    assert "region [3, 20:27:2, 0:128]" in str(placed_error.value)


def _indexers(draw_int, shape):
    """Random ``dma_index_layout`` indexers of a buffer of ``shape``: per indexer, an
    entry per dimension still kept (an index, or a slice with a static or dynamic start
    and a static size and stride), dynamic entries at operand positions 0..5."""
    kept, out = len(shape), []
    for _ in range(draw_int(1, 3)):
        if not kept:
            break
        entries = []
        for _ in range(kept):
            at = draw_int(0, 5)
            if draw_int(0, 2) == 0:
                entries.append(("index", at))
            else:
                entries.append(("slice", None if draw_int(0, 1) else at, draw_int(0, 4),
                                draw_int(0, 4), draw_int(1, 3)))
        kept -= sum(e[0] == "index" for e in entries)
        out.append(tuple(entries))
    return tuple(out)


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_indexers_composed_once_give_the_region_composed_at_each_start(data):
    draw_int = lambda lo, hi: data.draw(st.integers(lo, hi))  # noqa: E731
    shape = tuple(draw_int(1, 9) for _ in range(draw_int(1, 4)))
    indexers = _indexers(draw_int, shape)
    values = [draw_int(-3, 12) for _ in range(6)]
    positions, dims = rules_dma._placement(shape, indexers)
    assert set(positions) <= set(range(6))
    assert rules_dma._placed_region(dims, values) == rules_dma._region(shape, indexers, values)


def test_indexers_with_a_negative_stride_are_not_composed():
    assert rules_dma._placement((8, 4), ((("slice", 0, 7, 4, -1), ("index", 1)),)) is None
    assert rules_dma._placement((8, 4), ((("index", 0),),)) is None  # (rank mismatch)
