"""Accesses of whole buffers and of blocks (the interpreter's block copies and
``ref[...]``) take an O(1) path while the region is a uniform box of the shadow state.
The reports must be exactly the brute-force oracle's, whatever mix of whole-buffer,
block, overlapping, strided and masked accesses splits and merges those boxes."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from palladium.race_detect import RaceDetector
from palladium.race_detect.oracle import BruteForceDetector

SHAPE = (1, 4, 6)
WHOLE = [None, (), (0,), (0, slice(None)), (-1, slice(0, 4), slice(None, 9, 1))]
BLOCKS = [(0, slice(r, r + 2), slice(c, c + 3)) for r in (0, 2) for c in (0, 3)]
OTHER = [
    (0, 1),  # a row
    (0, slice(1, 3), slice(2, 5)),  # straddles four blocks
    (0, slice(None, None, 2)),  # strided
    (0, slice(0, 2), 4),  # a column inside one block
    (0, slice(3, 3)),  # empty
]
MASKED = [(0, slice(0, 2), slice(0, 3))]


def _program():
    access = st.tuples(
        st.just("access"),
        st.integers(0, 2),
        st.sampled_from(["read", "write"]),
        st.sampled_from(WHOLE * 2 + BLOCKS * 3 + OTHER + ["masked"]),
        st.lists(st.booleans(), min_size=6, max_size=6),
    )
    sync = st.tuples(st.sampled_from(["join", "fork", "finish"]), st.integers(0, 2),
                     st.integers(0, 2), st.just(None), st.just(None))
    return st.lists(st.one_of(access, access, sync), min_size=1, max_size=40)


def _key(report):
    # Which racing element a report names may differ from the oracle's (any element
    # both accesses touch is correct); the racing pairs must be the same.
    f, s = report.first, report.second
    return (f.site, f.actor, f.kind, s.site, s.actor, s.kind)


@settings(max_examples=250, deadline=None)
@given(_program())
def test_box_accesses_match_the_oracle(program):
    det, oracle = RaceDetector(on_race="collect"), BruteForceDetector(on_race="collect")
    for d in (det, oracle):
        d.register_buffer("x", SHAPE, "x")
    actors = [(det.new_actor(f"core {i}"), oracle.new_actor(f"core {i}")) for i in range(3)]
    finished: set[int] = set()
    for step, (op, a, b, region, bits) in enumerate(program):
        if op == "access":
            if a in finished:
                continue
            mask = None
            if region == "masked":
                region, mask = MASKED[0], np.array(bits, bool).reshape(2, 3)
            for d, actor in zip((det, oracle), actors[a]):
                getattr(d, b)(actor, "x", region, site=step, mask=mask)
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
    for r in det.reports:  # the element named is inside the buffer
        assert len(r.element) == len(SHAPE)
        assert all(0 <= i < n for i, n in zip(r.element, SHAPE))


def test_a_uniform_buffer_still_reports_the_racing_element():
    det = RaceDetector(on_race="collect")
    det.register_buffer("x", (2, 3), "x")
    a, b = det.new_actor("core 0"), det.new_actor("core 1")
    det.write(a, "x", None, site="w1")
    det.write(a, "x", (slice(0, 2), slice(0, 3)), site="w2")  # still one uniform box
    det.read(b, "x", (1, slice(1, 3)), site="r")  # inside it
    (report,) = det.reports
    assert (report.first.site, report.second.site, report.element) == ("w2", "r", (1, 1))


def test_block_accesses_never_allocate_dense_state():
    det = RaceDetector(on_race="collect")
    det.register_buffer("hbm", (1024, 1024), "hbm")
    core = det.new_actor("core 0")
    for step in range(3):
        for i in range(8):
            for j in range(8):
                block = (slice(128 * i, 128 * i + 128), slice(128 * j, 128 * j + 128))
                det.read(core, "hbm", block, site=step)
    assert det.reports == []
    assert det._buffers["hbm"]._state is None  # O(blocks) memory, not O(elements)


def test_a_block_written_row_by_row_then_read_whole_stays_boxes():
    """Rows written one by one (a recurrent scan's ``o_ref[t] = h``), then the whole
    block read (the copy-out): the read covers the row boxes exactly and runs over them,
    without the dense state; the next step's row writes are exact box hits again. A
    racing whole access still gets the oracle's report."""
    det, oracle = RaceDetector(on_race="collect"), BruteForceDetector(on_race="collect")
    for d in (det, oracle):
        d.register_buffer("o", (4, 8), "o")
    core = (det.new_actor("core 0"), oracle.new_actor("core 0"))
    for step in range(2):
        for row in range(4):
            for d, actor in zip((det, oracle), core):
                d.write(actor, "o", (row, slice(None)), site=f"row {row}")
        copy = (det.new_actor(f"copy-out {step}", core[0]),
                oracle.new_actor(f"copy-out {step}", core[1]))
        for d, actor in zip((det, oracle), copy):
            d.read(actor, "o", None, site="copy-out")
        for d, actor, c in zip((det, oracle), core, copy):
            d.join(actor, c)
    shadow = det._buffers["o"]
    assert shadow._state is None and len(shadow._boxes) == 4
    assert det.reports == [] and oracle.reports == []
    stray = (det.new_actor("stray"), oracle.new_actor("stray"))
    for d, actor in zip((det, oracle), stray):
        d.write(actor, "o", None, site="stray")
    assert sorted(map(_key, det.reports)) == sorted(map(_key, oracle.reports))
    assert det.reports
