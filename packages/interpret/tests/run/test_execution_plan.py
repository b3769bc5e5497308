"""Issue 43, item 2: which tier runs a launch is one plan (``run/execution_plan.py``),
decided once per launch from the params, the observers and the launch's number, carried
by the launch, shown to observers (``LaunchInfo.plan``) and logged; DMA-order trial
launches do not count as launches. A test per reason."""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams, LoggingMode, OutOfBoundsError, errors_as_raised
from palladium.interpret.compiled import compiled_launch
from palladium.interpret.eval.segments import HOT_LAUNCH
from palladium.interpret.hook import jax_hook
from palladium.interpret.observe.observers import scoped_launch_observer
from palladium.interpret.run.execution_plan import (
    COMPILED,
    SEGMENTS,
    SIMULATED,
    WHOLE_LAUNCH,
    ExecutionPlan,
    plan_launch,
)
from palladium.shared_memory import Observer

pytestmark = pytest.mark.timeout(300)


@dataclasses.dataclass
class _Kernel:
    """What ``plan_launch`` reads of a ``PreparedKernel``."""

    is_core_map: bool = False
    reads_uninitialized: bool = False
    clean_scalar_keys: set = dataclasses.field(default_factory=set)

    def scalar_key(self, args):
        return bytes(np.asarray(args[0]).tobytes())


def _plan(number=HOT_LAUNCH, kernel=None, **params):
    return plan_launch(kernel or _Kernel(), InterpretParams(**params), number)


@pytest.mark.parametrize("params, reason", [
    (dict(compile_segments=False), "compile_segments=False"),
    (dict(skip_floating_point_ops=True), "skip_floating_point_ops=True"),
    (dict(deterministic_dot=True), "deterministic_dot=True"),
    (dict(uninitialized_reads="raise"), "uninitialized_reads='raise'"),
    (dict(uninitialized_reads="warn"), "uninitialized_reads='warn'"),
    (dict(keep_float_data=False), "keep_float_data=False"),
])
def test_params_that_need_each_equation_seen_run_it_simulated(params, reason):
    plan = _plan(**params)
    assert (plan.tier, plan.segments, plan.hot) == (SIMULATED, False, False)
    assert plan.reason.startswith(reason)
    assert str(plan) == f"launch {HOT_LAUNCH} ran simulated, because {plan.reason}"


@pytest.mark.parametrize("params, reason", [
    (dict(compile_segments="static"), "compile_segments='static'"),
    (dict(num_cores_or_threads=2), "num_cores_or_threads=2"),
    (dict(buffer_bounds="padded"), "buffer_bounds='padded'"),
    (dict(out_of_bounds_reads="uninitialized"), "out_of_bounds_reads='uninitialized'"),
    (dict(dma_order="random"), "dma_order='random'"),
    (dict(dma_execution_mode="eager"), "dma_execution_mode='eager'"),
    (dict(dma_order="random", dma_order_trials=2), "dma_order='random'"),
    (dict(grid_point_recorder=lambda *a: None), "grid_point_recorder="),
])
def test_params_a_compiled_launch_does_not_model_run_it_with_segments(params, reason):
    plan = _plan(**params)
    assert plan.tier == SEGMENTS and plan.reason.startswith(reason), plan
    # hot segments run compiled on a hot launch, except where the params say static
    assert plan.hot == (params.get("compile_segments", True) is True)


def test_an_observed_launch_runs_segments():
    plan = plan_launch(_Kernel(), InterpretParams(), HOT_LAUNCH, observed=True)
    assert plan.tier == SEGMENTS and "observer" in plan.reason and plan.hot


def test_a_launch_on_several_devices_runs_segments():
    plan = plan_launch(_Kernel(), InterpretParams(), HOT_LAUNCH, num_devices=2)
    assert plan.tier == SEGMENTS and plan.reason.startswith("it runs on 2 devices")


def test_a_core_map_runs_segments():
    plan = _plan(kernel=_Kernel(is_core_map=True))
    assert plan.tier == SEGMENTS and "core_map" in plan.reason


