"""Race reports: fields, text, and the on_race policies."""

import threading
import warnings

import pytest

from palladium.race_detect import (
    Access,
    DataRaceError,
    RaceDetector,
    RaceReport,
    RaceWarning,
)


class Site:
    """A cheap site object: formatted only when a report is."""

    formatted = 0

    def __init__(self, line, point):
        self.line, self.point = line, point

    def __str__(self):
        Site.formatted += 1
        return f"kernel.py:{self.line}, grid point {self.point}"


def racy(det):
    det.register_buffer(("vmem", 0), (16, 128), "scratch_shapes[2]")
    core = det.new_actor("device 0 core 1")
    dma = det.new_actor("DMA #3 x->scratch_shapes[2]", parent=core)
    det.write(dma, ("vmem", 0), (slice(0, 8), slice(None)), site=Site(12, (0, 0)))
    det.read(core, ("vmem", 0), (slice(4, 12, 2),), site=Site(41, (0, 1)))
    return core, dma


def test_report_fields():
    det = RaceDetector(on_race="collect")
    core, dma = racy(det)
    (report,) = det.reports
    assert isinstance(report, RaceReport)
    first, second = report.first, report.second
    assert isinstance(first, Access)
    assert (first.actor, first.kind, first.buffer) == (
        "DMA #3 x->scratch_shapes[2]",
        "write",
        "scratch_shapes[2]",
    )
    assert (second.actor, second.kind, second.buffer) == (
        "device 0 core 1",
        "read",
        "scratch_shapes[2]",
    )
    assert first.region == (slice(0, 8), slice(None))
    assert second.region == (slice(4, 12, 2), slice(None))  # padded to every dimension
    assert str(first.site) == "kernel.py:12, grid point (0, 0)"
    assert report.element == (4, 0)
    # The DMA saw the core's first epoch; the core has moved on since the fork.
    assert first.clock == (("device 0 core 1", 1), ("DMA #3 x->scratch_shapes[2]", 1))
    assert second.clock == (("device 0 core 1", 2),)


def test_report_text_names_both_accesses():
    det = RaceDetector(on_race="collect")
    racy(det)
    text = str(det.reports[0])
    assert text.startswith("data race on 'scratch_shapes[2]' at element (4, 0): ")
    for part in [
        "write by 'DMA #3 x->scratch_shapes[2]' to scratch_shapes[2][0:8, :] "
        "at kernel.py:12, grid point (0, 0)",
        "read by 'device 0 core 1' of scratch_shapes[2][4:12:2, :] "
        "at kernel.py:41, grid point (0, 1)",
        "not ordered",
    ]:
        assert part in text


def test_sites_are_formatted_only_for_reports():
    det = RaceDetector(on_race="collect")
    det.register_buffer("x", (4,), "x")
    a = det.new_actor("core 0")
    before = Site.formatted
    for i in range(10):
        det.write(a, "x", site=Site(i, (i,)))
    assert Site.formatted == before


def test_raise_policy():
    det = RaceDetector(on_race="raise")
    with pytest.raises(DataRaceError) as info:
        racy(det)
    assert info.value.report is det.reports[0]
    assert str(info.value) == str(det.reports[0])
    assert "device 0 core 1" in str(info.value)


def test_raise_is_the_default():
    with pytest.raises(DataRaceError):
        racy(RaceDetector())


def test_warn_policy():
    det = RaceDetector(on_race="warn")
    with pytest.warns(RaceWarning, match=r"data race on 'scratch_shapes\[2\]'"):
        racy(det)
    assert len(det.reports) == 1


def test_collect_policy_is_silent():
    det = RaceDetector(on_race="collect")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        racy(det)
    assert len(det.reports) == 1


def test_callable_policy_may_call_back_into_the_detector():
    seen = []

    def on_race(report):
        seen.append((report, len(det.reports)))  # the lock is not held here

    det = RaceDetector(on_race=on_race)
    racy(det)
    assert seen == [(det.reports[0], 1)]


def test_unknown_policy():
    with pytest.raises(ValueError, match="on_race='explode'"):
        RaceDetector(on_race="explode")


def test_threads_share_one_detector():
    det = RaceDetector(on_race="collect")
    det.register_buffer("x", (8, 64), "x")
    main = det.new_actor("main")
    cores = [det.new_actor(f"core {i}", parent=main) for i in range(4)]

    def work(i):
        for j in range(200):
            det.write(cores[i], "x", (slice(i, None, 4), slice(j % 64, j % 64 + 1)))
            det.read(cores[i], "x", (slice(i, None, 4),))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert det.reports == []  # disjoint rows: no race, whatever the interleaving
    for c in cores:
        det.finish(c)
        det.join(main, c)
    det.write(main, "x")
    assert det.reports == []
    # Unsynchronised writers of one element race, whichever thread comes first.
    late = [det.new_actor("late 0", parent=main), det.new_actor("late 1", parent=main)]
    threads = [threading.Thread(target=det.write, args=(a, "x", (0, 0))) for a in late]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    (report,) = det.reports
    assert {report.first.actor, report.second.actor} == {"late 0", "late 1"}


def test_data_race_error_is_a_simulation_error_and_a_palladium_error():
    from palladium.race_detect import (
        ConfigError,
        DataRaceError,
        PalladiumError,
        RaceDetectorError,
        SimulationError,
    )

    assert issubclass(DataRaceError, SimulationError)
    for error in (SimulationError, RaceDetectorError, ConfigError):
        assert issubclass(error, PalladiumError)
    assert issubclass(ConfigError, ValueError)
