"""``InterpretParams(progress_interval=...)``: a launch still running logs where each
core is and the DMAs in flight (logger ``palladium.interpret``, WARNING). No timing is
asserted: the kernel blocks (in a ``jax.debug.callback``) until the report arrived."""

import logging
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import ConfigError, InterpretParams
from palladium.interpret.state.process_state import STATE

pytestmark = pytest.mark.timeout(120)

ANY = pl.BlockSpec(memory_space=pl.ANY)
F32 = jnp.float32


class _Reports(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []
        self.arrived = threading.Event()

    def emit(self, record):
        self.messages.append(record.getMessage())
        # a report from grid point (1,), where the kernel waits for one (on a loaded
        # machine grid point (0,) may outlast the interval and be reported first)
        if "grid point (1,) running" in self.messages[-1]:
            self.arrived.set()


@pytest.fixture
def reports():
    handler = _Reports()
    logger = logging.getLogger("palladium.interpret")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def test_a_long_launch_says_where_each_core_is_and_which_dmas_are_in_flight(reports):
    def stuck(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm, buf, sem)
        copy.start()

        @pl.when(pl.program_id(0) == 1)
        def _():  # stands in for a long computation: wait until the report is out
            jax.debug.callback(lambda: reports.arrived.wait(60) and None)

        copy.wait()
        o_ref[...] = buf[...]

    f = pl.pallas_call(stuck, out_shape=jax.ShapeDtypeStruct((8, 128), F32), grid=(2,),
                       in_specs=[ANY], out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
                       scratch_shapes=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA],
                       interpret=InterpretParams(progress_interval=0.01))
    np.testing.assert_array_equal(f(jnp.ones((8, 128), F32)), 1.0)
    assert reports.arrived.is_set()
    text = next(m for m in reports.messages if "grid point (1,) running" in m)
    assert text.startswith("kernel 'stuck' still running after ")
    assert "  device 0 core 0 at grid point (1,) running" in text
    assert "  DMAs in flight: 1\n    x_hbm->buf (4096 bytes, started) at kernel 'stuck', " \
           "grid point (1,), device 0 core 0 (test_progress_reports.py:" in text
    assert len(STATE.progress) == 0  # the launch unregistered itself


def test_none_turns_reports_off_and_bad_intervals_are_config_errors():
    assert InterpretParams().progress_interval == 60.0
    assert InterpretParams(progress_interval=None).progress_interval is None
    for bad in (0, -1.0, True, "10"):
        with pytest.raises(ConfigError, match=r"InterpretParams.progress_interval must be a "
                           r"number of seconds > 0 \(and < 1e9\), or None"):
            InterpretParams(progress_interval=bad)


def test_a_launch_due_before_the_monitors_next_wake_up_is_reported_in_time():
    """The monitor thread is woken only by a launch due before the time it waits for;
    a launch due later is seen when it wakes. Both are reported (no timing asserted
    beyond generous waits)."""
    from palladium.interpret.state.progress import ProgressMonitor

    seen = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("palladium.interpret")
    logger.addHandler(handler)
    monitor = ProgressMonitor()
    try:
        slow = monitor.register("slow", 3600.0, lambda: "slow state")
        threading.Event().wait(0.2)  # the thread now waits an hour for "slow"
        fast = monitor.register("fast", 0.05, lambda: "fast state")  # due first: woken
        later = monitor.register("later", 0.3, lambda: "later state")  # due after "fast"
        for _ in range(200):
            if (any("kernel 'fast'" in m for m in seen)
                    and any("kernel 'later'" in m for m in seen)):
                break
            threading.Event().wait(0.05)
        assert any("kernel 'fast' still running" in m and "fast state" in m for m in seen)
        assert any("kernel 'later' still running" in m and "later state" in m for m in seen)
        assert not any("kernel 'slow'" in m for m in seen)
    finally:
        for key in (slow, fast, later):
            monitor.unregister(key)
        logger.removeHandler(handler)
