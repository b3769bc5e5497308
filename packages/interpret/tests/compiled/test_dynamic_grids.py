"""Issue 42, item 6: a kernel called with many dynamic grid sizes does not compile and
keep one whole-launch executable per size (before: 150 grids kept +256 MiB, ~0.9 s of
compiling per new grid). At most ``MAX_GRIDS`` grids of a kernel are compiled whole and
``MAX_KEPT`` executables kept (the least recently used dropped); further grids run
simulated, with the same results."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi
from palladium.interpret import InterpretParams
from palladium.interpret.compiled import compiled_launch
from palladium.interpret.run.execution_plan import WHOLE_LAUNCH

pytestmark = pytest.mark.timeout(600)

R, C = 8, 128


def test_many_dynamic_grids_compile_a_bounded_number_of_executables(monkeypatch):
    monkeypatch.setattr(compiled_launch, "MIN_EQUATIONS_PER_LAUNCH", 0)
    compiles = []
    real = compiled_launch._compile

    def spy(kernel, grid, *args):
        compiles.append((kernel, grid))
        return real(kernel, grid, *args)

    monkeypatch.setattr(compiled_launch, "_compile", spy)

    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.tanh(x_ref[...]) + pl.num_programs(0).astype(jnp.float32)

    @jax.jit
    def f(n, x):
        return pl.pallas_call(
            kernel, grid=(n,), in_specs=[pl.BlockSpec((R, C), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((R, C), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
            # (the grid writes the first n blocks only: the rest of the output is left
            # uninitialised on purpose, and only the written rows are compared)
            interpret=InterpretParams(random_seed=4260, uninitialized_reads="off"))(x)

    x = np.random.default_rng(0).standard_normal((64 * R, C)).astype(np.float32)
    before = compiled_launch.STATS["compiled"]
    executables = pi.STATE.segments.compiled
    for n in range(1, 41):  # 40 grid sizes, 3 calls each
        for _ in range(3):
            out = np.asarray(f(jnp.int32(n), x))
        np.testing.assert_allclose(out[:n * R], np.tanh(x[:n * R]) + n, rtol=1e-6, atol=1e-6)
    grids = compiled_launch.MAX_GRIDS
    assert [g for _, g in compiles] == [(n,) for n in range(1, grids + 1)]
    assert pi.STATE.segments.compiled - executables <= grids
    prepared = compiles[0][0]
    assert len(prepared.launches.whole_launches) <= compiled_launch.MAX_KEPT
    # the kernel is hot from its launch WHOLE_LAUNCH: each compiled grid's calls but the
    # first WHOLE_LAUNCH - 1 of grid 1 ran compiled; grids past MAX_GRIDS ran simulated
    assert compiled_launch.STATS["compiled"] - before == 3 * grids - (WHOLE_LAUNCH - 1)
    # a grid compiled before, called again: compiled (kept, or made again from the cache)
    np.asarray(f(jnp.int32(2), x))
    assert compiled_launch.STATS["compiled"] - before == 3 * grids + 2 - WHOLE_LAUNCH
    assert pi.STATE.segments.compiled - executables <= grids


def test_at_most_max_kept_executables_are_kept_per_kernel():
    seen: set = set()
    futures: dict = {}
    for n in range(20):
        key = ((n,), 0, "nan")
        if compiled_launch._new_grid_refused(seen, key):
            continue
        while len(futures) >= compiled_launch.MAX_KEPT:
            futures.pop(next(iter(futures)))
        futures[key] = object()
    assert len(seen) == compiled_launch.MAX_GRIDS
    assert len(futures) == compiled_launch.MAX_KEPT
