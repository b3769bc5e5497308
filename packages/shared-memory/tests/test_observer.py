"""The observer seam: every event a simulation reports, with its data, in order."""

import numpy as np
import pytest

from palladium.shared_memory import (
    BlockCopy,
    MemorySpace,
    Observer,
    ObserverSet,
    SemaphoreKind,
    Simulation,
)

HBM, VMEM = MemorySpace.HBM, MemorySpace.VMEM


class Recorder(Observer):
    """Records every hook call as (hook, args)."""

    def __init__(self):
        self.events = []


def _recording(name):
    def hook(self, *args):
        self.events.append((name, args))

    return hook


_HOOKS = [n for n in vars(Observer) if not n.startswith("_")]
for _name in _HOOKS:  # override every hook (ObserverSet calls only overridden ones)
    setattr(Recorder, _name, _recording(_name))


def _names(rec, *hooks):
    return [(h, a) for h, a in rec.events if h in hooks]


def test_allocation_and_free_report_space_bytes_and_core():
    rec = Recorder()
    sim = Simulation(num_devices=2, cores_per_device=2, observers=[rec])
    v = sim.allocate(VMEM, 1, 1, name="v", shape=(8, 128), dtype=np.float32)
    h = sim.allocate(HBM, 1, 1, name="h", value=np.zeros((4, 4), np.int8))
    sim.incref(v)
    sim.free(v)
    assert _names(rec, "free") == []  # one reference left
    sim.free(v)
    sim.free(h)
    events = _names(rec, "allocate", "free")
    assert [(h, a[0].name, a[0].space, a[1], a[2]) for h, a in events] == [
        ("allocate", "v", VMEM, 4096, (1, 1)),
        ("allocate", "h", HBM, 16, (1, 0)),  # HBM belongs to the device: core 0
        ("free", "v", VMEM, 4096, (1, 1)),
        ("free", "h", HBM, 16, (1, 0)),
    ]


@pytest.mark.parametrize("mode", ["on_wait", "eager"])
@pytest.mark.timeout(30)
def test_dma_start_complete_and_wait_events(mode):
    rec = Recorder()
    sim = Simulation(observers=[rec], dma_execution_mode=mode)
    x = sim.allocate(HBM, 0, 0, name="x", value=np.arange(16.0, dtype=np.float32))
    v = sim.allocate(VMEM, 0, 0, name="v", shape=(8,), dtype=np.float32)
    sem = int(sim.allocate_semaphores(0, 0, kind=SemaphoreKind.DMA, name="sem"))

    def body():
        sim.dma_start(x, (slice(0, 8),), v, None, core=(0, 0), dst_sem=sem, name="x->v")
        sim.dma_wait(sem, 32, core=(0, 0))

    sim.run({(0, 0): body})
    np.testing.assert_array_equal(sim.value(v), np.arange(8.0))
    hooks = [h for h, _ in rec.events if h not in ("allocate", "core_switch")]
    complete_at = 2 if mode == "eager" else 3
    expected = ["run_begin", "dma_start", "semaphore_wait_begin", "semaphore_wait_end",
                "run_end"]
    expected.insert(complete_at, "dma_complete")
    assert hooks == expected
    (start,) = [a[0] for h, a in rec.events if h == "dma_start"]
    (done,) = [a[0] for h, a in rec.events if h == "dma_complete"]
    assert done is start
    assert (start.nbytes, start.src.name, start.dst.name, start.device, start.remote) == (
        32, "x", "v", 0, False)
    assert start.dst_sem.label == "'sem'" and start.dst_sem.kind is SemaphoreKind.DMA
    ((core, info, value),) = [a for h, a in rec.events if h == "semaphore_wait_begin"]
    assert (core, info.key, info.label, value) == ((0, 0), ((0, 0), sem), "'sem'", 32)


