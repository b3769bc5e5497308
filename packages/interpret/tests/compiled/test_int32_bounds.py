"""Issue 42, item 1: a compiled launch's bounds checks cannot be fooled by int32
wrap-around. ``pl.ds(idx, 8)`` with ``idx = 2**31 - 1`` (a common "no page" sentinel)
makes ``idx + 8`` wrap negative; an index map returning ``2**29`` for a block of 8 rows
makes ``block * 8`` wrap to 0. Calls 1-2 (simulated) raise ``OutOfBoundsError``; from
call 3 on (the whole-launch executable) the same error must come, not other data."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams, OutOfBoundsError, errors_as_raised
from palladium.interpret.compiled import compiled_launch
from palladium.interpret.run.execution_plan import WHOLE_LAUNCH

pytestmark = pytest.mark.timeout(300)

G, R, C = 4, 8, 128
SENTINEL = 2**31 - 1


@pytest.fixture
def always_worth(monkeypatch):
    monkeypatch.setattr(compiled_launch, "MIN_EQUATIONS_PER_LAUNCH", 0)


def _dma_call(seed):
    """Step g copies rows ``idx[g]:idx[g]+8`` of ``src`` (HBM) by DMA."""
    def kernel(idx_ref, src_hbm, o_ref, buf, sem):
        g = pl.program_id(0)
        copy = pltpu.make_async_copy(src_hbm.at[pl.ds(idx_ref[g], R)], buf, sem)
        copy.start()
        copy.wait()
        o_ref[...] = buf[...] * 2.0 + 1.0

    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(G,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((R, C), lambda g, idx: (g, 0)),
        scratch_shapes=[pltpu.VMEM((R, C), jnp.float32), pltpu.SemaphoreType.DMA(())])
    return jax.jit(lambda idx, src: pl.pallas_call(
        kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((G * R, C), jnp.float32),
        interpret=InterpretParams(random_seed=seed))(idx, src))


def _load_call(seed):
    """Step g loads rows ``idx[g]:idx[g]+8`` of its whole (64, 128) VMEM input."""
    def kernel(idx_ref, x_ref, o_ref):
        g = pl.program_id(0)
        o_ref[...] = x_ref[pl.ds(idx_ref[g], R), :] * 2.0 + 1.0

    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(G,),
        in_specs=[pl.BlockSpec((8 * R, C), lambda g, idx: (0, 0))],
        out_specs=pl.BlockSpec((R, C), lambda g, idx: (g, 0)))
    return jax.jit(lambda idx, src: pl.pallas_call(
        kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((G * R, C), jnp.float32),
        interpret=InterpretParams(random_seed=seed))(idx, src))


def _index_map_call(seed):
    """Step g's input block is ``idx[g]`` (blocks of 8 rows)."""
    def kernel(idx_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + 1.0

    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(G,),
        in_specs=[pl.BlockSpec((R, C), lambda g, idx: (idx[g], 0))],
        out_specs=pl.BlockSpec((R, C), lambda g, idx: (g, 0)))
    return jax.jit(lambda idx, src: pl.pallas_call(
        kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((G * R, C), jnp.float32),
        interpret=InterpretParams(random_seed=seed))(idx, src))


@pytest.mark.parametrize("make, seed, bad", [
    (_dma_call, 4201, SENTINEL),       # a DMA of pl.ds(2**31 - 1, 8): idx + 8 wraps
    (_load_call, 4202, SENTINEL),      # a VMEM load of pl.ds(2**31 - 1, 8)
    (_index_map_call, 4203, 2**29),    # block 2**29 of 8 rows: 2**29 * 8 wraps to 0
])
def test_an_index_whose_int32_arithmetic_wraps_is_out_of_bounds_on_every_call(
        always_worth, make, seed, bad):
    rng = np.random.default_rng(seed)
    src = rng.standard_normal((8 * R, C)).astype(np.float32)
    good = np.array([0, 3, 1, 2], np.int32) * (1 if make is _index_map_call else R)
    call = make(seed)
    before = compiled_launch.STATS.copy()
    expected = np.float64(src.reshape(8, R, C)[good // (1 if make is _index_map_call else R)])
    for _ in range(WHOLE_LAUNCH):  # hot: the last call runs the whole-launch executable
        out = np.asarray(call(good, src))
        np.testing.assert_allclose(out, (expected * 2 + 1).reshape(G * R, C), rtol=1e-6)
    assert compiled_launch.STATS["compiled"] == before["compiled"] + 1
    idx = good.copy()
    idx[2] = bad
    for _ in range(2):  # the next two: compiled, flagged, re-run simulated
        with pytest.raises(OutOfBoundsError, match=r"grid point \(2,\)"), errors_as_raised():
            call(idx, src).block_until_ready()
    assert compiled_launch.STATS["compiled"] == before["compiled"] + 1
    flagged = ("a block index out of range" if make is _index_map_call
               else "an access out of bounds")
    assert compiled_launch.STATS[flagged] == before[flagged] + 2
