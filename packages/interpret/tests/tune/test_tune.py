"""palladium.interpret.tune: predict one configuration, sweep many, and the CostEstimate,
checked against full runs of the same kernels and against hand counts. The verdicts are
palladium's approximation (compile_check="approximate") so that the tests need no
libtpu; tests/compiler/test_tune_compiler.py asks the TPU compiler."""

import csv
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _launch_harness import matmul_kernel
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi
from palladium.interpret import ConfigError, InterpretParams

S = jax.ShapeDtypeStruct
APPROX = "palladium's approximation (jax's Mosaic lowering and a VMEM/SMEM count)"


def matmul(x, y, *, bm, bk, bn, interpret=False):
    """The Pallas TPU matmul guide's kernel: accumulator scratch, 3-D grid."""
    m, k = x.shape
    n = y.shape[1]

    return pl.pallas_call(
        matmul_kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype), grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
    )(x, y)


def full_run(fn, *args):
    """The timeline of a full run (real data, every operation evaluated)."""
    with pi.timeline() as tl:
        jax.block_until_ready(fn(*args))
    (rec,) = tl.launches
    return rec


@pytest.mark.timeout(120)
def test_predict_on_abstract_inputs_equals_the_full_runs_timeline():
    bf16 = jnp.bfloat16
    blocks = {"bm": 128, "bk": 256, "bn": 128}
    p = pi.predict(functools.partial(matmul, **blocks), S((512, 512), bf16),
                   S((512, 512), bf16), chip="v5e", compile_check="approximate")
    x = jax.random.normal(jax.random.key(0), (512, 512), bf16)
    y = jax.random.normal(jax.random.key(1), (512, 512), bf16)
    rec = full_run(functools.partial(matmul, **blocks, interpret=InterpretParams(chip="v5e")),
                   x, y)
    assert p.compiles and p.checker == APPROX and p.reason is None
    assert p.predicted_seconds == rec.predicted_seconds
    assert p.bound == rec.bound
    # small blocks: each dot's fixed cost (measured on the v5e) outweighs the vregs moved
    assert p.compute_unit == "MXU"
    assert p.exposed_dma_seconds == rec.exposed_dma_seconds
    assert p.flops == rec.flops == 2 * 512**3
    assert p.grid_steps == 4 * 4 * 2
    # VMEM, hand-counted: two buffers of each block, x (128, 256) and y (256, 128) and
    # z (128, 128) bf16, plus the (128, 128) f32 accumulator.
    assert p.vmem_bytes == 2 * (128 * 256 * 2 * 2 + 128 * 128 * 2) + 128 * 128 * 4
    assert p.vmem_limit_bytes == 16 * 2**20
    assert p.smem_bytes == 0


