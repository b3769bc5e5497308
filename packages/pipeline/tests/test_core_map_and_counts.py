"""core_axis_name over a TensorCore mesh (pl.core_map), DMA counts against jax's
emit_pipeline for input-output refs and no_pipelining, and prefetched inputs with
prefetched_count / await_prefetch (which jax 0.10.2's emitter does not have)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _pipeline_harness import call_maker, on_a_tpu_host, on_tpu, run
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.pipeline as pp


def core_map_call(rows, num_cores, interpret):
    """Each core of a TensorCore mesh runs its share of one pipeline (core_axis_name)."""
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=num_cores)

    def body(x, o):
        core = jax.lax.axis_index("core").astype(jnp.float32)
        o[...] = x[...] + 1.0 + 100.0 * core

    def f(x):
        def stateful(refs):
            x_ref, o_ref = refs

            @pl.core_map(mesh, interpret=interpret)
            def _():
                spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
                pp.emit_pipeline(body, grid=(rows,), in_specs=[spec], out_specs=[spec],
                                 core_axis_name="core",
                                 dimension_semantics=(pp.PARALLEL,))(x_ref, o_ref)

        return pl.run_state(stateful)((x, jnp.zeros_like(x)))[1]

    return f


@pytest.mark.parametrize("rows,num_cores", [(4, 2), (5, 2), (7, 4)])
def test_core_axis_name_splits_the_grid_over_a_tensorcore_mesh(rows, num_cores):
    x = jnp.arange(rows * 8 * 128, dtype=jnp.float32).reshape(rows * 8, 128)
    # Uneven splits give the first rows % num_cores cores one extra block.
    base, extra = divmod(rows, num_cores)
    owner = np.concatenate([[c] * (base + (c < extra)) for c in range(num_cores)])
    expected = x + 1.0 + 100.0 * jnp.repeat(jnp.asarray(owner, jnp.float32), 8)[:, None]
    # jax 0.10.2's interpret=True (discharge) has no binding for the mesh axis name;
    # its TPU interpreter runs one thread per core.
    params = pltpu.InterpretParams(num_cores_or_threads=num_cores)
    if on_a_tpu_host():
        pytest.skip("jax 0.10.2's TPU interpreter fails core_map on a TPU host, also with "
                    "the CPU as the default device (AssertionError: _shared_memory is not "
                    "None, measured on a v5e); a v5e has one core: the split runs on a CPU "
                    "host, the export below on any")
    with on_tpu():
        out = jax.jit(core_map_call(rows, num_cores, params))(x)
    np.testing.assert_allclose(out, expected)


@pytest.mark.parametrize("rows,num_cores", [(5, 2), (7, 4)])
def test_core_axis_name_pipeline_exports_for_tpu(rows, num_cores):
    x = jnp.zeros((rows * 8, 128), jnp.float32)
    with on_tpu():
        exported = jax.export.export(jax.jit(core_map_call(rows, num_cores, False)),
                                     platforms=["tpu"])(jax.ShapeDtypeStruct(x.shape, x.dtype))
    assert "tpu_custom_call" in exported.mlir_module()


def input_output_call(counts, emit, buffered_ref_cls):
    def kernel(x_hbm, acc_in_hbm, acc_hbm):
        del acc_in_hbm

        def body(x, acc):
            acc[...] += x[...]

        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))

        def with_buffers(allocs):
            emit(body, grid=(5,))(x_hbm, acc_hbm, allocations=allocs)

        pl.run_scoped(with_buffers, [
            buffered_ref_cls.input(spec, jnp.float32, buffer_count=2),
            buffered_ref_cls.input_output(spec, jnp.float32, buffer_count=counts),
        ])

    return call_maker(kernel, (40, 128), input_output_aliases={1: 0})


@pytest.mark.parametrize("counts", [1, 2])
def test_input_output_dma_count_equals_jax(counts):
    # jax 0.10.2's input_output takes an int buffer count of at most 2 (no (in, out)
    # pair, no triple buffering), so only those are compared.
    from jax._src.pallas.mosaic import pipeline as jax_pipeline  # the reference

    x = jnp.zeros((40, 128), jnp.float32)
    ours = _count(input_output_call(counts, pp.emit_pipeline, pp.BufferedRef), x, x)
    theirs = _count(
        input_output_call(counts, pltpu.emit_pipeline, jax_pipeline.BufferedRef), x, x)
    assert ours == theirs > 0
    acc = jnp.full((40, 128), 3.0, jnp.float32)
    xs = jnp.arange(40 * 128, dtype=jnp.float32).reshape(40, 128)
    out = run(input_output_call(counts, pp.emit_pipeline, pp.BufferedRef), "interpret_true",
              xs, acc)
    np.testing.assert_allclose(out, xs + 3.0)


def no_pipelining_call(emit, grid=(4, 2)):
    def kernel(x_hbm, o_hbm):
        spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
        emit(lambda x, o: o.__setitem__(..., x[...] * 3.0), grid=grid, in_specs=[spec],
             out_specs=[spec], no_pipelining=True)(x_hbm, o_hbm)

    return call_maker(kernel, (32, 256))


def test_no_pipelining_dma_count_equals_jax():
    x = jnp.arange(32 * 256, dtype=jnp.float32).reshape(32, 256)
    ours = _count(no_pipelining_call(pp.emit_pipeline), x)
    assert ours == _count(no_pipelining_call(pltpu.emit_pipeline), x) > 0
    np.testing.assert_allclose(run(no_pipelining_call(pp.emit_pipeline), "interpret_true", x),
                               x * 3.0)


def prefetch_call(prefetched, await_prefetch, steps=4):
    """The caller fetches the first ``prefetched`` blocks into the pipeline's window.

    Without ``await_prefetch`` the caller waits for its copies itself; with it, it
    only starts them on the BufferedRef's semaphores and the pipeline awaits them.
    """
    shape = (steps * 8, 128)

    def kernel(x_hbm, o_hbm):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0),
                            pipeline_mode=pp.Buffered(2, prefetched_count=prefetched))
        out_spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        pipeline, make_allocations = pp.emit_pipeline_with_allocations(
            lambda x, o: o.__setitem__(..., x[...] + 1.0), grid=(steps,),
            in_specs=[spec], out_specs=[out_spec])

        def with_buffers(window, allocs):
            (x_alloc,) = allocs
            for b in range(prefetched):
                copy = pltpu.make_async_copy(x_hbm.at[pl.ds(b * 8, 8)], window.at[b],
                                             x_alloc.sem_recvs.at[b])
                copy.start()
                if not await_prefetch:
                    copy.wait()
            x_alloc = dataclasses.replace(x_alloc.with_window_ref(window),
                                          await_prefetch=await_prefetch)
            pipeline(x_hbm, o_hbm, allocations=[x_alloc])

        (x_bref, _) = make_allocations(x_hbm, o_hbm)
        x_bref = dataclasses.replace(x_bref, window_ref=None)
        pl.run_scoped(with_buffers, pltpu.VMEM((2, 8, 128), jnp.float32), [x_bref])

    return call_maker(kernel, shape)


def _walk(jaxpr, name: str) -> int:
    count = 0
    for eqn in jaxpr.eqns:
        count += int(eqn.primitive.name == name)
        for value in eqn.params.values():
            for item in value if isinstance(value, (tuple, list)) else (value,):
                sub = item if hasattr(item, "eqns") else getattr(item, "jaxpr", None)
                if hasattr(sub, "eqns"):
                    count += _walk(sub, name)
    return count


def _count(make_call, *args, name="dma_start"):
    """Equations named ``name`` in the traced kernel, sub-jaxprs included."""
    with on_tpu():
        return _walk(jax.make_jaxpr(make_call(interpret=False))(*args).jaxpr, name)


@pytest.mark.parametrize("await_prefetch", [False, True])
@pytest.mark.parametrize("prefetched", [1, 2])
def test_prefetched_count_and_await_prefetch(prefetched, await_prefetch):
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    make_call = prefetch_call(prefetched, await_prefetch)
    out = run(make_call, "tpu_interpret", x)
    np.testing.assert_allclose(out, x + 1.0)
    # Static DMA-start equations: the caller's `prefetched` starts, and the pipeline's
    # own lose the prologue fetch (the prefetched first block); the in-loop fetch stays
    # (guarded at run time by the prefetched count).
    plain = _count(prefetch_call(0, False), x)
    assert _count(make_call, x) - prefetched == plain - 1
    # Awaiting inside the pipeline keeps its waits; otherwise the caller waits.
    waits_plain = _count(prefetch_call(0, False), x, name="dma_wait")
    assert _count(make_call, x, name="dma_wait") == waits_plain + (0 if await_prefetch
                                                               else prefetched)
