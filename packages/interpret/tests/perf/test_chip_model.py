"""The performance model's measured constants and the structure they feed (issue 40).

The v5e's constants come from microbenchmarks timed on the chip
(``perf/measured/v5e.json``, fitted by ``benchmarks/chip/fit_constants.py``); these tests
check what the model does with them: each cost where the chip put it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi
from palladium.interpret import InterpretParams
from palladium.interpret.perf.model import MEASURED_CHIPS, chip_model, measured_constants

V5E = chip_model("v5e")


def test_the_v5e_is_measured_and_every_constant_says_where_it_comes_from():
    assert MEASURED_CHIPS == ("v5e",)
    table = measured_constants("v5e")
    assert table is not None and table["chip"] == "TPU v5 lite" and table["libtpu"] == "0.0.42.1"
    for name, c in table["constants"].items():
        assert c["from"] and c["how"], name  # each traceable to its microbenchmarks
    assert {"mxu_bf16_flops", "hbm_read_bytes_per_second", "dma_latency_in_s",
            "step_overhead_s", "valu_vreg_seconds"} <= V5E.measured
    # what the chip gave, against the spec sheet: MXU at 99.5% of its peak, HBM reads at
    # 91% and writes at 79% of TpuInfo's 819 GB/s, a grid step 1/35 of the guide's 0.35 us
    assert 0.98 < V5E.mxu_bf16_flops / 197e12 < 1.0
    assert V5E.hbm_read_bytes_per_second > V5E.hbm_write_bytes_per_second
    assert V5E.step_overhead_s < 0.05e-6


def test_an_unmeasured_chip_takes_the_v5es_cycles_at_its_clock_and_says_so():
    v6e = chip_model("v6e")
    assert v6e.measured == frozenset() and measured_constants("v6e") is None
    ratio = V5E.clock_hz / v6e.clock_hz
    assert v6e.mxu_dot_seconds == pytest.approx(V5E.mxu_dot_seconds * ratio)
    assert v6e.step_overhead_s == pytest.approx(V5E.step_overhead_s * ratio)
    # v6e has a bf16 vector unit: 16-bit elements pack two to a lane again
    assert v6e.narrow_valu_factor == 0.5 and V5E.narrow_valu_factor > 1.5


def _record(kernel, x, out=None):
    f = pl.pallas_call(kernel, out_shape=out or jax.ShapeDtypeStruct(x.shape, x.dtype),
                       interpret=InterpretParams(chip="v5e", skip_floating_point_ops=True))
    with pi.timeline() as tl:
        jax.block_until_ready(f(x))
    return tl.launches[-1]


@pytest.mark.timeout(120)
def test_a_loop_carried_recurrence_costs_its_latencies_not_its_throughput():
    steps = 256

    def recurrence(x_ref, o_ref):
        a = x_ref[...]

        def step(i, h):
            return h * a + 0.5  # two dependent ops on one vreg per iteration
        o_ref[...] = jax.lax.fori_loop(0, steps, step, a)

    rec = _record(recurrence, jnp.ones((8, 128), jnp.float32))
    per_iteration = 2 * V5E.dependent_op_seconds + V5E.loop_iteration_seconds
    compute = rec.predicted_seconds - rec.exposed_dma_seconds
    assert compute == pytest.approx(steps * per_iteration, rel=0.25)
    # (throughput alone: two vreg ops a step, 8x less)
    assert steps * 2 * V5E.valu_vreg_seconds < compute / 8


@pytest.mark.timeout(120)
def test_bf16_vector_ops_cost_the_measured_factor_of_f32_per_element():
    def chain(x_ref, o_ref):
        x = x_ref[...]
        for i in range(8):
            x = x + (0.5 + i)
        o_ref[...] = x

    f32 = _record(chain, jnp.ones((512, 1024), jnp.float32)).by_primitive["add"]
    bf16 = _record(chain, jnp.ones((512, 1024), jnp.bfloat16)).by_primitive["add"]
    assert bf16 / f32 == pytest.approx(V5E.narrow_valu_factor, rel=0.01)  # v5e: no bf16 VALU


@pytest.mark.timeout(120)
@pytest.mark.parametrize("op", ["sin", "tanh", "exp", "rsqrt", "cos"])
def test_each_bf16_transcendental_costs_its_own_measured_factor_of_f32(op):
    # round 25 on the v5e: per element, a bf16 sin costs 1.03x an f32 sin, tanh 0.96x,
    # exp 1.49x, rsqrt 0.35x (a single factor, their mean, put a bf16 sin 23% over);
    # one not measured in bf16 (cos) takes the mean of tanh's and exp's
    fn = getattr(jax.lax, op)

    def chain(x_ref, o_ref):
        o_ref[...] = fn(fn(x_ref[...]))

    f32 = _record(chain, jnp.ones((512, 1024), jnp.float32)).by_primitive[op]
    bf16 = _record(chain, jnp.ones((512, 1024), jnp.bfloat16)).by_primitive[op]
    measured = V5E.narrow_transcendental_factors
    assert set(measured) == {"exp", "tanh", "log", "logistic", "div", "rsqrt", "sqrt", "sin"}
    factor = measured.get(op, V5E.narrow_transcendental_factor)
    assert bf16 / f32 == pytest.approx(factor, rel=0.01)
    expected = {"sin": 1.03, "tanh": 0.96, "exp": 1.49, "rsqrt": 0.35, "cos": 1.23}[op]
    assert factor == pytest.approx(expected, abs=0.02)


def _compute_seconds(kernel, x, *more):
    """The predicted compute time of one launch of ``kernel`` on ``x`` and ``more`` (its
    output shaped like ``x``): the prediction less its exposed DMAs."""
    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                       interpret=InterpretParams(chip="v5e", skip_floating_point_ops=True))
    with pi.timeline() as tl:
        jax.block_until_ready(f(x, *more))
    rec = tl.launches[-1]
    return rec.predicted_seconds - rec.exposed_dma_seconds


def _dot(dims):
    def kernel(x_ref, o_ref):
        o_ref[...] = jax.lax.dot_general(x_ref[...], x_ref[...], (dims, ((), ())),
                                         preferred_element_type=jnp.float32)
    return kernel


def _dot_seconds(contracting):
    """The MXU time of ``x . x`` contracting ``contracting`` on a (256, 256) f32 block."""
    x = jnp.ones((256, 256), jnp.float32)
    return _record(_dot(contracting), x).by_primitive["dot_general"]


@pytest.mark.timeout(120)
def test_a_transposed_right_operand_costs_its_transpose():
    nn, nt = _dot_seconds(((1,), (0,))), _dot_seconds(((1,), (1,)))
    assert nt - nn == pytest.approx(V5E.mxu_transposed_rhs_seconds)  # 256 rows: once


def _loop_compute(body, x, steps):
    """The compute time per iteration of ``steps`` iterations of ``body(i, x_ref, o_ref)``
    (a loop over rows of one VMEM block)."""
    def kernel(x_ref, o_ref):
        def step(i, c):
            body(i, x_ref, o_ref)
            return c
        jax.lax.fori_loop(0, steps, step, 0)

    rec = _record(kernel, x)
    return (rec.predicted_seconds - rec.exposed_dma_seconds) / steps


@pytest.mark.timeout(120)
def test_a_loop_iteration_starts_when_the_last_one_ended():
    # one row a step with no carried value: on the chip a loop body is one basic block,
    # so each iteration costs its whole chain (load, 4 dependent ops, store), not its
    # throughput (measured: the RG-LRU scan, one row a step, ran 41% slower than
    # iterations overlapping predicted)
    def body(i, x_ref, o_ref):
        y = x_ref[pl.ds(i, 1), :]
        for _ in range(2):
            y = y * 0.5 + 1.0
        o_ref[pl.ds(i, 1), :] = y

    per = _loop_compute(body, jnp.ones((256, 128), jnp.float32), 256)
    # (the next iteration issues after this one's store issued: the store's own latency
    # is not waited for, nothing reads the row it writes)
    chain = V5E.load_use_seconds + 4 * V5E.dependent_op_seconds + V5E.loop_iteration_seconds
    assert per == pytest.approx(chain, rel=0.1)


def _dots(dependent: bool, rows: int, n: int = 4):
    def kernel(x_ref, w_ref, o_ref):
        h = x_ref[...]
        outs = []
        for j in range(n):
            y = jnp.dot(h if dependent else x_ref[...], w_ref[j],
                        preferred_element_type=jnp.float32)
            h = y
            outs.append(y)
        o_ref[...] = outs[-1] if dependent else sum(outs)

    x = jnp.ones((rows, 128), jnp.float32)
    return _compute_seconds(kernel, x, jnp.ones((4, 128, 128), jnp.float32))


@pytest.mark.timeout(120)
def test_independent_dots_overlap_their_latency_dependent_dots_wait_for_it():
    # measured (r3/dots): four independent 128^3 dots cost one dot's latency and four
    # dots' MXU time; four dependent ones four latencies
    busy = 2 * 128**3 / V5E.mxu_bf16_flops + V5E.mxu_weight_tile_seconds
    dep, indep = _dots(True, 128), _dots(False, 128)
    assert dep - indep == pytest.approx(3 * V5E.mxu_dot_seconds, rel=0.15)
    assert indep - _dots(False, 128, 1) == pytest.approx(3 * busy, abs=10e-9)
    # 256 rows stream through in two blocks of 128: a dependent dot starts on the
    # first, so four dependent dots of twice the rows cost about one block more, not
    # four dots' more (measured: r3/dots/dep/n4/256x256 took what four independent did)
    more = _dots(True, 256) - dep
    assert 0 < more < 2 * busy  # (waiting for whole results: about 4 * busy more)


@pytest.mark.timeout(120)
def test_cross_lane_ops_cost_their_latency_once():
    x = jnp.ones((8, 128), jnp.float32)

    def carried(f):
        def kernel(x_ref, o_ref):
            o_ref[...] = jax.lax.fori_loop(0, 512, lambda i, h: f(h), x_ref[...])
        rec = _record(kernel, x)
        return (rec.predicted_seconds - rec.exposed_dma_seconds) / 512

    loop, dep = V5E.loop_iteration_seconds, V5E.dependent_op_seconds
    # a column spread over the lanes (measured: r3/latency/lane_bcast, 80 ns a step)
    spread = carried(lambda h: h * 0.5 + h[:, :1])
    assert spread == pytest.approx(V5E.xlu_latency_seconds + dep + loop, rel=0.05)
    # a lane max and its broadcast back: one cross-lane op (the reduction leaves its
    # value in every lane; measured the same 80 ns)
    lane_max = carried(lambda h: h - jnp.max(h, axis=-1, keepdims=True) * 0.5)
    assert lane_max == pytest.approx(V5E.xlu_latency_seconds + 2 * dep + loop, rel=0.05)
    # over sublanes: a short tree (measured 11 ns a step)
    sublanes = carried(lambda h: h - jnp.sum(h, axis=0, keepdims=True) * 0.5)
    assert sublanes == pytest.approx(V5E.sublane_reduce_latency_seconds + 2 * dep + loop,
                                     rel=0.1)
    assert sublanes < lane_max / 4


@pytest.mark.timeout(120)
def test_a_left_operand_contracting_its_rows_costs_its_transpose():
    # p.T @ do (flash attention's dkv step): the cross-lane unit transposes the left
    # operand first, at the chip's measured transpose rate (round 6: the dkv step written
    # from the math, -25% -> -11% with it)
    nn, tn = _dot_seconds(((1,), (0,))), _dot_seconds(((0,), (0,)))
    transpose = V5E.vector_vreg_seconds("transpose", False)
    assert tn - nn == pytest.approx(64 * transpose)  # 64 vregs of the left operand


def _helper_calls(wrap, on_dot: bool = False):
    """Compute time of a kernel with a dot and two uses of a helper (``wrap(helper)``:
    the helper itself, or it under ``jax.jit``, a call equation), on the kernel's input
    or (``on_dot``) on the dot's result."""
    def helper(a):
        for _ in range(8):
            a = a * 0.5 + 1.0
        return a

    call = wrap(helper)

    def kernel(x_ref, w_ref, o_ref):
        x = x_ref[...]
        y = jnp.dot(x, w_ref[...], preferred_element_type=jnp.float32)
        a = y if on_dot else x
        o_ref[...] = y + call(a) + call(a * 2.0)

    x = jnp.ones((128, 128), jnp.float32)
    return _compute_seconds(kernel, x, x)


