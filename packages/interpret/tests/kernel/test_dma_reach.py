"""Which refs a DMA reaches (``kernel.dma_reach``): the rest are private to their core and
the race detector does not hear of their accesses; races on the reached ones are still
found wherever the ref travels (cond, loops, run_scoped, calls)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import DataRaceError, InterpretParams, errors_as_raised
from palladium.interpret.kernel.dma_reach import private_positions, read_only_positions, ref_reach

pytestmark = pytest.mark.timeout(300)
RACES = InterpretParams(detect_races=True)


def _kernel_jaxpr(call, *args):
    """The kernel jaxpr of the one pallas_call in ``call(*args)``."""
    closed = jax.make_jaxpr(call)(*args)
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "pallas_call"]
    return eqn.params["jaxpr"]


def _staged_call(kernel, interpret=RACES, n=16):
    """x (HBM) -> o (VMEM block); scratch: a DMA landing buffer, an accumulator, a sem."""
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(2,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i, s: (0, 0)),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32),
                            pltpu.VMEM((8, 128), jnp.float32),
                            pltpu.SemaphoreType.DMA],
        ),
        interpret=interpret,
    )


def _copy_then_sum(s_ref, x_hbm, o_ref, land, acc, sem):
    copy = pltpu.make_async_copy(x_hbm, land, sem)
    copy.start()
    copy.wait()
    acc[...] = land[...] * s_ref[0].astype(jnp.float32)
    o_ref[...] = acc[...]


def _inputs():
    return jnp.asarray([3], jnp.int32), jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)


def test_the_refs_no_dma_names_are_private():
    s, x = _inputs()
    jaxpr = _kernel_jaxpr(_staged_call(_copy_then_sum), s, x)
    reach = ref_reach(jaxpr)
    # operands: s (SMEM), x (HBM), o (VMEM block), land, acc, sem
    assert reach is not None
    assert [v in reach.named for v in jaxpr.invars] == [False, True, False, True, False, True]
    assert private_positions(jaxpr, reach) == {0, 2, 4}
    # written: o and acc (stores), land (the DMA's destination); x and s only read
    assert [v in reach.written for v in jaxpr.invars] == [False, False, True, True, True,
                                                          False]
    assert read_only_positions(jaxpr, reach) == {0, 1, 5}


def test_private_buffers_give_the_same_results_with_races_on():
    s, x = _inputs()
    out = _staged_call(_copy_then_sum)(s, x)
    np.testing.assert_array_equal(out, np.asarray(x) * 3)


def _racy_through(how):
    """A read of the landing buffer before the DMA's wait, with the DMA started through
    ``how``: the buffer must be found reached however the ref travels."""

    def kernel(s_ref, x_hbm, o_ref, land, acc, sem):
        def start(land_ref):
            pltpu.make_async_copy(x_hbm, land_ref, sem).start()

        if how == "cond":
            jax.lax.cond(s_ref[0] > 0, lambda: start(land), lambda: None)
        elif how == "fori_loop":
            jax.lax.fori_loop(0, 1, lambda i, c: (start(land), c)[1], 0)
        elif how == "jit":
            jax.jit(start)(land)
        elif how == "run_scoped":
            def scoped(tmp):
                pltpu.make_async_copy(x_hbm, tmp, sem).start()
                o_ref[...] = tmp[...]  # the racing read, inside the scope
                pltpu.make_async_copy(x_hbm, tmp, sem).wait()

            pl.run_scoped(scoped, pltpu.VMEM((8, 128), jnp.float32))
            return
        o_ref[...] = land[...]  # before the wait: races with the DMA's write
        pltpu.make_async_copy(x_hbm, land, sem).wait()
        acc[...] = land[...]

    return kernel


@pytest.mark.parametrize("how", ["cond", "fori_loop", "jit", "run_scoped"])
def test_a_race_on_a_reached_ref_is_found_wherever_the_dma_is(how):
    s, x = _inputs()
    with pytest.raises(DataRaceError) as info, errors_as_raised():
        jax.block_until_ready(_staged_call(_racy_through(how))(s, x))
    name = "tmp" if how == "run_scoped" else "land"
    text = str(info.value)
    assert text.startswith(f"data race on '{name} (VMEM, device 0 core 0)' at element (0, 0): "
                           f"read (test_dma_reach.py:")
    assert f"\n  read by 'device 0 core 0' of {name} (VMEM, device 0 core 0)" in text
    assert f"write by 'x_hbm->{name}' to {name} (VMEM, device 0 core 0)" in text


def test_a_ref_going_into_a_jaxpr_it_cannot_follow_leaves_every_buffer_shared(monkeypatch):
    from palladium.interpret.kernel import dma_reach

    s, x = _inputs()
    jaxpr = _kernel_jaxpr(_staged_call(_racy_through("jit")), s, x)
    assert ref_reach(jaxpr) is not None
    monkeypatch.setattr(dma_reach, "_CALLS", frozenset())  # as if jit were unknown
    assert ref_reach(jaxpr) is None
    assert private_positions(jaxpr, None) == frozenset()


@functools.cache
def _no_dma_kernel_reached():
    def kernel(x_ref, o_ref, acc):
        acc[...] = x_ref[...] * 2
        o_ref[...] = acc[...]

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)], interpret=RACES)
    x = jnp.ones((8, 128), jnp.float32)
    return ref_reach(_kernel_jaxpr(call, x)), call(x)


def test_a_kernel_without_dmas_has_every_buffer_private():
    reach, out = _no_dma_kernel_reached()
    assert reach is not None and reach.named == frozenset()
    np.testing.assert_array_equal(out, np.full((8, 128), 2.0))


def _write_back_call(interpret=RACES, aliased=False):
    """x (HBM) is read by a DMA into VMEM and, when ``aliased``, written back to x."""

    def kernel(x_hbm, o_hbm, land, sem):
        pltpu.sync_copy(x_hbm, land)
        land[...] = land[...] + 1
        pltpu.async_copy(land, o_hbm, sem).wait()

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        input_output_aliases={0: 0} if aliased else {},
        interpret=interpret,
    )


@pytest.mark.parametrize("aliased", [False, True])
def test_an_input_nothing_writes_is_read_only_unless_an_output_aliases_it(aliased):
    from palladium.interpret.kernel.prepared_kernel import PreparedKernel

    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    closed = jax.make_jaxpr(_write_back_call(aliased=aliased))(x)
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "pallas_call"]
    kernel = PreparedKernel.from_params(**eqn.params)
    assert kernel.read_only_inputs == (frozenset() if aliased else {0})
    out = _write_back_call(aliased=aliased)(x)
    np.testing.assert_array_equal(out, np.asarray(x) + 1)
