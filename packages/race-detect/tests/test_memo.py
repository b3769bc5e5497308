"""MemoDetector: a launch compared with the last race-free launch's call log gives exactly
what an eager RaceDetector gives on the same calls (reports, their order and text, the
error raised and where, slots, live records), whether the log matches all the way,
diverges in the middle, or there is nothing remembered."""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from palladium.race_detect import (
    MemoDetector,
    PreparedAccess,
    RaceDetector,
    RaceMemo,
    prepare,
)
from palladium.race_detect.call_log import END, Opaque

SHAPE = (8,)
KEYS = ("a", "b", "c")


def run(det: Any, ops: list[tuple[Any, ...]], tag: str) -> dict[str, Any]:
    """Drive ``det`` with ``ops`` (indices into the actors and clocks made so far, taken
    modulo their number); ``tag`` marks this launch's names and sites. Stops at the
    first exception. Returns everything the detector answers."""
    actors: list[Any] = []
    clocks: list[Any] = []
    prepared = {(lo, hi): prepare((slice(lo, hi),), SHAPE) for lo in range(8) for hi in range(8)}
    for key in KEYS:
        det.register_buffer(key, SHAPE, f"{key} ({tag})")
    actors.append(det.new_actor(f"core 0 ({tag})"))
    actors.append(det.new_actor(f"core 1 ({tag})"))  # unordered with core 0 until synced
    error = None
    for i, op in enumerate(ops):
        kind, *args = op
        site = f"{tag}.py:{i}"
        pick = lambda seq, j: seq[j % len(seq)]  # noqa: E731
        try:
            if kind == "new":
                parent = None if args[0] is None else pick(actors, args[0])
                actors.append(det.new_actor(f"actor {len(actors)} ({tag})", parent))
            elif kind in ("read", "write"):
                a, k, lo, hi, masked = args
                lo, hi = min(lo, hi), max(lo, hi) + 1
                mask = None
                if masked:
                    mask = (np.arange(hi - lo) % 2 == 0)
                region = prepared[(lo, hi)] if hi < 8 else (slice(lo, hi),)
                getattr(det, kind)(pick(actors, a), KEYS[k], region, site, mask=mask)
            elif kind in ("read_release", "write_release"):
                a, k, lo, hi = args
                lo, hi = min(lo, hi), max(lo, hi) + 1
                region = prepared[(lo, hi)] if hi < 8 else (slice(lo, hi),)
                # (a DMA forked from the actor, as a simulator makes one)
                dma = det.new_actor(f"DMA {len(actors)} ({tag})", pick(actors, a))
                actors.append(dma)
                clocks.append(getattr(det, kind)(dma, KEYS[k], region, site))
            elif kind in ("release", "finish_release"):
                clocks.append(getattr(det, kind)(pick(actors, args[0])))
            elif kind == "finish":
                det.finish(pick(actors, args[0]))
            elif kind == "acquire" and clocks:
                det.acquire(pick(actors, args[0]), pick(clocks, args[1]))
            elif kind == "acquire_all" and clocks:
                det.acquire_all(pick(actors, args[0]), [pick(clocks, c) for c in args[1]])
            elif kind == "join":
                det.join(pick(actors, args[0]), pick(actors, args[1]))
            elif kind == "barrier":
                det.barrier([pick(actors, a) for a in args[0]])
            elif kind == "free":  # and registered again (a new buffer under the key)
                det.free_buffer(KEYS[args[0]])
                det.register_buffer(KEYS[args[0]], SHAPE, f"{KEYS[args[0]]}' ({tag})")
        except Exception as e:  # noqa: BLE001 - compared, type and message
            error = (i, type(e).__name__, str(e))
            break
    return {
        "error": error,
        "reports": [(repr(r), str(r)) for r in det.reports],
        "slots": det.num_slots,
        "live": det.live_records(),
    }


index = st.integers(0, 7)
_access = st.tuples(st.sampled_from(["read", "write"]), index, st.integers(0, 2),
                    st.integers(0, 7), st.integers(0, 7), st.booleans())
_dma_access = st.tuples(st.sampled_from(["read_release", "write_release"]), index,
                        st.integers(0, 2), st.integers(0, 7), st.integers(0, 7))
ops_strategy = st.lists(
    st.one_of(
        _access, _access, _access, _dma_access, _dma_access,  # (weights)
        st.tuples(st.just("new"), st.one_of(st.none(), index)),
        st.tuples(st.sampled_from(["release", "finish_release", "finish"]), index),
        st.tuples(st.just("acquire"), index, index),
        st.tuples(st.just("acquire_all"), index, st.lists(index, max_size=3)),
        st.tuples(st.just("join"), index, index),
        st.tuples(st.just("barrier"), st.lists(index, min_size=1, max_size=3)),
        st.tuples(st.just("free"), st.integers(0, 2)),
    ),
    max_size=40,
)


