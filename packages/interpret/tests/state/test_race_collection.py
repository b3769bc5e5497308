"""Race reports under ``on_race="collect"``: the process-wide log is bounded (the oldest
are dropped, and the next collection warns how many), and ``collect_race_reports()``
ties the reports of the launches within it to the list it yields."""

import jax
import jax.numpy as jnp
import pytest
from _launch_harness import racy_call

from palladium.interpret import (
    InterpretParams,
    collect_race_reports,
    collected_race_reports,
)
from palladium.interpret.hook import jax_hook
from palladium.interpret.state.race_log import CAPACITY, RaceLog
from palladium.race_detect import RaceReport, RaceWarning


def _racy_call():
    # (a DMA's destination read before its wait reaches the output: off, to collect races)
    return jax.jit(racy_call(InterpretParams(detect_races=True, on_race="collect",
                                             uninitialized_reads="off")))


def test_scope_collects_its_launches_reports():
    collected_race_reports()
    call, x = _racy_call(), jnp.ones((8, 128), jnp.float32)
    with collect_race_reports() as outer:
        call(x).block_until_ready()
        with collect_race_reports() as inner:
            call(x).block_until_ready()
            call(x).block_until_ready()
    assert len(outer) >= 1 and len(inner) == 2 * len(outer)
    assert all(isinstance(r, RaceReport) and "buf" in str(r) for r in outer + inner)
    assert collected_race_reports() == []  # nothing reached the process-wide log
    call(x).block_until_ready()
    assert len(collected_race_reports()) == len(outer)


def test_process_wide_log_is_bounded_and_warns_what_it_dropped():
    call, x = _racy_call(), jnp.ones((8, 128), jnp.float32)
    collected_race_reports()
    call(x).block_until_ready()
    one = collected_race_reports()
    log = RaceLog(capacity=5)
    for _ in range(4):
        log.extend(one * 2)
    with pytest.warns(RaceWarning, match=r"3 race report\(s\) were dropped: the log keeps "
                                         r"the latest 5"):
        kept = log.drain()
    assert len(kept) == 5 and len(log) == 0
    assert jax_hook._RACES._reports.maxlen == CAPACITY


def test_many_collecting_launches_do_not_grow_the_log_past_its_bound():
    call, x = _racy_call(), jnp.ones((8, 128), jnp.float32)
    collected_race_reports()
    call(x).block_until_ready()
    per_launch = len(collected_race_reports())
    small = RaceLog(capacity=3 * per_launch)
    saved, jax_hook._RACES = jax_hook._RACES, small
    try:
        for _ in range(6):
            call(x).block_until_ready()
        assert len(small) == 3 * per_launch
    finally:
        jax_hook._RACES = saved
