"""The emit_pipeline primitive path (use_primitive=True): one jaxpr equation, expanded
when lowered to Mosaic or discharged. Same results and the same DMAs as the inlined
path; exports for every TPU; vmap of a pallas_call and vmap inside a kernel."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _pipeline_harness import (
    CHIP,
    accumulating_matmul_body,
    assert_exports,
    call_maker,
    on_tpu,
    run,
)
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.pipeline as pp
from palladium.pipeline.primitive import emit_pipeline_p, expand, trace_fun


def scaled_body(x, o):
    o[...] = x[...] * 2.0 + pl.program_id(0).astype(jnp.float32)


def elementwise_call(use_primitive, shape=(32, 128), counts=(2, 2), **options):
    def kernel(x_hbm, o_hbm):
        in_spec = pl.BlockSpec((8, 128), lambda i: (i, 0), pipeline_mode=pp.Buffered(counts[0]))
        out_spec = pl.BlockSpec((8, 128), lambda i: (i, 0),
                                pipeline_mode=pp.Buffered(counts[1]))
        pp.emit_pipeline(scaled_body, grid=(shape[0] // 8,), in_specs=[in_spec],
                         out_specs=[out_spec], use_primitive=use_primitive,
                         **options)(x_hbm, o_hbm)

    return call_maker(kernel, shape)


def matmul_call(use_primitive, m=16, n=256, k=384):
    def kernel(x_hbm, y_hbm, o_hbm):
        pp.emit_pipeline(accumulating_matmul_body, grid=(m // 8, n // 128, k // 128),
                         in_specs=[pl.BlockSpec((8, 128), lambda i, j, kk: (i, kk),
                                                pipeline_mode=pp.Buffered(3)),
                                   pl.BlockSpec((128, 128), lambda i, j, kk: (kk, j))],
                         out_specs=[pl.BlockSpec((8, 128), lambda i, j, kk: (i, j))],
                         use_primitive=use_primitive)(x_hbm, y_hbm, o_hbm)

    return call_maker(kernel, (m, n))


def gather_call(use_primitive):
    """The index map reads a scalar-prefetch ref: index-map constants are operands."""

    def kernel(order_ref, x_hbm, o_hbm):
        in_spec = pl.BlockSpec((8, 128), lambda i: (order_ref[i], 0))
        out_spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        pp.emit_pipeline(lambda x, o: o.__setitem__(..., x[...] + 1.0), grid=(4,),
                         in_specs=[in_spec], out_specs=[out_spec],
                         use_primitive=use_primitive)(x_hbm, o_hbm)

    return call_maker(kernel, (32, 128), num_scalar_prefetch=1)


def step_call(use_primitive, rows, core_split):
    """PipelineStep indices, megacore over a kernel grid axis, a dynamic grid."""

    def kernel(n_ref, x_hbm, o_hbm):
        def body(step, x, o):
            o[...] = x[...] + (step.index[0] * 10 + step.local_index).astype(jnp.float32)

        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        grid = (n_ref[0],) if not core_split else (rows,)
        pp.emit_pipeline(body, grid=grid, in_specs=[spec], out_specs=[spec],
                         core_axis=0 if core_split else None,
                         dimension_semantics=(pp.PARALLEL,), _explicit_indices=True,
                         use_primitive=use_primitive)(x_hbm, o_hbm)

    return call_maker(kernel, (rows * 8, 128), num_scalar_prefetch=1,
                      grid=(2,) if core_split else (),
                      dimension_semantics=("parallel",) if core_split else None)


def nested_call(use_primitive):
    def kernel(x_hbm, o_hbm):
        def outer_body(x_slice, o_slice):
            inner = pl.BlockSpec((8, 128), lambda i: (i, 0))
            pp.emit_pipeline(lambda x, o: o.__setitem__(..., x[...] + 1.0), grid=(2,),
                             in_specs=[inner], out_specs=[inner],
                             use_primitive=use_primitive)(x_slice, o_slice)

        outer = pl.BlockSpec((16, 128), lambda i: (i, 0), memory_space=pltpu.HBM)
        pp.emit_pipeline(outer_body, grid=(3,), in_specs=[outer], out_specs=[outer],
                         use_primitive=use_primitive)(x_hbm, o_hbm)

    return call_maker(kernel, (48, 128))


def _x(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _expanded_dma_starts(jaxpr) -> int:
    """``dma_start`` equations of a jaxpr with every pipeline equation expanded."""
    count = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive is emit_pipeline_p:
            expanded, _ = trace_fun(lambda *a, eqn=eqn: expand(*a, config=eqn.params["config"]),
                                 [v.aval for v in eqn.invars], "test expansion")
            count += _expanded_dma_starts(expanded)
            continue
        count += int(eqn.primitive.name == "dma_start")
        for sub in _param_jaxprs(eqn):
            count += _expanded_dma_starts(sub)
    return count


def _param_jaxprs(eqn):
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(item, "eqns"):
                yield item
            elif hasattr(getattr(item, "jaxpr", None), "eqns"):
                yield item.jaxpr


def _dma_count(make_call, *args) -> int:
    """DMA starts of the kernel as lowered (pipeline equations expanded)."""
    with on_tpu():
        closed = jax.make_jaxpr(make_call(interpret=False))(*args)
    return _expanded_dma_starts(closed.jaxpr)


def _effect_input(effect, eqn):
    """The operand (Var) an equation's input effect is on."""
    # jax 0.10.0 names it by position in ``eqn.invars`` (``input_index``).
    if hasattr(effect, "input_index"):
        return eqn.invars[effect.input_index]
    return effect.input