def eager(ops: list[tuple[Any, ...]], tag: str, on_race: str = "collect") -> dict[str, Any]:
    return run(RaceDetector(on_race=on_race), ops, tag)


def memoised(memo: RaceMemo, ops: list[tuple[Any, ...]], tag: str,
             on_race: str = "collect") -> tuple[dict[str, Any], MemoDetector]:
    det = MemoDetector(on_race, memo)
    result = run(det, ops, tag)
    if result["error"] is None:
        det.remember()
    return result, det


@pytest.mark.timeout(300)
@settings(max_examples=300, deadline=None)
@given(first=ops_strategy, second=ops_strategy, cut=st.integers(0, 40),
       on_race=st.sampled_from(["collect", "raise"]))
def test_memo_gives_the_eager_detectors_results_on_random_logs(first, second, cut, on_race):
    memo = RaceMemo()
    # The first launch, nothing remembered: eager.
    result, det = memoised(memo, first, "one", on_race)
    assert result == eager(first, "one", on_race) and not det.matched
    # The same calls again (another launch's names and sites): if the first was clean,
    # nothing is detected, and the answers are the same.
    result, det = memoised(memo, first, "two", on_race)
    assert result == eager(first, "two", on_race)
    remembered = memo.get(None) is not None
    # A launch that shares a prefix with the first, then differs.
    mixed = first[:cut] + second
    result, det = memoised(memo, mixed, "three", on_race)
    assert result == eager(mixed, "three", on_race)
    if remembered and mixed == first:
        assert det.matched


def test_a_launch_matching_the_remembered_one_detects_nothing_and_answers_from_the_memo():
    memo = RaceMemo()
    ops = [("new", 0), ("write_release", 1, 0, 0, 3), ("acquire", 0, 0),
           ("read", 0, 0, 0, 3, False), ("new", 0), ("read_release", 2, 1, 2, 5)]
    first, det = memoised(memo, ops, "one")
    assert not det.matched and first["reports"] == []
    entry = memo.get(None)
    assert entry is not None and entry.log[-1] is END and len(entry.log) == memo.calls() + 1
    second, det = memoised(memo, ops, "two")
    assert det.matched
    assert second == eager(ops, "two")
    det.free_buffers()
    assert det.matched and det.live_records() == 0 and det.num_slots == second["slots"]


def test_a_log_that_diverges_mid_launch_raises_at_the_same_access_as_the_eager_detector():
    memo = RaceMemo()
    safe = [("new", 0), ("write_release", 1, 0, 0, 3), ("acquire", 0, 0),
            ("read", 0, 0, 0, 3, False), ("new", 0), ("read_release", 2, 1, 2, 5),
            ("acquire", 0, 1), ("write", 0, 1, 2, 5, False)]
    memoised(memo, safe, "one", "raise")
    # The same launch, but the core does not wait for the first DMA's write.
    racy = [op for op in safe if op != ("acquire", 0, 0)]
    result, det = memoised(memo, racy, "two", "raise")
    assert not det.matched
    expected = eager(racy, "two", "raise")
    assert result == expected
    index, kind, message = result["error"]
    assert (index, kind) == (2, "DataRaceError")  # the core's read
    assert "two.py:2" in message and "two.py:1" in message  # this launch's sites
    # The racing launch is not remembered: the race-free one still is.
    assert memoised(memo, safe, "three", "raise")[1].matched


def _launch(det: Any, tag: str, wait: bool = True) -> Any:
    """A core, a DMA writing ``a[0:3]``, the core reading it (after waiting: ``wait``)."""
    det.register_buffer("a", SHAPE, f"a ({tag})")
    core = det.new_actor(f"core ({tag})")
    dma = det.new_actor(f"DMA ({tag})", core)
    clock = det.write_release(dma, "a", prepare((slice(0, 3),), SHAPE), site=f"{tag}.py:1")
    if wait:
        det.acquire_all(core, [clock])
    det.read(core, "a", (slice(0, 3),), site=f"{tag}.py:2")
    return det


def test_a_mid_launch_question_only_a_real_detector_answers_switches_to_it():
    memo = RaceMemo()
    _launch(MemoDetector("collect", memo), "one").remember()
    det = MemoDetector("collect", memo)
    det.register_buffer("a", SHAPE, "a (two)")
    core = det.new_actor("core (two)")
    assert det.matched  # a prefix so far
    live, slots = det.live_records(), det.num_slots
    assert not det.matched
    ref = RaceDetector("collect")
    ref.register_buffer("a", SHAPE, "a (two)")
    ref.new_actor("core (two)")
    assert (live, slots) == (ref.live_records(), ref.num_slots)
    dma = det.new_actor("DMA (two)", core)
    det.write(dma, "a", (0,), site="two.py:1")
    det.read(core, "a", (0,), site="two.py:2")  # a race, found by the eager detector
    assert len(det.reports) == 1 and "two.py:1" in str(det.reports[0])
    assert det.actor(core).name == "core (two)"