def block_sparse_matmul(indices, x_blocks, y, *, blk, interpret=False):
    """The Pallas sparse guide's DSD kernel shape: row/column of each nonzero block of x
    prefetched as scalars; the grid walks them (data-dependent block indices)."""
    ii, kk = indices[0], indices[1]
    nb = x_blocks.shape[0]
    n = y.shape[1]

    def kernel(idx_ref, x_ref, y_ref, o_ref, acc):
        b = pl.program_id(1)
        row = idx_ref[0, b]

        @pl.when((b == 0) | (row != idx_ref[0, jnp.maximum(b - 1, 0)]))
        def _():
            acc[...] = jnp.zeros_like(acc)

        acc[...] += jnp.dot(x_ref[0], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when((b == nb - 1) | (row != idx_ref[0, jnp.minimum(b + 1, nb - 1)]))
        def _():
            o_ref[...] = acc[...].astype(o_ref.dtype)

    del ii, kk
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(n // blk, nb),
            in_specs=[pl.BlockSpec((1, blk, blk), lambda j, b, idx: (b, 0, 0)),
                      pl.BlockSpec((blk, blk), lambda j, b, idx: (idx[1, b], j))],
            out_specs=pl.BlockSpec((blk, blk), lambda j, b, idx: (idx[0, b], j)),
            scratch_shapes=[pltpu.VMEM((blk, blk), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct((4 * blk, n), y.dtype),
        interpret=interpret,
    )(indices, x_blocks, y)


@pytest.mark.timeout(120)
def test_predict_with_data_dependent_blocks_equals_the_full_run():
    blk = 128
    indices = jnp.array([[0, 0, 2, 3, 3], [1, 3, 0, 2, 3]], jnp.int32)  # 5 nonzero blocks
    xb = jnp.ones((5, blk, blk), jnp.bfloat16)
    y = jnp.ones((4 * blk, 2 * blk), jnp.bfloat16)
    p = pi.predict(functools.partial(block_sparse_matmul, blk=blk), indices,
                   S(xb.shape, xb.dtype), S(y.shape, y.dtype), compile_check="approximate")
    # (output block row 1 is no block's: its rows are never written)
    rec = full_run(functools.partial(block_sparse_matmul, blk=blk,
                                     interpret=InterpretParams(chip="v5e",
                                                               uninitialized_reads="off")),
                   indices, xb, y)
    assert p.predicted_seconds == rec.predicted_seconds
    assert p.grid_steps == 10
    assert p.dma_bytes == rec.dma_bytes


@pytest.mark.timeout(60)
def test_predict_reports_a_configuration_that_does_not_fit():
    big = functools.partial(matmul, bm=2048, bk=2048, bn=2048)
    p = pi.predict(big, S((2048, 2048), jnp.bfloat16), S((2048, 2048), jnp.bfloat16),
                   compile_check="approximate")
    assert not p.compiles
    assert p.error == "TpuResourceError"
    assert p.predicted_seconds is None and p.launches == ()
    assert "needs 64.00 MiB (67108864 bytes) of VMEM per core on TPU v5e, more than its " \
           "scoped VMEM limit of 16.00 MiB (XLA's default on v5e)" in p.reason
    assert "input 'x_ref' block (2048, 2048) bfloat16: 8.00 MiB x 2 buffers" in p.reason
    assert "scratch 'acc_ref' (2048, 2048) float32: 16.00 MiB" in p.message
    assert p.summary().startswith("TPU v5e: does not compile (palladium's approximation")


@pytest.mark.timeout(60)
def test_predict_needs_the_pallas_call_built_inside_it():
    call = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                          out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    with pytest.raises(ConfigError, match=r"was built before predict ran .* Pass a function "
                                          r"that calls pl.pallas_call"):
        pi.predict(call, S((8, 128), jnp.float32), compile_check="approximate")


@pytest.mark.timeout(60)
def test_predict_refuses_a_function_that_launches_nothing():
    with pytest.raises(pi.KernelError, match="made no pallas_call or core_map launch"):
        pi.predict(lambda x: x + 1, S((8, 128), jnp.float32), compile_check="approximate")


def make_matmul(bm, bk, bn):
    return functools.partial(matmul, bm=bm, bk=bk, bn=bn)


CONFIGS = [
    {"bm": 256, "bk": 512, "bn": 256},
    {"bm": 512, "bk": 512, "bn": 512},
    {"bm": 512, "bk": 1024, "bn": 1024},
    {"bm": 2048, "bk": 2048, "bn": 2048},  # 64 MiB of VMEM
    {"bm": 512, "bk": 100, "bn": 512},  # not a multiple of 128 lanes
]
OPERANDS = (S((2048, 2048), jnp.bfloat16), S((2048, 2048), jnp.bfloat16))


@pytest.mark.timeout(240)
def test_sweep_ranks_by_predicted_time_and_lists_the_rejected_with_their_reasons(tmp_path):
    result = pi.sweep(make_matmul, CONFIGS, *OPERANDS, chip="v5e",
                      compile_check="approximate", progress=False)
    # every accepted configuration is what predict says of it alone
    alone = pi.predict(make_matmul(512, 512, 512), *OPERANDS, compile_check="approximate")
    row = next(r for r in result.rows if r.config == CONFIGS[1])
    assert row.predicted_seconds == alone.predicted_seconds
    times = [r.predicted_seconds for r in result.ranked]
    assert times == sorted(times) and len(times) == 3
    assert result.best.config == {"bm": 512, "bk": 1024, "bn": 1024}
    assert result.best.prediction.compute_unit == "MXU"
    assert result.best.prediction.bound == "compute"
    assert [r.label for r in result.ranked] == [
        "bm=512, bk=1024, bn=1024", "bm=512, bk=512, bn=512", "bm=256, bk=512, bn=256"]
    assert [r.label for r in result.rejected] == [
        "bm=2048, bk=2048, bn=2048", "bm=512, bk=100, bn=512"]
    big, lanes = result.rejected
    assert big.error == "TpuResourceError" and big.prediction.checker == APPROX
    assert big.reason.startswith("kernel 'matmul_kernel' (pallas_call at test_tune.py:")
    assert big.reason.endswith(
        "needs 64.00 MiB (67108864 bytes) of VMEM per core on TPU v5e, more than its scoped "
        "VMEM limit of 16.00 MiB (XLA's default on v5e). A TPU fails to compile it: \"Ran out "
        "of memory in memory space vmem\". Counted per core, tile-padded: input 'x_ref' block "
        "(2048, 2048) bfloat16: 8.00 MiB x 2 buffers = 16.00 MiB")
    assert lanes.error == "TpuLoweringError"
    assert lanes.reason.startswith("kernel 'matmul_kernel' (pallas_call at test_tune.py:")
    assert ") does not lower for TPU v5e, operand 'x_ref': jax's Mosaic lowering says: " \
        "ValueError: The Pallas TPU lowering currently requires that the last two " \
        "dimensions of your block shape are divisible by 8 and 128" in lanes.reason

    # deterministic: the same table again
    again = pi.sweep(make_matmul, CONFIGS, *OPERANDS, chip="v5e",
                     compile_check="approximate", progress=False)
    assert again.records() == result.records()
    assert again.table() == result.table()

    result.to_csv(str(tmp_path / "sweep.csv"))
    with open(tmp_path / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["config"] for r in rows] == [r["config"] for r in result.records()]
    assert rows[0]["rank"] == "1" and rows[0]["bound"] == result.best.prediction.bound
    assert float(rows[0]["predicted_us"]) == round(result.best.predicted_seconds * 1e6, 3)
    assert rows[-1]["compiles"] == "False"
    assert rows[-1]["reason"] == f"TpuLoweringError: {lanes.reason}"
    result.to_json(str(tmp_path / "sweep.json"))
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["chip"] == "v5e"
    assert doc["rows"][0]["config_value"] == {"bm": 512, "bk": 1024, "bn": 1024}
    assert [r["rank"] for r in doc["rows"]] == [1, 2, 3, None, None]


@pytest.mark.timeout(120)
def test_sweep_progress_bar_only_when_asked_or_on_a_terminal():
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True

    quiet, tty = io.StringIO(), Tty()
    configs = CONFIGS[:1]
    pi.sweep(make_matmul, configs, *OPERANDS, compile_check="approximate",
             progress_stream=quiet)
    res = pi.sweep(make_matmul, configs, *OPERANDS, compile_check="approximate",
                   progress_stream=tty)
    us = res.rows[0].predicted_seconds * 1e6
    assert quiet.getvalue() == ""
    assert tty.getvalue() == ("\r[" + "#" * 30 + f"] 1/1 bm=256, bk=512, bn=256: {us:.1f} us"
                              "\x1b[K\n")


def test_sweep_plot_needs_matplotlib(tmp_path):
    result = pi.SweepResult(rows=(), chip="v5e")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match=r"needs matplotlib.*palladium-interpret\[tune\]"):
            result.plot(str(tmp_path / "x.png"))
    else:
        result.plot(str(tmp_path / "x.png"))
        assert (tmp_path / "x.png").stat().st_size > 0


def test_sweep_refuses_zero_processes():
    with pytest.raises(ConfigError, match=r"sweep\(processes=0\)"):
        pi.sweep(make_matmul, CONFIGS, *OPERANDS, processes=0)


# -- CostEstimate against hand counts ---------------------------------------------------


@pytest.mark.timeout(120)
def test_cost_estimate_of_the_guide_matmul_is_the_hand_count():
    m = n = k = 512
    bm, bk, bn = 128, 256, 256
    p = pi.predict(make_matmul(bm, bk, bn), S((m, k), jnp.bfloat16), S((k, n), jnp.bfloat16),
                   compile_check="approximate")
    est = p.cost_estimate()
    assert isinstance(est, pl.CostEstimate)
    steps = (m // bm) * (n // bn) * (k // bk)
    # MXU 2*M*N*K, plus the accumulator's f32 add of a (bm, bn) block every step
    assert est.flops == 2 * m * n * k + steps * bm * bn
    assert est.transcendentals == 0
    # HBM traffic: x and y blocks fetched at every step (k changes every step), each
    # output block written back once
    assert est.bytes_accessed == steps * (bm * bk + bk * bn) * 2 + m * n * 2
    assert est.remote_bytes_transferred == 0
    operands = p.cost_estimate(bytes_accessed="operands")
    assert operands.bytes_accessed == (m * k + k * n + m * n) * 2
    assert operands.flops == est.flops


@pytest.mark.timeout(120)
def test_cost_estimate_counts_transcendentals_and_vector_flops():
    def softplusish(x):
        def kernel(x_ref, o_ref):
            v = x_ref[...]
            o_ref[...] = jnp.log(1.0 + jnp.exp(v)) * 0.5 / v

        spec = pl.BlockSpec((256, 512), lambda i: (i, 0))
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              grid=(4,), in_specs=[spec], out_specs=spec)(x)

    with pi.timeline() as tl, pi.force_tpu_interpret_mode(InterpretParams(chip="v5e")):
        jax.block_until_ready(softplusish(jnp.ones((1024, 512), jnp.float32)))
    est = pi.cost_estimate(tl.launches[-1])
    elements = 1024 * 512
    assert est.transcendentals == 2 * elements  # exp and log
    assert est.flops == 3 * elements  # add, mul and div (XLA counts div as a flop)
    assert est.bytes_accessed == 2 * elements * 4
    # jax takes it
    jax.block_until_ready(pl.pallas_call(
        lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), cost_estimate=est,
        interpret=InterpretParams(chip="v5e"))(np.zeros((8, 128), np.float32)))


def test_cost_estimate_refuses_bad_input():
    with pytest.raises(ConfigError, match=r"bytes_accessed='hbm'\): pass one of"):
        pi.cost_estimate([], bytes_accessed="hbm")
    with pytest.raises(ConfigError, match="no launch record given"):
        pi.cost_estimate([])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sweep_in_worker_processes_gives_the_same_table(monkeypatch):
    # the workers import make_matmul by its module's name (pytest's, from its rootdir:
    # "tests.test_tune" or "packages.interpret.tests.test_tune"); spawned processes start
    # with this process's sys.path
    from pathlib import Path

    root = Path(__file__).resolve().parent
    for _ in range(make_matmul.__module__.count(".")):
        root = root.parent
    monkeypatch.syspath_prepend(str(root))
    configs = [CONFIGS[1], CONFIGS[3]]  # one accepted, one rejected
    alone = pi.sweep(make_matmul, configs, *OPERANDS, compile_check="approximate",
                     progress=False)
    spread = pi.sweep(make_matmul, configs, *OPERANDS, compile_check="approximate",
                      processes=2, progress=False)
    assert spread.records() == alone.records()
    assert spread.rows[0].prediction.launches == ()  # records stay in the workers


def manual_dma_scale(x, *, chunks, interpret=False):
    """HBM operands, double-buffered async copies into VMEM scratch, a VPU op, copies
    back: the DMA/semaphore schedule predict must walk as a full run does."""
    rows = x.shape[0] // chunks

    def kernel(x_hbm, o_hbm, buf, out, sems):
        def fetch(c, slot):
            return pltpu.make_async_copy(x_hbm.at[pl.ds(c * rows, rows)], buf.at[slot],
                                         sems.at[0, slot])

        fetch(0, 0).start()
        for c in range(chunks):
            slot = c % 2
            if c + 1 < chunks:
                fetch(c + 1, 1 - slot).start()
            fetch(c, slot).wait()
            out[...] = jnp.exp(buf[slot]) * 2.0
            store = pltpu.make_async_copy(out, o_hbm.at[pl.ds(c * rows, rows)], sems.at[1, 0])
            store.start()
            store.wait()

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.VMEM((2, rows, x.shape[1]), x.dtype),
                        pltpu.VMEM((rows, x.shape[1]), x.dtype),
                        pltpu.SemaphoreType.DMA((2, 2))],
        interpret=interpret,
    )(x)