def test_kernel_jaxpr_has_one_pipeline_equation():
    x = _x((32, 128))
    jaxpr = jax.make_jaxpr(elementwise_call(True)(interpret=False))(x)
    text = str(jaxpr)
    assert text.count("palladium_emit_pipeline[") == 1
    assert "dma_start[" not in text  # the DMAs appear only when the equation is lowered
    kernel = jaxpr.eqns[0].params["jaxpr"]
    (eqn,) = kernel.eqns
    assert eqn.primitive is emit_pipeline_p
    # The equation reads its input ref and writes its output ref.
    effects = {type(e).__name__: _effect_input(e, eqn) for e in eqn.effects}
    assert effects == {"ReadEffect": kernel.invars[0], "WriteEffect": kernel.invars[1]}


CASES = {
    "elementwise": (lambda p: elementwise_call(p), [(32, 128)]),
    "triple_buffered": (lambda p: elementwise_call(p, counts=(3, 1)), [(32, 128)]),
    "no_pipelining": (lambda p: elementwise_call(p, no_pipelining=True), [(32, 128)]),
    "matmul": (lambda p: matmul_call(p), [(16, 384), (384, 256)]),
    "nested": (lambda p: nested_call(p), [(48, 128)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_results_and_dmas_as_inlined(case):
    make, shapes = CASES[case]
    args = [_x(s, seed) for seed, s in enumerate(shapes)]
    inlined = run(make(False), "interpret_true", *args)
    np.testing.assert_allclose(run(make(True), "interpret_true", *args), inlined, rtol=1e-5)
    assert _dma_count(make(True), *args) == _dma_count(make(False), *args) > 0
    assert_exports(make(True), *args)


def test_index_map_reading_a_scalar_prefetch_ref():
    order = jnp.array([3, 0, 2, 1], jnp.int32)
    x = _x((32, 128))
    out = run(gather_call(True), "interpret_true", order, x)
    expected = jnp.concatenate([x[8 * int(b):8 * int(b) + 8] for b in order]) + 1.0
    np.testing.assert_allclose(out, expected)
    assert_exports(gather_call(True), order, x)


@pytest.mark.parametrize("core_split", [False, True])
def test_explicit_indices_megacore_and_dynamic_grid(core_split):
    rows = 5
    n = jnp.array([rows if core_split else 3], jnp.int32)
    x = _x((rows * 8, 128))
    inlined = run(step_call(False, rows, core_split), "interpret_true", n, x)
    out = run(step_call(True, rows, core_split), "interpret_true", n, x)
    np.testing.assert_allclose(out, inlined)
    assert_exports(step_call(True, rows, core_split), n, x)


def vmapped_kernel_call(use_primitive, batch=3):
    """jax.vmap *inside* the kernel, over the HBM refs: the primitive's batching rule."""

    def kernel(x_hbm, o_hbm):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))

        def one(x_ref, o_ref):
            pp.emit_pipeline(scaled_body, grid=(4,), in_specs=[spec], out_specs=[spec],
                             use_primitive=use_primitive)(x_ref, o_ref)

        jax.vmap(one)(x_hbm, o_hbm)

    return call_maker(kernel, (batch, 32, 128))


def test_vmap_inside_a_kernel_uses_the_batching_rule():
    x = _x((3, 32, 128))
    expected = x * 2.0 + jnp.repeat(jnp.arange(4.0), 8)[None, :, None]
    np.testing.assert_allclose(run(vmapped_kernel_call(True), "interpret_true", x), expected)
    assert_exports(vmapped_kernel_call(True), x)
    # The inlined path cannot be batched (run_scoped has no batching rule in jax 0.10.2).
    with pytest.raises(NotImplementedError, match="run_scoped"):
        run(vmapped_kernel_call(False), "interpret_true", x)


def test_vmap_of_a_pallas_call_using_the_primitive():
    xs = _x((4, 32, 128))
    expected = xs * 2.0 + jnp.repeat(jnp.arange(4.0), 8)[None, :, None]
    out = jax.jit(jax.vmap(elementwise_call(True)(interpret=True)))(xs)
    np.testing.assert_allclose(out, expected)
    # jax 0.10.2's Mosaic lowering rejects a vmapped pallas_call over pl.ANY operands
    # (the batch dim makes their window non-trivial) before the kernel body is
    # lowered, for the inlined path and the primitive alike; vmap inside the kernel
    # (above) is what exports.
    structs = jax.ShapeDtypeStruct(xs.shape, xs.dtype)
    for use_primitive in (False, True):
        with on_tpu(), pytest.raises(ValueError, match="in memory space ANY only blocks"):
            jax.export.export(jax.jit(jax.vmap(elementwise_call(use_primitive)(False))),
                              platforms=["tpu"])(structs)


@pytest.mark.skipif("jax_use_emit_pipeline_primitive" not in jax.config.values,
                    reason="jax 0.10.0 has no jax_use_emit_pipeline_primitive option")
def test_jax_switch_selects_the_primitive():
    x = _x((32, 128))
    jax.config.update("jax_use_emit_pipeline_primitive", True)
    try:
        text = str(jax.make_jaxpr(elementwise_call(None)(interpret=False))(x))
    finally:
        jax.config.update("jax_use_emit_pipeline_primitive", False)
    assert "palladium_emit_pipeline[" in text
    text = str(jax.make_jaxpr(elementwise_call(None)(interpret=False))(x))
    assert "palladium_emit_pipeline[" not in text


def allocations_call(use_primitive):
    """Buffers allocated once (emit_pipeline_with_allocations) and reused by two calls."""
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))

    def kernel(x_hbm, o_hbm):
        pipeline, make = pp.emit_pipeline_with_allocations(
            scaled_body, grid=(4,), in_specs=[spec], out_specs=[spec],
            use_primitive=use_primitive)

        def run_twice(allocs):
            pipeline(x_hbm, o_hbm, allocations=allocs)
            pipeline(o_hbm, o_hbm, allocations=allocs)

        pl.run_scoped(run_twice, make(x_hbm, o_hbm))

    return call_maker(kernel, (32, 128))


