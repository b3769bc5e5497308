"""A compiled launch computes every grid point's block indices before its grid loop
(``launch_function.py``): the index maps run once over all points, and which blocks are
copied, and whether an output block is revisited, come from that table."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams, OutOfBoundsError, errors_as_raised
from palladium.interpret.compiled import compiled_launch
from palladium.interpret.compiled.launch_function import _differs, _revisited
from palladium.interpret.run.execution_plan import WHOLE_LAUNCH

pytestmark = pytest.mark.timeout(300)

G, R, C = 8, 8, 128


def _revisited_step_by_step(blocks, dims):
    """The check as the grid loop makes it, one step after another."""
    last, visited = -1, set()
    for row in blocks:
        inside = all(0 <= x < n for x, n in zip(row, dims))
        flat = int(np.ravel_multi_index(tuple(row), dims)) if inside else -1
        if inside and flat != last and flat in visited:
            return True
        if inside:
            visited.add(flat)
        last = flat
    return False


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3).flatmap(
    lambda dims: st.tuples(st.just(dims), st.lists(
        st.tuples(*[st.integers(-1, n) for n in dims]), min_size=1, max_size=12))))
def test_revisited_is_the_step_by_step_check(case):
    dims, rows = case
    blocks = np.asarray(rows, np.int32).reshape(len(rows), len(dims))
    assert bool(_revisited(jnp.asarray(blocks), dims)) == _revisited_step_by_step(blocks, dims)


def test_differs_compares_each_operands_columns():
    a = jnp.asarray([[0, 1, 2], [0, 1, 3], [5, 1, 3]], jnp.int32)
    b = jnp.asarray([[0, 1, 2], [0, 1, 2], [0, 1, 3]], jnp.int32)
    got = _differs(a, b, [slice(0, 1), slice(1, 3)])
    np.testing.assert_array_equal(got, [[False, False], [False, True], [True, False]])
    assert _differs(a, b, []).shape == (3, 0)


def _kernel(sel_ref, x_ref, o_ref):
    o_ref[...] = jnp.tanh(x_ref[...]) * 2.0 + 1.0


def _in_block(g, sel):
    # reads sel[g] while sel[G] is 0; with sel[G] = 1, step 1 reads sel[9]: out of bounds
    return (sel[g + G * sel[G]], 0)


def _call(params):
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(G,), in_specs=[pl.BlockSpec((R, C), _in_block)],
        out_specs=pl.BlockSpec((R, C), lambda g, sel: (g, 0)))
    return jax.jit(lambda sel, x: pl.pallas_call(
        _kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((G * R, C), jnp.float32),
        interpret=params)(sel, x))


def test_an_index_map_reading_out_of_bounds_on_a_compiled_launch_is_the_simulators_error(
        monkeypatch):
    monkeypatch.setattr(compiled_launch, "MIN_EQUATIONS_PER_LAUNCH", 0)
    perm = np.random.default_rng(3).permutation(G).astype(np.int32)
    sel = np.concatenate([perm, [0]]).astype(np.int32)
    x = np.random.default_rng(4).standard_normal((G * R, C)).astype(np.float32)
    call = _call(InterpretParams(random_seed=130))
    before = compiled_launch.STATS.copy()
    for _ in range(WHOLE_LAUNCH):
        out = np.asarray(call(sel, x))
        want = np.tanh(x.reshape(G, R, C)[perm].reshape(G * R, C)) * 2.0 + 1.0
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    assert compiled_launch.STATS["compiled"] == before["compiled"] + 1
    bad = sel.copy()
    bad[G] = 1
    with pytest.raises(OutOfBoundsError) as later, errors_as_raised():
        call(bad, x).block_until_ready()
    assert compiled_launch.STATS["an access out of bounds"] == before["an access out of bounds"] + 1
    simulated_only = _call(InterpretParams(compile_segments=False))
    with pytest.raises(OutOfBoundsError) as simulated, errors_as_raised():
        simulated_only(bad, x).block_until_ready()
    assert "'sel_ref'" in str(later.value) and "grid point (1,)" in str(later.value)
    assert str(later.value) == str(simulated.value)


def _rewriting_kernel(sel_ref, x_ref, o_ref):
    # each step points the next step's input block at the block after its own
    g = pl.program_id(0)
    o_ref[...] = x_ref[...] + 1.0
    sel_ref[g + 1] = (sel_ref[g] + 1) % G


def test_a_kernel_writing_its_scalar_operands_stays_simulated(monkeypatch):
    """The index maps read the scalar operands as they are when the pipeline computes
    the next step's blocks: at the start of the step before, before its body writes
    them (measured on a v5e: blocks 3, 0, 0, 0, not 3, 0, 1, 2;
    ``benchmarks/chip/compiled_semantics.py``). A kernel that writes them is not
    compiled with indices computed before the loop."""
    monkeypatch.setattr(compiled_launch, "MIN_EQUATIONS_PER_LAUNCH", 0)
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(G,),
        in_specs=[pl.BlockSpec((R, C), lambda g, sel: (sel[g], 0))],
        out_specs=pl.BlockSpec((R, C), lambda g, sel: (g, 0)))
    call = jax.jit(lambda sel, x: pl.pallas_call(
        _rewriting_kernel, grid_spec=spec,
        out_shape=jax.ShapeDtypeStruct((G * R, C), jnp.float32),
        interpret=InterpretParams(random_seed=131))(sel, x))
    sel = np.array([3] + [0] * G, np.int32)
    x = np.arange(G * R * C, dtype=np.float32).reshape(G, R, C)
    want = (x[[3] + [0] * (G - 1)] + 1.0).reshape(G * R, C)  # (sel[g + 1] read at step g's start)
    before = compiled_launch.STATS["compiled"]
    for _ in range(4):
        np.testing.assert_array_equal(np.asarray(call(sel, x.reshape(G * R, C))), want)
    assert compiled_launch.STATS["compiled"] == before


def test_blocks_copied_at_every_step_are_known_before_the_loop():
    """``_always_copied``: per operand, whether its block index changes at every step
    (copied in, then back, with no conditional); not known (False) where an index map
    reads a scalar operand."""
    import types

    from palladium.interpret.compiled.launch_function import _always_copied

    def info(fn, n_scalars=0):
        jaxpr = jax.make_jaxpr(fn)(0, *[np.zeros(1, np.int32)] * n_scalars)
        return types.SimpleNamespace(index_map=jaxpr, dims=[0, 0])

    rows, cols = info(lambda i: (i, 0)), info(lambda i: (0, i // 2))
    table = np.arange(6, dtype=np.int32)[:, None]

    def block_indices(point):
        i = point[0]
        return jnp.stack([i, 0, 0, i // 2]), jnp.int32(0)

    assert _always_copied(block_indices, table, [rows, cols], 1) == [True, False, True, False]
    reads = info(lambda i, s: (s[0], i), 1)
    assert _always_copied(block_indices, table, [rows, reads], 1) == [False] * 4
