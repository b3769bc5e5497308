"""Whole-buffer accesses (the interpreter's block copies and ``ref[...]``) take an O(1)
path while the buffer is uniform; it must report exactly what the brute-force oracle does,
also when partial accesses break the uniformity and whole ones restore it."""

from hypothesis import given, settings
from hypothesis import strategies as st

from palladium.race_detect import RaceDetector
from palladium.race_detect.oracle import BruteForceDetector

SHAPE = (1, 4, 3)
WHOLE = [None, (), (0,), (0, slice(None)), (-1, slice(0, 4), slice(None, 9, 1))]
PARTIAL = [(0, 1), (0, slice(1, 3), 2), (0, slice(None, None, 2))]


def _program():
    access = st.tuples(
        st.just("access"),
        st.integers(0, 2),
        st.sampled_from(["read", "write"]),
        st.sampled_from(WHOLE * 3 + PARTIAL),
    )
    sync = st.tuples(st.sampled_from(["join", "fork", "finish"]), st.integers(0, 2),
                     st.integers(0, 2), st.just(None))
    return st.lists(st.one_of(access, access, sync), min_size=1, max_size=30)


def _key(report):
    # Which racing element a report names may differ from the oracle's (any element
    # both accesses touch is correct); the racing pairs must be the same.
    f, s = report.first, report.second
    return (f.site, f.actor, f.kind, s.site, s.actor, s.kind)


@settings(max_examples=200, deadline=None)
@given(_program())
def test_whole_buffer_accesses_match_the_oracle(program):
    det, oracle = RaceDetector(on_race="collect"), BruteForceDetector(on_race="collect")
    for d in (det, oracle):
        d.register_buffer("x", SHAPE, "x")
    actors = [(det.new_actor(f"core {i}"), oracle.new_actor(f"core {i}")) for i in range(3)]
    finished: set[int] = set()
    for step, (op, a, b, region) in enumerate(program):
        if op == "access":
            if a in finished:
                continue
            for d, actor in zip((det, oracle), actors[a]):
                getattr(d, b)(actor, "x", region, site=step)
        elif op == "join":
            det.join(actors[a][0], actors[b][0])
            oracle.join(actors[a][1], actors[b][1])
        elif op == "fork" and a not in finished:
            actors[b] = (det.new_actor(f"DMA {step}", actors[a][0]),
                         oracle.new_actor(f"DMA {step}", actors[a][1]))
            finished.discard(b)
        elif op == "finish":
            det.finish(actors[a][0])
            oracle.finish(actors[a][1])
            finished.add(a)
    assert sorted(map(_key, det.reports)) == sorted(map(_key, oracle.reports))


def test_a_uniform_buffer_still_reports_the_racing_element():
    det = RaceDetector(on_race="collect")
    det.register_buffer("x", (2, 3), "x")
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    det.write(a, "x", None, site="w1")
    det.write(a, "x", (slice(0, 2), slice(0, 3)), site="w2")  # still uniform
    det.read(b, "x", None, site="r")
    (report,) = det.reports
    assert (report.first.site, report.second.site, report.element) == ("w2", "r", (0, 0))