def test_a_kernel_that_read_uninitialised_memory_runs_segments_except_for_clean_scalars():
    kernel = _Kernel(reads_uninitialized=True)
    scalars = [np.int32(7)]
    plan = plan_launch(kernel, InterpretParams(), HOT_LAUNCH, scalars=scalars)
    assert plan.tier == SEGMENTS and "uninitialised" in plan.reason
    kernel.clean_scalar_keys.add(kernel.scalar_key(scalars))
    assert plan_launch(kernel, InterpretParams(), HOT_LAUNCH, scalars=scalars).tier == COMPILED
    # "off": nothing carries shadows, a launch runs compiled whatever it read before
    assert plan_launch(_Kernel(reads_uninitialized=True),
                       InterpretParams(uninitialized_reads="off"), HOT_LAUNCH).tier == COMPILED


def test_the_launch_number_alone_decides_when_a_kernel_is_hot():
    assert WHOLE_LAUNCH <= HOT_LAUNCH
    plans = [_plan(number=n) for n in range(1, HOT_LAUNCH + 2)]
    assert [p.tier for p in plans] == [SEGMENTS] * (WHOLE_LAUNCH - 1) + [COMPILED] * (
        HOT_LAUNCH + 2 - WHOLE_LAUNCH)
    assert [p.hot for p in plans] == [False] * (HOT_LAUNCH - 1) + [True] * 2
    # nothing is compiled ahead, beside a launch: a plan says only what its launch runs
    assert not any(hasattr(p, "compile_ahead") or hasattr(p, "warming") for p in plans)
    assert "not hot yet" in plans[0].reason and "is hot" in plans[-1].reason


def test_races_on_make_compiled_segments_replay_their_accesses():
    assert _plan(detect_races=True).replay_races and not _plan().replay_races


def test_a_plan_falls_back_to_a_slower_tier_only():
    plan = _plan()
    seg = plan.fall_back("its compiled run raised the flag 'x'")
    assert (seg.tier, seg.reason, seg.number, seg.hot) == (SEGMENTS, "its compiled run "
                                                           "raised the flag 'x'", HOT_LAUNCH, True)
    assert seg.fall_back("another reason") is seg
    sim = seg.fall_back("an observer is told of every equation", SIMULATED)
    assert sim.tier == SIMULATED and sim.fall_back("x", SEGMENTS) is sim


def test_a_trial_plan_keeps_the_launch_number_and_never_runs_compiled():
    trial = _plan().as_trial(InterpretParams(detect_races=True))
    assert (trial.tier, trial.number, trial.trial, trial.replay_races) == (
        SEGMENTS, HOT_LAUNCH, True, True)
    assert str(trial).startswith(f"trial of launch {HOT_LAUNCH} ran segments")


# --- end to end: the plans of a kernel's launches ------------------------------------------

N = 8


def _kernel(idx_ref, x_ref, o_ref):
    x = x_ref[pl.ds(idx_ref[0], N), :]
    o_ref[...] = jnp.tanh(x) * 2.0 + jnp.exp(-x * x)


def _call(params):
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(4,),
        in_specs=[pl.BlockSpec((2 * N, 128), lambda i, idx: (0, 0))],
        out_specs=pl.BlockSpec((N, 128), lambda i, idx: (i, 0)))
    return jax.jit(lambda idx, x: pl.pallas_call(
        _kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((4 * N, 128), jnp.float32),
        interpret=params)(idx, x))


@pytest.fixture
def plans(monkeypatch):
    """Every launch's final plan (the kernel's ``launches.last_plan`` after it ran)."""
    monkeypatch.setattr(compiled_launch, "MIN_EQUATIONS_PER_LAUNCH", 0)
    seen: list = []
    real = jax_hook._execute

    def spy(kernel, *args, **kwargs):
        try:
            return real(kernel, *args, **kwargs)
        finally:
            seen.append((kernel, kernel.launches.last_plan))

    monkeypatch.setattr(jax_hook, "_execute", spy)
    return seen


