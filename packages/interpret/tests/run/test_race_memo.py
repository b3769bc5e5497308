"""Race detection memoised per kernel: a launch that makes the calls of the kernel's last
race-free launch needs no detection, and a later launch whose schedule depends on its
data (here a scalar operand) and races is reported exactly as without the memo."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import (
    DataRaceError,
    InterpretParams,
    collected_race_reports,
    errors_as_raised,
)
from palladium.race_detect import MemoDetector, RaceMemo


def _kernel(flag_ref, x_hbm, o_ref, scratch, sem):
    copy = pltpu.make_async_copy(x_hbm, scratch, sem)
    copy.start()

    @pl.when(flag_ref[0] == 1)
    def _():
        copy.wait()  # then read: ordered after the DMA's write

    o_ref[...] = scratch[...] + 1.0  # flag 0: read while the DMA may still write

    @pl.when(flag_ref[0] != 1)
    def _():
        copy.wait()


def _call(on_race="raise", **params):
    params = {"dma_execution_mode": "eager", **params}
    return jax.jit(pl.pallas_call(
        _kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i, flag: (0, 0)),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        ),
        interpret=InterpretParams(detect_races=True, on_race=on_race, **params),
    ))


X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
SAFE, RACY = jnp.array([1], jnp.int32), jnp.array([0], jnp.int32)


@pytest.fixture
def launches(monkeypatch):
    """Whether each launch's detector matched the remembered log all the way."""
    seen = []
    remember = MemoDetector.remember

    def spy(self):
        seen.append(self.matched)
        remember(self)

    monkeypatch.setattr(MemoDetector, "remember", spy)
    return seen


def _text(report):
    """A report's message and repr (without the addresses of jax's source infos: the
    comparison runs another jitted function)."""
    return str(report), re.sub(r" at 0x[0-9a-f]+", "", repr(report))


def _raised(f, flag):
    with pytest.raises(DataRaceError) as info, errors_as_raised():
        f(flag, X).block_until_ready()
    return str(info.value)


@pytest.mark.timeout(300)
def test_a_later_launch_that_races_raises_as_without_the_memo(launches, monkeypatch):
    f = _call("raise")
    for _ in range(3):
        np.testing.assert_array_equal(f(SAFE, X), X + 1.0)
    assert launches == [False, True, True]  # the first detects, the others match
    raised = _raised(f, RACY)
    assert len(launches) == 3  # it raised: its run did not end, nothing remembered
    # Nothing remembered: every launch detects eagerly, as before the memo.
    monkeypatch.setattr(RaceMemo, "get", lambda self, key: None)
    g = _call("raise")
    g(SAFE, X).block_until_ready()
    assert raised == _raised(g, RACY)
    assert "data race" in raised and "test_race_memo.py:" in raised
    # The race-free launch is still remembered.
    monkeypatch.undo()
    seen = []
    monkeypatch.setattr(MemoDetector, "remember",
                        lambda self, r=MemoDetector.remember: (seen.append(self.matched), r(self)))
    np.testing.assert_array_equal(f(SAFE, X), X + 1.0)
    assert seen == [True]


@pytest.mark.timeout(300)
def test_a_later_launch_that_races_collects_the_reports_of_the_eager_detector(
        launches, monkeypatch):
    collected_race_reports()
    f = _call("collect")
    for _ in range(2):
        f(SAFE, X).block_until_ready()
    assert launches == [False, True] and collected_race_reports() == []
    f(RACY, X).block_until_ready()
    got = [_text(r) for r in collected_race_reports()]
    f(SAFE, X).block_until_ready()
    assert launches[-1] is True  # the racing launch was not remembered
    monkeypatch.setattr(RaceMemo, "get", lambda self, key: None)
    g = _call("collect")
    g(SAFE, X).block_until_ready()
    g(RACY, X).block_until_ready()
    want = [_text(r) for r in collected_race_reports()]
    assert got == want and len(want) >= 1


@pytest.mark.timeout(300)
def test_order_trials_do_not_push_the_kernels_own_log_out_of_the_memo(launches):
    """Each ``dma_order_trials`` re-run has its own seed, so its own memo key: with two
    trials a launch makes three logs, and the next launch still finds all of them."""
    f = _call(dma_order="random", dma_order_trials=2, dma_execution_mode="on_wait")
    for _ in range(2):
        np.testing.assert_array_equal(f(SAFE, X), X + 1.0)
    assert launches == [False] * 3 + [True] * 3