@pytest.mark.timeout(30)
def test_remote_dma_names_both_devices():
    rec = Recorder()
    sim = Simulation(num_devices=2, observers=[rec])
    src = [sim.allocate(VMEM, d, 0, name="buf", value=np.full(4, d, np.int32)) for d in (0, 1)]
    dst = [sim.allocate(VMEM, d, 0, name="recv", shape=(4,), dtype=np.int32) for d in (0, 1)]
    sems = [int(sim.allocate_semaphores(d, 0, kind=SemaphoreKind.DMA, name="s")) for d in (0, 1)]

    def body(d):
        def run():
            peer = 1 - d
            sim.dma_start(src[d], None, dst[peer], None, core=(d, 0), dst_sem=sems[d],
                          dst_core=(peer, 0))
            sim.dma_wait(sems[d], 16, core=(d, 0))
        return run

    sim.run({(0, 0): body(0), (1, 0): body(1)})
    np.testing.assert_array_equal(sim.value(dst[0]), [1] * 4)
    starts = sorted((a[0] for h, a in rec.events if h == "dma_start"), key=lambda e: e.core)
    assert [(e.core, e.dst_core, e.remote, e.src.device, e.dst.device) for e in starts] == [
        ((0, 0), (1, 0), True, 0, 1), ((1, 0), (0, 0), True, 1, 0)]
    switches = [a for h, a in rec.events if h == "core_switch"]
    assert switches and switches[0][0] is None  # the first hand-off comes from nobody
    assert {c for _, c in switches} == {(0, 0), (1, 0)}
    assert [c for _, c in switches] == sim.schedule


@pytest.mark.timeout(30)
def test_signals_and_barriers():
    rec = Recorder()
    sim = Simulation(cores_per_device=2, observers=[rec])
    sem = int(sim.allocate_semaphores(0, 1, kind=SemaphoreKind.REGULAR, name="flag"))
    sim.allocate_semaphores(0, 0, kind=SemaphoreKind.REGULAR, name="flag")

    def producer():
        sim.barrier((0, 0))
        sim.semaphore_signal(sem, 3, core=(0, 0), target=(0, 1))

    def consumer():
        sim.barrier((0, 1))
        sim.semaphore_wait(sem, 3, core=(0, 1))

    sim.run({(0, 0): producer, (0, 1): consumer})
    ((core, info, inc),) = [a for h, a in rec.events if h == "semaphore_signal"]
    assert (core, info.core, info.label, inc) == ((0, 0), (0, 1), "'flag'", 3)
    barrier = [(h, a[0]) for h, a in rec.events if h.startswith("barrier")]
    assert sorted(barrier) == sorted([("barrier_begin", (0, 0)), ("barrier_begin", (0, 1)),
                                      ("barrier_end", (0, 0)), ("barrier_end", (0, 1))])
    # nobody leaves before everybody arrived
    assert [h for h, _ in barrier][:2] == ["barrier_begin", "barrier_begin"]


def test_client_events_go_through_the_same_set():
    rec = Recorder()
    sim = Simulation()
    assert sim.observers is None  # nothing registered: hook sites see None
    sim.add_observer(rec)
    obs = sim.observers
    assert obs is not None
    copy = BlockCopy((0, 0), "x_ref", "in", (1, 0), 4096, 1, (1,))
    obs.grid_step_begin((0, 0), 1, (1,))
    obs.block_copy(copy)
    obs.compute((0, 0), "an equation")
    obs.grid_step_end((0, 0), 1, (1,))
    assert rec.events == [("grid_step_begin", ((0, 0), 1, (1,))), ("block_copy", (copy,)),
                          ("compute", ((0, 0), "an equation")),
                          ("grid_step_end", ((0, 0), 1, (1,)))]
    sim.remove_observer(rec)
    assert sim.observers is None


def test_only_overridden_hooks_are_called():
    class Allocs(Observer):
        def __init__(self):
            self.n = 0

        def allocate(self, buf, nbytes, core):
            self.n += 1

    a, b = Allocs(), Allocs()
    obs = ObserverSet([a, b])
    assert obs.wants("allocate") and not obs.wants("dma_start")
    assert "dma_start" not in vars(obs)  # the no-op method, not a fan-out
    obs.allocate(None, 0, (0, 0))
    assert (a.n, b.n) == (1, 1)
    obs.remove(a)
    obs.allocate(None, 0, (0, 0))
    assert (a.n, b.n) == (1, 2)
    with pytest.raises(TypeError, match="must subclass"):
        obs.add(object())
