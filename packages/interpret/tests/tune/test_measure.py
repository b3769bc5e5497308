"""measure(): device time from the jax profiler's trace. The trace reading is checked on a
trace-event list shaped as jax's Perfetto trace is (as read on a TPU v5e); measure()
itself needs a TPU and says so elsewhere; on a TPU host the last tests time a kernel."""

import jax
import jax.numpy as jnp
import pytest

import palladium.interpret as pi
from palladium.interpret.tune.measure import Measurement, module_durations


def _meta(kind, pid, name, tid=None):
    event = {"ph": "M", "name": kind, "pid": pid, "args": {"name": name}}
    if tid is not None:
        event["tid"] = tid
    return event


def _span(pid, tid, name, ts, dur):
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur}


TRACE = [
    _meta("process_name", 1, "/host:CPU"),
    _meta("process_name", 7, "/device:TPU:0"),
    _meta("process_name", 8, "/device:TPU:1"),
    _meta("thread_name", 7, "XLA Modules", tid=3),
    _meta("thread_name", 7, "XLA Ops", tid=4),
    _meta("thread_name", 8, "XLA Modules", tid=3),
    _meta("thread_name", 1, "XLA Modules", tid=3),
    _span(7, 3, "jit_palladium_measure_1(123)", ts=300, dur=40),
    _span(7, 3, "jit_palladium_measure_1(123)", ts=100, dur=50),
    _span(7, 3, "jit_palladium_measure_10(124)", ts=200, dur=999),  # another program
    _span(7, 4, "jit_palladium_measure_1(123)", ts=110, dur=30),  # an op, not the module
    _span(8, 3, "jit_palladium_measure_1(123)", ts=120, dur=70),  # another TPU
    _span(1, 3, "jit_palladium_measure_1(123)", ts=130, dur=80),  # the host
]


def test_module_durations_reads_the_tpu_modules_of_that_program_in_order():
    assert module_durations(TRACE, "palladium_measure_1") == pytest.approx([50e-6, 40e-6])
    assert module_durations(TRACE, "palladium_measure_10") == pytest.approx([999e-6])
    # jax drops a function name's trailing underscores from its program's name
    assert module_durations(TRACE, "palladium_measure_1_") == pytest.approx([50e-6, 40e-6])
    assert module_durations(TRACE, "absent") == []


def test_a_measurement_reports_its_median_and_spread():
    m = Measurement(seconds=40e-6, samples=(38e-6, 40e-6, 46e-6), device_kind="TPU v5 lite")
    assert str(m) == "40.0 us on TPU v5 lite (median of 3, spread 20.0%)"


ON_A_TPU = jax.default_backend() == "tpu"
needs_no_tpu = pytest.mark.skipif(ON_A_TPU, reason="checks the refusal where no TPU is")
needs_a_tpu = pytest.mark.skipif(not ON_A_TPU, reason="times a kernel on a TPU")


@needs_no_tpu
def test_measure_without_a_tpu_says_what_to_use_instead():
    with pytest.raises(pi.ConfigError, match=r"jax's default backend here is 'cpu'.*predict"):
        pi.measure(lambda x: x + 1, jnp.ones(4))


def _make(rows):
    import jax
    from jax.experimental import pallas as pl

    spec = pl.BlockSpec((rows, 128), lambda i: (i, 0))
    return pl.pallas_call(lambda x, o: o.__setitem__(..., x[...] + 1),
                          out_shape=jax.ShapeDtypeStruct((512, 128), jnp.float32),
                          grid=(512 // rows,), in_specs=[spec], out_specs=spec)


@needs_no_tpu
@pytest.mark.timeout(120)
def test_sweep_measure_needs_a_tpu_and_one_process():
    import jax

    x = jax.ShapeDtypeStruct((512, 128), jnp.float32)
    with pytest.raises(pi.ConfigError, match=r"sweep\(measure=True\): measure\(\) times"):
        pi.sweep(_make, [{"rows": 8}], x, compile_check="approximate", measure=True)


@pytest.mark.timeout(120)
def test_measured_times_sit_beside_the_prediction_and_the_rank_agreement_is_kendalls_tau():
    import dataclasses

    import jax

    x = jax.ShapeDtypeStruct((512, 128), jnp.float32)
    result = pi.sweep(_make, [{"rows": 8}, {"rows": 64}, {"rows": 512}], x,
                      compile_check="approximate")
    assert result.rank_agreement is None and "measured_us" not in result.table()
    predicted = [r.predicted_seconds for r in result.rows]
    assert len(set(predicted)) == 3  # three distinct predictions to order
    order = sorted(range(3), key=lambda i: predicted[i])
    # Measured in the predicted order: tau 1; one pair swapped of three: (2 - 1) / 3.
    same = [1e-6 * (1 + order.index(i)) for i in range(3)]
    swapped = list(same)
    swapped[order[0]], swapped[order[1]] = swapped[order[1]], swapped[order[0]]
    for times, tau in [(same, 1.0), (swapped, 1 / 3)]:
        rows = tuple(dataclasses.replace(r, measured_seconds=t)
                     for r, t in zip(result.rows, times))
        measured = dataclasses.replace(result, rows=rows)
        assert measured.rank_agreement == pytest.approx(tau)
        table = measured.table()
        assert "| predicted_us | measured_us |" in table.splitlines()[0]
        assert measured.records()[0]["measured_us"] == round(
            measured.ranked[0].measured_seconds * 1e6, 3)


@needs_a_tpu
@pytest.mark.timeout(300)
def test_on_a_tpu_measure_times_the_kernel_and_a_sweep_puts_it_beside_the_prediction():
    x = jnp.ones((512, 128), jnp.float32)
    m = pi.measure(_make(64), x, iters=5)
    assert len(m.samples) == 5 and 0 < m.seconds < 1e-2 and m.device_kind.startswith("TPU")
    result = pi.sweep(_make, [{"rows": 8}, {"rows": 512}], jax.ShapeDtypeStruct(x.shape,
                      x.dtype), compile_check="approximate", measure=True)
    assert all(r.measured_seconds and r.measured_seconds > 0 for r in result.rows)
    assert result.rank_agreement is not None and "measured_us" in result.table()
