"""A simulation given a ``RaceMemo`` detects through a ``MemoDetector``: a run that makes
the calls of the last race-free run needs no detection; one that races is reported as
by the eager detector, with the same message."""

import pytest
from _race_scenarios import dma_then_read

from palladium.race_detect import MemoDetector, RaceDetector, RaceMemo
from palladium.shared_memory import DataRaceError


def _run(memo, read_before_wait, mode="on_wait", on_race="raise"):
    return dma_then_read(mode, read_before_wait, on_race, race_memo=memo)


def _message(memo, mode):
    with pytest.raises(DataRaceError) as info:
        _run(memo, read_before_wait=True, mode=mode)
    return str(info.value)


@pytest.mark.parametrize("mode", ["eager", "on_wait"])
def test_a_run_with_the_remembered_calls_detects_nothing_and_a_racing_one_raises_as_ever(mode):
    memo = RaceMemo()
    first = _run(memo, read_before_wait=False, mode=mode)
    assert isinstance(first.race_detector, MemoDetector) and not first.race_detector.matched
    second = _run(memo, read_before_wait=False, mode=mode)
    det = second.race_detector
    assert det.matched and det.reports == []
    eager = _run(None, read_before_wait=False, mode=mode).race_detector
    assert isinstance(eager, RaceDetector)
    assert (det.num_slots, det.live_records()) == (eager.num_slots, eager.live_records())
    assert _message(memo, mode) == _message(None, mode)
    assert "kernel.py:11" in _message(memo, mode)
    assert _run(memo, read_before_wait=False, mode=mode).race_detector.matched


def test_collected_reports_are_the_eager_detectors():
    memo = RaceMemo()
    _run(memo, read_before_wait=False, on_race="collect")
    got = _run(memo, read_before_wait=True, on_race="collect").race_detector.reports
    want = _run(None, read_before_wait=True, on_race="collect").race_detector.reports
    assert [(repr(r), str(r)) for r in got] == [(repr(r), str(r)) for r in want] and want