@pytest.mark.timeout(120)
def test_a_call_costs_what_its_body_costs_in_place():
    # the chip inlines a call (jnp.where's body, a helper under jax.jit): its equations
    # start when its operands are ready, beside the dot, not after everything told before
    # it, and a body called twice is not a loop's next iteration (ragged paged
    # attention's masks are such calls: +25% / +33% -> -3% / +1% against the chip)
    for on_dot in (False, True):
        inline, jitted = _helper_calls(lambda f: f, on_dot), _helper_calls(jax.jit, on_dot)
        assert jitted == pytest.approx(inline, rel=1e-9)
    # on the input, the helpers' 16 dependent ops overlap the dot's latency; on its
    # result they follow it
    beside, after = _helper_calls(jax.jit), _helper_calls(jax.jit, on_dot=True)
    assert after - beside > 12 * V5E.dependent_op_seconds


def _dot_chain(transposed: bool, kr: int, steps: int = 64):
    """Compute time per step of a chain of q @ k.T (or the same with k stored
    transposed) then s @ k, on a (kr, 128) block (r14's form)."""
    def kernel(q_ref, k_ref, kt_ref, o_ref):
        def step(i, q):
            k = k_ref[...]
            if transposed:
                s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                                        preferred_element_type=jnp.float32)
            else:
                s = jnp.dot(q, kt_ref[...], preferred_element_type=jnp.float32)
            return jnp.dot(s, k, preferred_element_type=jnp.float32)
        o_ref[...] = jax.lax.fori_loop(0, steps, step, q_ref[...])

    k = jnp.ones((kr, 128), jnp.float32)
    return _compute_seconds(kernel, jnp.ones((8, 128), jnp.float32), k, k.T) / steps


