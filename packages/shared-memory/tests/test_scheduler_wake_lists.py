"""Wake-lists pick exactly as the brute-force scan did: same candidates, same order, same
RNG calls, so the same seed gives the same schedule (and every outcome) as before.

The oracle is ``Simulation(scheduler_oracle=True)``: its scheduler evaluates every task's
readiness at every pick (the scan the wake-lists replaced), fails if the wake-list's
candidates differ, and picks from the scan's.
"""

import functools
import random
import threading

import pytest
from _scheduler_scenarios import EXTRAS, ROUND_KINDS, Scenario, run_scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from palladium.shared_memory import Simulation
from palladium.shared_memory.scheduler import Scheduler

_rounds = st.lists(st.tuples(st.sampled_from(ROUND_KINDS), st.integers(0, 3)), max_size=6)


@st.composite
def scenarios(draw):
    rounds = tuple(draw(_rounds))
    extras = draw(st.lists(
        st.tuples(st.integers(0, max(len(rounds) - 1, 0)), st.integers(0, 7),
                  st.sampled_from(EXTRAS)),
        max_size=6,
    ))
    return Scenario(
        devices=draw(st.integers(1, 4)), cores=draw(st.integers(1, 2)),
        seed=draw(st.integers(0, 2**16)), mode=draw(st.sampled_from(["on_wait", "eager"])),
        dma_order=draw(st.sampled_from(["issue", "random"])), detect_races=draw(st.booleans()),
        rounds=rounds, extras=tuple(extras),
    )


@pytest.mark.timeout(120)
@settings(max_examples=150, deadline=None)
@given(scenario=scenarios())
def test_wake_lists_schedule_as_the_scan(scenario):
    oracle = run_scenario(scenario, functools.partial(Simulation, scheduler_oracle=True))
    schedule, error, values, races = run_scenario(scenario)
    assert error is None or error[0] != "AssertionError", error
    assert (schedule, error, values, races) == oracle


@pytest.mark.timeout(60)
def test_scenarios_cover_long_runs_deadlocks_and_leaks():
    # The property above means something only if the scenarios switch a lot and end in
    # each way: a fixed sample of them, checked against the oracle too.
    rng = random.Random(5)
    outcomes = set()
    switches = 0
    for _ in range(60):
        rounds = tuple((rng.choice(ROUND_KINDS), rng.randint(0, 3)) for _ in range(6))
        extras = tuple((rng.randint(0, 5), rng.randint(0, 7), rng.choice(EXTRAS))
                       for _ in range(rng.randint(0, 3)))
        scenario = Scenario(rng.randint(2, 4), 2, rng.randint(0, 99), rng.choice(["on_wait", "eager"]),
                            rng.choice(["issue", "random"]), False, rounds, extras)
        result = run_scenario(scenario)
        assert result == run_scenario(scenario, functools.partial(Simulation, scheduler_oracle=True))
        switches += len(result[0])
        outcomes.add(None if result[1] is None else result[1][0])
    assert outcomes == {None, "DeadlockError", "SemaphoreLeakError"}
    assert switches > 2000


def _blocking_run(oracle: bool, seed: int) -> tuple:
    """Cores blocking on plain predicates (no WaitPoint): checked at every pick."""
    local = threading.local()
    trace: list = []
    sched = Scheduler(random.Random(seed), local, trace, oracle=oracle)
    tokens = {"count": 0}
    log = []

    def body(i):
        def run():
            for step in range(4):
                sched.yield_point(local.task)
                if i % 2:  # producers
                    tokens["count"] += 1
                    log.append(("put", i, step))
                else:  # consumers: wait for a token
                    while tokens["count"] == 0:
                        sched.block(local.task, lambda: tokens["count"] > 0, lambda: "no token")
                    tokens["count"] -= 1
                    log.append(("take", i, step))
        return run

    sched.run({(0, i): body(i) for i in range(6)})
    return tuple(trace), tuple(log)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", range(8))
def test_predicates_without_a_wait_point_are_checked_at_every_pick(seed):
    trace, log = _blocking_run(False, seed)
    assert (trace, log) == _blocking_run(True, seed)
    assert sorted(e[0] for e in log) == ["put"] * 12 + ["take"] * 12