def _x():
    return np.random.default_rng(0).standard_normal((2 * N, 128)).astype(np.float32)


def _reference(x, idx):
    y = np.float64(x[idx:idx + N])
    return np.tile(np.tanh(y) * 2 + np.exp(-y * y), (4, 1))


def test_a_kernels_launches_run_segments_then_compiled_and_a_flag_falls_back(plans):
    call, x = _call(InterpretParams(random_seed=5)), _x()
    idx = np.array([3], np.int32)
    for _ in range(4):
        np.testing.assert_allclose(np.asarray(call(idx, x)), _reference(x, 3), rtol=1e-5,
                                   atol=1e-5)
    assert [(p.number, p.tier) for _, p in plans] == [
        (n, SEGMENTS if n < WHOLE_LAUNCH else COMPILED) for n in range(1, 5)]
    assert plans[HOT_LAUNCH - 1][1].hot
    # an access out of bounds: the compiled run's flag sends the launch to the simulator,
    # which reports it
    with pytest.raises(OutOfBoundsError), errors_as_raised():
        jax.block_until_ready(call(np.array([N + 1], np.int32), x))
    last = plans[-1][1]
    assert (last.number, last.tier) == (5, SEGMENTS)
    assert last.reason.startswith("its compiled run raised the flag")


def test_dma_order_trials_do_not_count_as_launches(plans):
    params = InterpretParams(dma_order="random", dma_order_trials=2, random_seed=1)
    call, x = _call(params), _x()
    for _ in range(3):
        call(np.array([0], np.int32), x)
    kernel = plans[0][0]
    assert kernel.launches.count == 3  # (the 6 trial reruns are not launches)
    assert [(p.number, p.tier, p.trial) for _, p in plans] == [
        (n, SEGMENTS, False) for n in (1, 2, 3)]
    assert plans[2][1].hot  # the third launch is hot: hot segments run compiled


def test_observers_see_the_plan_and_the_launch_log_says_it(caplog):
    infos = []

    def factory(info):
        infos.append(info)

    call, x = _call(InterpretParams(logging_mode=LoggingMode.LAUNCH)), _x()
    with caplog.at_level(logging.DEBUG, logger="palladium.interpret"), \
            scoped_launch_observer(factory):
        for _ in range(HOT_LAUNCH):
            call(np.array([1], np.int32), x)
    assert [(i.plan.number, i.plan.tier) for i in infos] == [
        (n, SEGMENTS) for n in range(1, HOT_LAUNCH + 1)]
    logged = [r.getMessage() for r in caplog.records if "ran segments, because" in r.getMessage()]
    assert len(logged) == HOT_LAUNCH
    assert logged[0].endswith("launch 1 ran segments, because a launch observer watches it "
                              "(logging_mode, a timeline, a registered factory): observed "
                              "launches are simulated")


def test_an_observer_of_every_equation_runs_the_launch_simulated(caplog):
    class Equations(Observer):
        def __init__(self):
            self.count = 0

        def compute(self, core, eqn):
            self.count += 1

    watchers = []

    def factory(info):
        watchers.append(Equations())
        return watchers[-1]

    call, x = _call(InterpretParams(logging_mode=LoggingMode.LAUNCH)), _x()
    with caplog.at_level(logging.DEBUG, logger="palladium.interpret"), \
            scoped_launch_observer(factory):
        np.testing.assert_allclose(np.asarray(call(np.array([2], np.int32), x)),
                                   _reference(x, 2), rtol=1e-5, atol=1e-5)
    assert watchers[0].count > 0
    assert any(r.getMessage().endswith("launch 1 ran simulated, because an observer is told "
                                       "of every equation (a timeline)")
               for r in caplog.records)


def test_plans_are_frozen():
    plan = ExecutionPlan(1, SEGMENTS, "why")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.tier = COMPILED  # type: ignore[misc]