@pytest.mark.timeout(120)
def test_a_transposed_right_operand_costs_per_256_rows_from_128_rows():
    # r14 on the v5e: a chain of q @ k.T on (128, 128) f32 blocks takes 21 ns a dot more
    # than the same dots untransposed, on (64, 128) blocks no more; mxu2: (256, 128)
    # operands 21 ns
    assert V5E.mxu_transposed_rhs_seconds == pytest.approx(21e-9, rel=0.05)
    whole = _dot_chain(True, 128) - _dot_chain(False, 128)
    assert whole == pytest.approx(V5E.mxu_transposed_rhs_seconds, rel=0.02)
    assert _dot_chain(True, 64) == pytest.approx(_dot_chain(False, 64), abs=0.5e-9)


def _untaken_dmas(n: int, iters: int = 64) -> float:
    """Per iteration, what a loop of a dependent vector op with a never-taken
    ``pl.when`` around ``n`` page DMAs costs over the same loop without it."""
    def loop(n):
        def kernel(flag_ref, table_ref, x_ref, pages_hbm, o_ref, buf, sem):
            def step(i, x):
                if n:
                    @pl.when(flag_ref[0] == 1)
                    def _():
                        for p in range(n):
                            pltpu.make_async_copy(pages_hbm.at[table_ref[i * n + p]],
                                                  buf.at[p], sem).start()
                return x * 1.0001 + 0.5
            o_ref[...] = jax.lax.fori_loop(0, iters, step, x_ref[...])

        spec = pl.BlockSpec((8, 128), lambda s, f, t: (0, 0))
        f = pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2, grid=(1,),
                in_specs=[spec, pl.BlockSpec(memory_space=pl.ANY)], out_specs=spec,
                scratch_shapes=[pltpu.VMEM((max(n, 1), 16, 128), jnp.float32),
                                pltpu.SemaphoreType.DMA(())]),
            interpret=InterpretParams(chip="v5e", skip_floating_point_ops=True))
        args = (jnp.zeros((1,), jnp.int32), jnp.arange(iters * max(n, 1), dtype=jnp.int32),
                jnp.ones((8, 128), jnp.float32),
                jnp.ones((iters * max(n, 1), 16, 128), jnp.float32))
        with pi.timeline() as tl:
            jax.block_until_ready(f(*args))
        return tl.launches[-1].predicted_seconds

    return (loop(n) - loop(0)) / iters


