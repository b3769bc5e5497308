"""Parallel grid dimensions are shuffled per ``random_seed`` exactly as jax's TPU
interpreter shuffles them, and split over the cores the same way; a dynamic size on a
parallel dimension is refused when the kernel is prepared."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import (
    DynamicParallelDimensionError,
    InterpretParams,
    KernelError,
)
from palladium.interpret.run import grid_order
from palladium.interpret.run.grid_order import parallel_orders

X = jnp.arange(32 * 512, dtype=jnp.float32).reshape(32, 512)


def test_parallel_orders_are_permutations_reproducible_from_the_seed():
    a = parallel_orders((4, 7, 1), 3)
    assert [sorted(o.tolist()) for o in a] == [list(range(4)), list(range(7)), [0]]
    assert all(np.array_equal(x, y) for x, y in zip(a, parallel_orders((4, 7, 1), 3)))
    assert not all(np.array_equal(x, y) for x, y in zip(parallel_orders((8, 8), 1),
                                                          parallel_orders((8, 8), 2)))


def test_a_seed_beyond_int32_gives_a_reproducible_permutation():
    a = parallel_orders((5,), 2**40)[0]
    assert sorted(a.tolist()) == list(range(5))
    assert np.array_equal(a, grid_order._parallel_orders.__wrapped__((5,), 2**40, True)[0])


def _jax_orders(seed, sizes):
    """The reference: the orders through jax.random (what jax's interpreter does)."""
    key = jax.random.key(np.int32(seed))
    out = []
    for n in sizes:
        key, subkey = jax.random.split(key)
        out.append(np.asarray(jax.random.permutation(subkey, jnp.arange(n, dtype=jnp.int32))))
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(-(2**31), 2**31 - 1),
       sizes=st.lists(st.integers(1, 64), min_size=1, max_size=3).map(tuple))
def test_numpy_threefry_orders_equal_jax_random(seed, sizes):
    ours = grid_order._parallel_orders.__wrapped__(sizes, seed, True)
    assert [o.tolist() for o in ours] == [o.tolist() for o in _jax_orders(seed, sizes)]


@pytest.mark.parametrize("n", [1, 2, 1625, 1626, 5000])
def test_numpy_threefry_orders_equal_jax_random_at_one_and_two_sort_rounds(n):
    # ceil(3 ln n / ln(2^32 - 1)): 0 rounds for n = 1, 1 up to n = 1625, 2 from 1626.
    for seed in (0, -1, 7):
        ours = grid_order._parallel_orders.__wrapped__((n,), seed, True)
        assert ours[0].tolist() == _jax_orders(seed, (n,))[0].tolist()


def test_threefry2x32_known_answer():
    # The Random123 known-answer vector for Threefry-2x32-20 with zero key and counter.
    zero = np.zeros((), np.uint32)
    x0, x1 = grid_order.threefry2x32((zero, zero), np.zeros(1, np.uint32),
                                     np.zeros(1, np.uint32))
    assert (int(x0[0]), int(x1[0])) == (0x6B200159, 0x99BA4EFE)


def test_another_jax_prng_is_followed_through_jax():
    with jax.default_prng_impl("rbg"):
        assert not grid_order._numpy_models_jax()
        theirs = [np.asarray(o).tolist() for o in _jax_orders(5, (6, 9))]
        assert [o.tolist() for o in parallel_orders((6, 9), 5)] == theirs
    assert grid_order._numpy_models_jax()


def test_seed_12345_orders_a_4_wide_parallel_dimension_2_3_0_1():
    # The order jax 0.10.2's interpreter uses for this seed (jax's own
    # test_parallel_dimension_and_multiple_cores records it).
    assert parallel_orders((4,), 12345)[0].tolist() == [2, 3, 0, 1]


def _kernel(in_ref, o_ref):
    o_ref[...] = in_ref[...] + 1


def _recorded(interpret_cls, semantics, grid=(4, 4), **kw):
    seen = []

    def recorder(*args):
        # jax 0.10.2 calls recorder(token, grid_point, core) and wants the token back;
        # palladium also accepts that form.
        token, point, core = args if len(args) == 3 else (None, *args)
        seen.append((tuple(int(c) for c in np.asarray(point)), int(np.asarray(core))))
        return token

    call = pl.pallas_call(
        _kernel, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype), grid=grid,
        in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
        interpret=interpret_cls(grid_point_recorder=recorder, **kw))
    out = jax.jit(call)(X)
    jax.block_until_ready(out)
    jax.effects_barrier()
    np.testing.assert_array_equal(out, X + 1)
    return seen


@pytest.mark.skipif(jax.__version_info__ < (0, 10, 2), reason="recorder signature of 0.10.2")
@pytest.mark.parametrize("seed", [None, 12345])
@pytest.mark.parametrize("cores", [1, 2, 3])
@pytest.mark.parametrize("semantics", [("parallel", "arbitrary"), ("parallel", "parallel")])
def test_grid_points_and_their_cores_match_jax_interpreter(seed, cores, semantics):
    kw = dict(random_seed=seed, num_cores_or_threads=cores)
    ours = _recorded(InterpretParams, semantics, **kw)
    theirs = _recorded(pltpu.InterpretParams, semantics, **kw)
    # Each core's own sequence is the same; how the cores interleave is a schedule.
    for core in range(cores):
        assert [p for p, c in ours if c == core] == [p for p, c in theirs if c == core]
    assert sorted(ours) == sorted(theirs)


def test_a_dynamic_parallel_dimension_is_refused_when_the_kernel_is_prepared():
    def kernel(o_ref):
        o_ref[0] = 42.0

    @jax.jit
    def f(n):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.float32), grid=(n,),
            out_specs=pl.BlockSpec((1,), lambda i: (0,)),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
            interpret=InterpretParams())()

    with pytest.raises(DynamicParallelDimensionError) as info:
        f.lower(jnp.int32(12))
    assert isinstance(info.value, jax.errors.ConcretizationTypeError)
    assert isinstance(info.value, KernelError)
    msg = str(info.value)
    assert "kernel 'kernel'" in msg and "grid dimension 0 has parallel semantics" in msg


def test_a_dynamic_arbitrary_dimension_still_runs():
    def kernel(o_ref):
        o_ref[0] = pl.num_programs(0).astype(jnp.float32)

    @jax.jit
    def f(n):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.float32), grid=(n,),
            out_specs=pl.BlockSpec((1,), lambda i: (0,)),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
            # Mosaic rejects the scalar store to VMEM: the TPU lowering check is off.
            interpret=InterpretParams(check_lowering=False))()

    np.testing.assert_array_equal(f(jnp.int32(5)), [5.0])
