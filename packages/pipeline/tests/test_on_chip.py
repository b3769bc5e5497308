"""The pipeline compiled by Mosaic and run on the TPU (marked ``tpu``: skipped where jax's
default backend is not a TPU; ``pytest -m tpu`` / ``nox -s tpu`` on a TPU VM).

Each kernel runs on the chip with palladium's emitter, against its numpy reference and,
where jax 0.10.2's ``pltpu.emit_pipeline`` has the feature, against the same kernel built
on jax's emitter (equal bits: both issue the same DMAs and the same body). The features
jax lacks (Buffered(3+) on outputs, in-out pairs, ragged last blocks...) run in the other
test modules' ``mode="chip"`` cases."""

import jax
import numpy as np
import pytest
from _pipeline_harness import CHIP, run
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from test_basic_pipeline import index_map, make_affine
from test_operands import matmul_call
from test_primitive import CASES, _x
from test_schedules import lookahead_call

import palladium.pipeline as pp

pytestmark = pytest.mark.tpu

AFFINE = [  # (rows, cols, block rows, block cols, in buffers, out buffers, order)
    (4, 2, 8, 128, 1, 1, "row_major"),
    (3, 2, 16, 128, 2, 2, "reversed"),
    (2, 3, 8, 256, 3, 2, "transposed"),
    (8, 1, 64, 512, 2, 1, "row_major"),
]


@pytest.mark.parametrize("case", AFFINE, ids=lambda c: "-".join(map(str, c)))
def test_elementwise_on_chip_matches_numpy_and_jax(case):
    rows, cols, br, bc, n_in, n_out, order = case
    grid = (rows, cols) if order != "transposed" else (cols, rows)
    imap = index_map(order, grid)
    shape = (rows * br, cols * bc)
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    make_call = make_affine(shape, grid=grid, block=(br, bc), in_map=imap, out_map=imap,
                            in_mode=pp.Buffered(n_in), out_mode=pp.Buffered(n_out))
    ours = np.asarray(run(make_call, CHIP, x))
    np.testing.assert_allclose(ours, x * 2 + 1, rtol=1e-6)
    if n_in <= 2 and n_out <= 2:  # jax 0.10.2's emitter: at most double buffering
        jax_call = make_affine(shape, grid=grid, block=(br, bc), in_map=imap, out_map=imap,
                               in_mode=pl.Buffered(n_in), out_mode=pl.Buffered(n_out))
        theirs = np.asarray(run(lambda interpret: jax_call(interpret, pltpu.emit_pipeline),
                                CHIP, x))
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("nm,nn,nk,x_count,o_count",
                         [(1, 1, 1, 1, 1), (2, 2, 3, 2, 2), (2, 1, 3, 3, 2), (1, 2, 2, 2, 1)])
def test_accumulating_matmul_on_chip(nm, nn, nk, x_count, o_count):
    m, n, k = 128 * nm, 128 * nn, 128 * nk
    rng = np.random.default_rng(2)
    x = rng.normal(size=(m, k)).astype(np.float32)
    y = rng.normal(size=(k, n)).astype(np.float32)
    with jax.default_matmul_precision("highest"):
        ours = np.asarray(run(matmul_call(m, n, k, 128, 128, 128, x_count=x_count,
                                          o_count=o_count), CHIP, x, y))
        np.testing.assert_allclose(ours, x.astype(np.float64) @ y, rtol=1e-4, atol=1e-3)
        if x_count <= 2 and o_count <= 2:
            theirs = np.asarray(run(matmul_call(m, n, k, 128, 128, 128, x_count=x_count,
                                                o_count=o_count, emit=pltpu.emit_pipeline),
                                    CHIP, x, y))
    if x_count <= 2 and o_count <= 2:
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("blocks,repeat", [(1, 2), (3, 1), (4, 3)])
def test_lookahead_on_chip_matches_numpy_and_jax(blocks, repeat):
    shape = (blocks * 8, 128)
    x = np.random.default_rng(3).normal(size=shape).astype(np.float32)
    ours = np.asarray(run(lookahead_call(shape, repeat), CHIP, x))
    np.testing.assert_allclose(ours, x * 2.0)
    theirs = np.asarray(run(lookahead_call(shape, repeat, emit=pltpu.emit_pipeline,
                                           mode_cls=pl.Buffered), CHIP, x))
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_primitive_path_on_chip_equals_inlined(case):
    make, shapes = CASES[case]
    args = [np.asarray(_x(s, seed)) for seed, s in enumerate(shapes)]
    inlined = np.asarray(run(make(False), CHIP, *args))
    np.testing.assert_array_equal(np.asarray(run(make(True), CHIP, *args)), inlined)
    reference = np.asarray(run(make(False), "interpret_true", *args))
    np.testing.assert_allclose(inlined, reference, rtol=2e-2, atol=2e-2)