def pytree_call(use_primitive):
    """Specs as pytrees matching the operands: a dict of two inputs, a tuple output."""

    def body(ins, outs):
        (o,) = outs
        o[...] = ins["a"][...] * 2.0 + ins["b"][...]

    def kernel(a_hbm, b_hbm, o_hbm):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        pp.emit_pipeline(body, grid=(4,), in_specs=[{"a": spec, "b": spec}],
                         out_specs=[(spec,)], use_primitive=use_primitive)(
            {"a": a_hbm, "b": b_hbm}, (o_hbm,))

    return call_maker(kernel, (32, 128))


@pytest.mark.parametrize("mode", ["interpret_true", CHIP])
def test_allocations_on_the_primitive_path_match_the_inlined_path(mode):
    x = _x((32, 128))
    out = run(allocations_call(True), mode, x)
    np.testing.assert_allclose(out, run(allocations_call(False), mode, x))
    expected = (np.asarray(x) * 2.0 + np.arange(4).repeat(8)[:, None]) * 2.0
    np.testing.assert_allclose(out, expected + np.arange(4).repeat(8)[:, None], rtol=1e-6)
    assert _dma_count(allocations_call(True), x) == _dma_count(allocations_call(False), x)
    assert_exports(allocations_call(True), x)


@pytest.mark.parametrize("mode", ["interpret_true", CHIP])
def test_pytrees_of_specs_on_the_primitive_path_match_the_inlined_path(mode):
    a, b = _x((32, 128), 0), _x((32, 128), 1)
    out = run(pytree_call(True), mode, a, b)
    np.testing.assert_allclose(out, run(pytree_call(False), mode, a, b))
    np.testing.assert_allclose(out, np.asarray(a) * 2.0 + np.asarray(b), rtol=1e-6)
    assert_exports(pytree_call(True), a, b)
