"""The prepared-access seam: a region prepared once (``RaceDetector.prepare`` or
``race_detect.prepare``) and passed to ``read``/``write`` gives exactly the reports of
passing the region itself, and the detector does no work on it again."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from palladium.race_detect import (
    PreparedAccess,
    RaceDetector,
    RegionError,
    UnknownBufferError,
    prepare,
)
from palladium.race_detect import prepared as prepared_module
from palladium.race_detect.oracle import BruteForceDetector
from palladium.race_detect.regions import normalise, region_shape

SHAPES = {"a": (6,), "b": (3, 4)}


@st.composite
def index(draw, dim):
    if draw(st.booleans()):
        return draw(st.integers(-dim, dim - 1))
    bound = st.one_of(st.none(), st.integers(-dim - 1, dim + 1))
    return slice(draw(bound), draw(bound), draw(st.sampled_from([None, 1, 2, -1])))


@st.composite
def region(draw, shape):
    if draw(st.integers(0, 5)) == 0:
        return None
    return tuple(draw(index(dim)) for dim in shape[: draw(st.integers(0, len(shape)))])


def _detectors():
    dets = {"raw": RaceDetector("collect"), "prepared": RaceDetector("collect"),
            "oracle": BruteForceDetector("collect")}
    for det in dets.values():
        for key, shape in SHAPES.items():
            det.register_buffer(key, shape, f"buf_{key}")
    return dets


def _full_key(report):
    def side(a):
        return (a.actor, a.kind, a.buffer, repr(a.region), a.site, a.clock, a.masked)
    return side(report.first), side(report.second), report.element


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_prepared_accesses_report_exactly_what_raw_regions_do(data):
    dets = _detectors()
    actors = {name: [det.new_actor("core 0"), det.new_actor("core 1")]
              for name, det in dets.items()}
    # A few regions per buffer, each prepared once and reused, as a simulator's plans are.
    regions = {key: data.draw(st.lists(region(shape), min_size=1, max_size=3))
               for key, shape in SHAPES.items()}
    prepared = {key: [dets["prepared"].prepare(key, r) for r in rs] for key, rs in regions.items()}
    for step in range(data.draw(st.integers(1, 25))):
        op = data.draw(st.sampled_from(["read", "write", "write", "join", "fork"]))
        who = data.draw(st.integers(0, len(actors["raw"]) - 1))
        if op == "join":
            other = data.draw(st.integers(0, len(actors["raw"]) - 1))
            for name, det in dets.items():
                det.join(actors[name][who], actors[name][other])
            continue
        if op == "fork":
            for name, det in dets.items():
                actors[name].append(det.new_actor(f"DMA #{step}", parent=actors[name][who]))
            continue
        key = data.draw(st.sampled_from(sorted(SHAPES)))
        pick = data.draw(st.integers(0, len(regions[key]) - 1))
        raw = regions[key][pick]
        mask = None
        if data.draw(st.integers(0, 3)) == 0:
            shape = region_shape(normalise(raw, SHAPES[key], key), SHAPES[key])
            mask = np.array(data.draw(st.lists(st.booleans(), min_size=int(np.prod(shape)),
                                               max_size=int(np.prod(shape)))), bool).reshape(shape)
        for name, det in dets.items():
            arg = raw if name == "raw" else prepared[key][pick]
            getattr(det, op)(actors[name][who], key, arg, site=step, mask=mask)
    got = [_full_key(r) for r in dets["prepared"].reports]
    assert got == [_full_key(r) for r in dets["raw"].reports]
    # The oracle names the same racing pairs (it may pick another element both touch).
    assert sorted(g[:2] for g in got) == sorted(_full_key(r)[:2] for r in dets["oracle"].reports)


def test_a_prepared_access_is_not_prepared_again(monkeypatch):
    det = RaceDetector("collect")
    det.register_buffer("x", (8, 128), "x")
    rows = det.prepare("x", (slice(0, 4),))
    calls = []
    monkeypatch.setattr(prepared_module, "normalise",
                        lambda *a: calls.append(a) or normalise(*a))
    core = det.new_actor("core 0")
    for _ in range(3):
        det.write(core, "x", rows, site="kernel.py:3")
        det.read(core, "x", rows, site="kernel.py:4")
    assert calls == []
    det.read(core, "x", (slice(0, 4),), site="kernel.py:5")  # a raw region: prepared per call
    assert len(calls) == 1 and det.reports == []


def test_prepared_value_and_its_report_region():
    p = prepare((1, slice(None, None, 2)), (3, 4), "b")
    assert isinstance(p, PreparedAccess)
    assert p.shape == (3, 4) and p.region == (1, slice(None, None, 2))
    assert p.box is None and p.size == 0  # strided: no box
    q = prepare(None, (3, 4))
    assert q.box == ((0, 3), (0, 4)) and q.size == 12
    det = RaceDetector("collect")
    det.register_buffer("b", (3, 4), "b")
    core, dma = det.new_actor("core 0"), None
    dma = det.new_actor("DMA #1", parent=core)
    det.write(dma, "b", p, site="copy")
    det.read(core, "b", det.prepare("b", (1,)), site="kernel.py:9")
    (report,) = det.reports
    assert "b[1, ::2]" in str(report) and "b[1, :]" in str(report)
    assert report.element == (1, 0)


def test_prepare_errors_name_the_buffer():
    det = RaceDetector()
    det.register_buffer("x", (4,), "x (VMEM)")
    with pytest.raises(RegionError, match=r"'x \(VMEM\)'.*index 4 is out of bounds"):
        det.prepare("x", (4,))
    with pytest.raises(UnknownBufferError, match="prepare: no buffer with key 'y'"):
        det.prepare("y", None)
    other = prepare(None, (5,))
    with pytest.raises(RegionError, match=r"'x \(VMEM\)' of shape \(4,\).*prepared for another shape"):
        det.read(det.new_actor("core 0"), "x", other)