def test_a_launch_that_skips_a_wait_reports_what_the_eager_detector_reports():
    memo = RaceMemo()
    for tag in ("one", "two"):
        det = _launch(MemoDetector("collect", memo), tag)
        det.remember()
    assert det.matched and det.reports == []
    racy = _launch(MemoDetector("collect", memo), "three", wait=False)
    want = _launch(RaceDetector("collect"), "three", wait=False)
    assert not racy.matched
    assert [(repr(r), str(r)) for r in racy.reports] == [(repr(r), str(r)) for r in want.reports]
    assert len(want.reports) == 1


def test_calls_after_free_buffers_replay_the_launch_with_the_free():
    memo = RaceMemo()
    ops = [("new", 0), ("write", 0, 0, 0, 3, False)]
    memoised(memo, ops, "one")
    det = MemoDetector("collect", memo)
    run(det, ops, "two")
    det.free_buffers()
    det.register_buffer("a", SHAPE, "a again")
    det.write(det.new_actor("late"), "a", (0,), site="late.py:1")
    ref = RaceDetector("collect")
    run(ref, ops, "two")
    ref.free_buffers()
    ref.register_buffer("a", SHAPE, "a again")
    ref.write(ref.new_actor("late"), "a", (0,), site="late.py:1")
    assert not det.matched
    assert (det.num_slots, det.live_records()) == (ref.num_slots, ref.live_records())


def test_the_memo_keeps_logs_per_key_up_to_its_bounds():
    memo = RaceMemo(max_keys=2, max_calls=10)
    for key in ("x", "y", "z"):
        det = MemoDetector("collect", memo, key)
        det.register_buffer("a", SHAPE, "a")
        det.write(det.new_actor("core"), "a", (0,), site="k.py:1")
        det.remember()
    assert memo.get("x") is None and memo.get("y") is not None and memo.get("z") is not None
    assert memo.calls() == 2 * 3
    long = MemoDetector("collect", memo, "long")  # 11 calls: not kept
    long.register_buffer("a", SHAPE, "a")
    core = long.new_actor("core")
    for i in range(9):
        long.read(core, "a", (i % 8,), site="k.py:2")
    long.remember()
    assert memo.get("long") is None
    memo.clear()
    assert memo.calls() == 0


def test_without_a_memo_every_call_is_eager_and_nothing_is_kept():
    det = MemoDetector("collect")
    assert not det.matched
    det.register_buffer("a", SHAPE, "a")
    det.write(det.new_actor("core"), "a", (0,), site="k.py:1")
    det.remember()
    assert det.live_records() == 1


def test_log_entries_compare_exactly():
    a, b = prepare((slice(0, 2),), SHAPE), prepare((slice(0, 2),), SHAPE)
    assert a == b and a is not b and hash(a) == hash(b)
    assert a != prepare((slice(0, 2),), (9,))
    typed = PreparedAccess((np.int64(1),), SHAPE, ((1, 2),), 1)
    assert typed != PreparedAccess((1,), SHAPE, ((1, 2),), 1)  # a report's repr differs
    assert Opaque([1]) != Opaque([1])  # a list region or a non-boolean mask never matches
    assert END != END


def test_an_opaque_region_never_matches_but_is_detected_as_ever():
    memo = RaceMemo()
    for tag in ("one", "two"):
        det = MemoDetector("collect", memo)
        det.register_buffer("a", SHAPE, "a")
        core = det.new_actor("core")
        det.write(core, "a", (np.int64(1),), site=f"{tag}.py:1")
        det.remember()
        assert not det.matched and det.live_records() == 1


def _warned_at(det: Any, racy: bool) -> list[tuple[str, int]]:
    """Two cores write one region, synced or not; where each RaceWarning points."""
    det.register_buffer("a", SHAPE, "a")
    one, two = det.new_actor("core 0"), det.new_actor("core 1")
    region = prepare((slice(0, 4),), SHAPE)
    with pytest.warns() if racy else contextlib.nullcontext() as caught:
        det.write(one, "a", region, "k.py:1")
        if not racy:
            det.acquire(two, det.release(one))
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        det.write(two, "a", region, "k.py:2")
    return [(w.filename, w.lineno) for w in caught or []] + [("line", line)]


def test_a_race_warning_points_at_the_detectors_caller_with_or_without_the_memo():
    memo = RaceMemo()
    det = MemoDetector("warn", memo)
    _warned_at(det, racy=False)
    det.remember()
    eager_warnings = _warned_at(RaceDetector(on_race="warn"), racy=True)
    memo_warnings = _warned_at(MemoDetector("warn", memo), racy=True)  # diverges: replays
    (where, line), = [w for w in eager_warnings if w[0] == "line"]
    assert eager_warnings == memo_warnings == [(__file__, line), ("line", line)]
