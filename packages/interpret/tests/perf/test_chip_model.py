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
def test_a_transposed_right_operand_costs_its_transpose():
    def dot(dims):
        def kernel(x_ref, o_ref):
            o_ref[...] = jax.lax.dot_general(x_ref[...], x_ref[...], (dims, ((), ())),
                                             preferred_element_type=jnp.float32)
        return kernel

    x = jnp.ones((256, 256), jnp.float32)
    nn = _record(dot(((1,), (0,))), x).by_primitive["dot_general"]
    nt = _record(dot(((1,), (1,))), x).by_primitive["dot_general"]
    assert nt - nn == pytest.approx(64 * V5E.mxu_transposed_rhs_vreg_seconds)  # 64 vregs
