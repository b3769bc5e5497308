"""Access plans (``Simulation.plan``): a region resolved once, passed to reads, writes,
swaps and DMAs instead of the region. The plan carries the race detector's prepared
access (made once, only with races on): the detector receives that one value on every
access through the plan, and the results and race reports are those of passing the
region itself."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from palladium.race_detect import PreparedAccess
from palladium.shared_memory import AccessPlan, MemorySpace, SemaphoreKind, Simulation
from palladium.shared_memory import regions as regions_module

HBM, VMEM = MemorySpace.HBM, MemorySpace.VMEM
SHAPE = (8, 16)
REGIONS = [
    None,
    (slice(0, 4),),
    (slice(4, 8),),
    (slice(0, 8, 2),),
    (3,),
    (slice(2, 6), slice(0, 16, 4)),
    (slice(0, 4), slice(14, 18)),  # tile padding with bounds="padded", else out of bounds
    (slice(6, 10),),  # out of bounds either way
]


def _spy(monkeypatch, det):
    """Record the region argument of every read/write the detector receives."""
    seen = []
    for name in ("read", "write"):
        method = getattr(det, name)

        def spy(actor, key, region=None, site=None, *, mask=None, _method=method, _name=name):
            seen.append((_name, region))
            return _method(actor, key, region, site, mask=mask)

        monkeypatch.setattr(det, name, spy)
    return seen


def _counting_prepare(monkeypatch):
    calls = []
    real = regions_module.prepare
    monkeypatch.setattr(regions_module, "prepare", lambda *a: calls.append(a) or real(*a))
    return calls


def test_the_detector_receives_one_prepared_access_per_plan(monkeypatch):
    sim = Simulation(detect_races=True, on_race="collect")
    x = sim.allocate(VMEM, 0, 0, name="x", value=np.zeros(SHAPE, np.float32))
    calls = _counting_prepare(monkeypatch)
    seen = _spy(monkeypatch, sim.race_detector)
    rows = sim.plan(x, (slice(0, 4),))
    assert isinstance(rows, AccessPlan) and rows.prepared is None and calls == []

    def body():
        for i in range(3):
            sim.write(x, rows, np.full((4, 16), i, np.float32), core=(0, 0))
            np.testing.assert_array_equal(sim.read(x, rows, core=(0, 0)), np.full((4, 16), i))
            sim.swap(x, rows, np.zeros((4, 16), np.float32), core=(0, 0))
        sim.write(x, rows, np.ones((4, 16), np.float32), mask=np.eye(4, 16, dtype=bool),
                  core=(0, 0))

    sim.run({(0, 0): body})
    assert len(calls) == 1  # prepared once, on the first access
    assert [kind for kind, _ in seen] == ["write", "read", "write"] * 3 + ["write"]
    assert all(region is rows.prepared for _, region in seen)
    assert isinstance(rows.prepared, PreparedAccess)
    assert rows.prepared.region == (slice(0, 4, 1), slice(0, 16, 1))
    assert sim.race_detector.reports == []


def _spy_releases(monkeypatch, det):
    """Record the region argument of every ``read_release``/``write_release`` (a DMA's
    access and release in one call) and every plain read/write the detector receives."""
    seen = _spy(monkeypatch, det)
    for name in ("read_release", "write_release"):
        method = getattr(det, name)

        def spy(actor, key, region=None, site=None, *, _method=method, _name=name):
            seen.append((_name, region))
            return _method(actor, key, region, site)

        monkeypatch.setattr(det, name, spy)
    return seen


def test_dmas_hand_the_detector_their_plans_prepared_accesses(monkeypatch):
    sim = Simulation(detect_races=True, on_race="collect", dma_execution_mode="on_wait")
    x = sim.allocate(HBM, 0, 0, name="x", value=np.ones(SHAPE, np.float32))
    v = sim.allocate(VMEM, 0, 0, name="v", shape=SHAPE, dtype=np.float32)
    sem = sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="sem")
    src, dst = sim.plan(x, (slice(4, 8),)), sim.plan(v, (slice(0, 4),))
    seen = _spy_releases(monkeypatch, sim.race_detector)

    def body():
        for _ in range(2):
            sim.dma_start(x, src, v, dst, core=(0, 0), dst_sem=sem)
            sim.dma_wait(sem, 4 * 4 * 16, core=(0, 0))

    sim.run({(0, 0): body})
    # Each phase of a DMA is one call that hands over its plan's prepared access (not a
    # region to prepare again) and releases the DMA's clock.
    assert seen == [("read_release", src.prepared), ("write_release", dst.prepared)] * 2
    assert all(isinstance(region, PreparedAccess) for _, region in seen)
    np.testing.assert_array_equal(sim.value(v)[:4], 1.0)
    assert sim.race_detector.reports == []


def test_without_race_detection_no_prepared_access_is_made(monkeypatch):
    sim = Simulation()
    x = sim.allocate(VMEM, 0, 0, name="x", value=np.arange(128.0, dtype=np.float32).reshape(SHAPE))
    calls = _counting_prepare(monkeypatch)
    plan = sim.plan(x, (slice(2, 6), slice(0, 16, 4)))
    for _ in range(2):
        np.testing.assert_array_equal(sim.read(x, plan, core=(0, 0)),
                                      sim.value(x)[2:6, ::4])
    assert plan.prepared is None and calls == []


def test_a_plan_serves_buffers_of_its_shapes_and_is_resolved_again_for_others():
    sim = Simulation(bounds="padded")
    a = sim.allocate(VMEM, 0, 0, name="a", value=np.arange(128.0, dtype=np.float32).reshape(SHAPE))
    b = sim.allocate(VMEM, 0, 0, name="b", value=-np.arange(128.0, dtype=np.float32).reshape(SHAPE))
    s = sim.allocate(MemorySpace.SMEM, 0, 0, name="s",
                     value=np.arange(128.0, dtype=np.float32).reshape(SHAPE))
    plan = sim.plan(a, (slice(0, 2), slice(14, 18)))  # columns 16, 17 are VMEM tile padding
    assert plan.bound == (8, 128) and not plan.full and not plan.oob
    np.testing.assert_array_equal(sim.read(b, plan, core=(0, 0))[:, :2], -sim.value(a)[:2, 14:])
    assert np.isnan(sim.read(b, plan, core=(0, 0))[:, 2:]).all()
    # SMEM is never padded: the same region is out of bounds there, whatever the plan said.
    with pytest.raises(Exception, match=r"Out-of-bounds read of 's'.*\[0:2, 14:18\]"):
        sim.read(s, plan, core=(0, 0))


@st.composite
def programs(draw):
    ops = []
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["read", "write", "swap", "masked", "dma", "wait"]))
        region = draw(st.integers(0, len(REGIONS) - 1))
        ops.append((kind, draw(st.sampled_from(["x", "v"])), region, draw(st.integers(0, 99))))
    return ops


def _run(program, *, use_plans, bounds, mode):
    sim = Simulation(detect_races=True, on_race="collect", bounds=bounds,
                     out_of_bounds="uninitialized", dma_execution_mode=mode)
    bufs = {"x": sim.allocate(HBM, 0, 0, name="x",
                              value=np.arange(128.0, dtype=np.float32).reshape(SHAPE)),
            "v": sim.allocate(VMEM, 0, 0, name="v", shape=SHAPE, dtype=np.float32)}
    sem = sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="sem")
    plans = {(name, i): sim.plan(buf, r) for name, buf in bufs.items()
             for i, r in enumerate(REGIONS)}
    out = []
    pending = [0]

    def where(name, i):
        return plans[(name, i)] if use_plans else REGIONS[i]

    def step(kind, name, i, seed):
        buf, site = bufs[name], f"kernel.py:{seed}"
        shape = sim.plan(buf, REGIONS[i]).shape
        value = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        if kind == "read":
            out.append(sim.read(buf, where(name, i), core=(0, 0), site=site))
        elif kind == "write":
            sim.write(buf, where(name, i), value, core=(0, 0), site=site)
        elif kind == "swap":
            out.append(sim.swap(buf, where(name, i), value, core=(0, 0), site=site))
        elif kind == "masked":
            mask = np.random.default_rng(seed + 1).random(shape) < 0.5
            sim.write(buf, where(name, i), value, mask=mask, core=(0, 0), site=site)
            out.append(sim.read(buf, where(name, i), mask=~mask, core=(0, 0), site=site))
        elif kind == "dma":
            other = "v" if name == "x" else "x"
            sim.dma_start(buf, where(name, i), bufs[other], where(other, i), core=(0, 0),
                          dst_sem=sem, site=site)
            pending[0] += 4 * int(np.prod(shape))
        elif pending[0]:
            sim.dma_wait(sem, pending[0], core=(0, 0), site=site)
            pending[0] = 0

    def body():
        for op in program:
            try:
                step(*op)
            except Exception as error:  # the same error, at the same point, either way
                out.append((type(error).__name__, str(error)))
        if pending[0]:
            sim.dma_wait(sem, pending[0], core=(0, 0))

    sim.run({(0, 0): body})
    return out, [sim.value(b) for b in bufs.values()], [str(r) for r in sim.race_detector.reports]


def _same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b, equal_nan=True)
    return a == b


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.sampled_from(["logical", "padded"]), st.sampled_from(["eager", "on_wait"]))
def test_plans_give_the_results_errors_and_race_reports_of_regions(program, bounds, mode):
    with_regions = _run(program, use_plans=False, bounds=bounds, mode=mode)
    with_plans = _run(program, use_plans=True, bounds=bounds, mode=mode)
    outs, finals, reports = with_plans
    assert len(outs) == len(with_regions[0])
    assert all(_same(a, b) for a, b in zip(outs, with_regions[0]))
    assert all(_same(a, b) for a, b in zip(finals, with_regions[1]))
    assert reports == with_regions[2]