@pytest.mark.timeout(120)
def test_predict_walks_manual_dmas_as_the_full_run_does():
    x = jax.random.normal(jax.random.key(0), (1024, 512), jnp.float32)
    p = pi.predict(functools.partial(manual_dma_scale, chunks=4), S(x.shape, x.dtype),
                   compile_check="approximate")
    rec = full_run(functools.partial(manual_dma_scale, chunks=4,
                                     interpret=InterpretParams(chip="v5e")), x)
    assert p.predicted_seconds == rec.predicted_seconds
    assert p.exposed_dma_seconds == rec.exposed_dma_seconds
    assert p.dma_bytes == rec.dma_bytes == 2 * 1024 * 512 * 4
    # an exp costs more than its vreg's load and store (both measured on the v5e)
    assert p.compute_unit == "vector ALU"
    est = p.cost_estimate()
    assert est.transcendentals == 1024 * 512  # exp of every element
    assert est.flops == 1024 * 512  # the multiply
    assert est.bytes_accessed == 2 * 1024 * 512 * 4


def test_keep_float_data_must_be_a_bool():
    with pytest.raises(ConfigError, match=r"InterpretParams.keep_float_data must be True or "
                                          r"False, got 0."):
        InterpretParams(keep_float_data=0)
    assert InterpretParams(keep_float_data=False).simulation_options(5).keep_float_data is False