@pytest.mark.timeout(120)
def test_a_short_conditional_that_starts_dmas_costs_its_dma_starts_untaken():
    # round 19 on a v5e: a never-taken pl.when around 1, 2 or 4 page DMAs costs a loop
    # 19, 32 and 57 ns an iteration (the compiler predicates it: the core issues the
    # DMA starts all the same), around 8 with 40 equations 9 ns, a branch (here a DMA
    # is 4 equations: 8 are predicated, 16 a branch)
    assert V5E.predicated_branch_equations == 36
    for n in (1, 4, 8):
        assert _untaken_dmas(n) == pytest.approx(
            V5E.predicated_seconds + n * V5E.predicated_dma_seconds, rel=0.05)
    assert _untaken_dmas(16) == pytest.approx(V5E.branch_seconds, rel=0.05)


def _then_dot(rows: int, vector: bool, dot: bool = True) -> float:
    """Compute time of s = x @ x.T on a (rows, 128) f32 block, then p = exp(s) (``vector``)
    or p = s, then p @ x (``dot``; else p's first 128 columns stored)."""
    def kernel(x_ref, o_ref):
        x = x_ref[...]
        s = jax.lax.dot_general(x, x, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
        p = jnp.exp(s) if vector else s
        o_ref[...] = (jnp.dot(p, x, preferred_element_type=jnp.float32) if dot
                      else p[:, :128])
    return _compute_seconds(kernel, jnp.ones((rows, 128), jnp.float32))


@pytest.mark.timeout(120)
def test_a_dot_waits_for_a_left_operand_too_big_for_the_vector_registers():
    # r3 on a v5e: a flash step's p @ v costs 40 ns beside its softmax at 128-blocks
    # (p of 16 vregs: the dot streams p's rows as they are made) and 328 ns at
    # 256-blocks (p of 64 vregs, kept in VMEM: the dot follows all of p); a dot's result
    # of 64 vregs feeding the next dot streams (r3/dots, r4/overlap-mxu)
    assert V5E.spill_vregs == 64
    for rows in (128, 256):
        after_exp = _then_dot(rows, True) - _then_dot(rows, True, dot=False)
        after_dot = _then_dot(rows, False) - _then_dot(rows, False, dot=False)
        if rows == 128:  # 16 vregs: the second dot streams after exp as after a dot
            assert after_exp == pytest.approx(after_dot, rel=0.05)
        else:  # 64 vregs: after exp it waits for all of p, after a dot it streams
            assert after_exp > 1.25 * after_dot


def _step_overhead_of(table: bool) -> float:
    """The step-overhead span of a (4, 8) grid whose input's index map reads its block
    from a scalar-prefetch table (``table``) or computes it from the grid."""
    def kernel(tbl_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    def imap(i, j, tbl):
        return (tbl[i, j], 0) if table else (j, 0)

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((32 * 8, 128), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(4, 8),
            in_specs=[pl.BlockSpec((8, 128), imap)],
            out_specs=pl.BlockSpec((8, 128), lambda i, j, tbl: (i * 8 + j, 0))),
        interpret=InterpretParams(chip="v5e", skip_floating_point_ops=True))
    tbl = jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (4, 8))
    with pi.timeline() as tl:
        jax.block_until_ready(f(tbl, jnp.ones((8 * 8, 128), jnp.float32)))
    (seconds,) = {round(s.end - s.start, 15) for s in tl.launches[-1].spans
                  if s.name == "step overhead"}
    return seconds


@pytest.mark.timeout(120)
def test_an_index_map_that_reads_a_scalar_prefetch_table_costs_its_lookup():
    # r24 on a v5e: k and v mapped through a table as splash maps them, the same blocks
    # every step, 33 ns a step more than mapped from the grid indices (16.8 an operand)
    assert V5E.table_operand_step_seconds == pytest.approx(16.8e-9, rel=0.05)
    assert _step_overhead_of(True) - _step_overhead_of(False) == pytest.approx(
        V5E.table_operand_step_seconds)
