"""A simulation split over processes (``partition``), here over threads of one process
with an in-memory transport: each "process" runs a ``Simulation`` of all devices that
runs the cores of its own devices only; DMAs, signals and the barrier that cross
processes are messages, applied in lock-step rounds."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from palladium.shared_memory import (
    DeadlockError,
    MemorySpace,
    Partition,
    PeerProcessError,
    SemaphoreKind,
    Simulation,
)

DEVICES = 4


class Hub:
    """Where the in-memory transports of one split run meet."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self.cond = threading.Condition()
        self.posts: dict[tuple[int, int], bytes] = {}
        self.failed: dict[int, str] = {}


class ThreadTransport:
    def __init__(self, hub: Hub, process: int) -> None:
        self.hub = hub
        self.process = process
        self.num_processes = hub.processes
        self.round = 0

    def exchange(self, payload: bytes) -> list[bytes]:
        hub, k = self.hub, self.round
        self.round += 1
        with hub.cond:
            hub.posts[(k, self.process)] = payload
            hub.cond.notify_all()
            while not all((k, q) in hub.posts for q in range(hub.processes)):
                if hub.failed:
                    q, error = next(iter(hub.failed.items()))
                    raise PeerProcessError(f"process {q} failed: {error}")
                if not hub.cond.wait(20):
                    raise PeerProcessError("no round from the others in 20 s")
        return [hub.posts[(k, q)] for q in range(hub.processes)]

    def abort(self, error: str) -> None:
        with self.hub.cond:
            self.hub.failed[self.process] = error
            self.hub.cond.notify_all()


def _ring(sim: Simulation, devices: range, *, signal_only: bool = False):
    """Every device's HBM block is DMAed into the next device's output (allocated in
    the same order on every process); bodies for ``devices``."""
    xs = [
        sim.allocate(
            MemorySpace.HBM, d, 0, name="x", value=np.arange(8.0, dtype=np.float32) + 10 * d
        )
        for d in range(DEVICES)
    ]
    outs = [
        sim.allocate(MemorySpace.HBM, d, 0, name="o", shape=(8,), dtype=np.float32)
        for d in range(DEVICES)
    ]
    sems = [
        sim.allocate_semaphores(d, 0, kind=SemaphoreKind.DMA, name="s", shape=(2,))
        for d in range(DEVICES)
    ]

    def body(d: int):
        def run() -> None:
            core, right = (d, 0), ((d + 1) % DEVICES, 0)
            sim.barrier(core)
            sim.dma_start(
                xs[d],
                None,
                outs[right[0]],
                None,
                core=core,
                dst_core=right,
                dst_sem=int(sems[d][1]),
                src_sem=int(sems[d][0]),
            )
            sim.dma_wait(int(sems[d][0]), 32, core=core)
            sim.dma_wait(int(sems[d][1]), 32, core=core)

        return run

    return outs, {(d, 0): body(d) for d in devices}


def _split(processes: int, make, **options):
    """Run ``make(sim, devices) -> (outs, bodies)`` on ``processes`` threads, each a
    process of the split; each one's (outputs of its devices, error, sim)."""
    hub = Hub(processes)
    per = DEVICES // processes
    results: list = [None] * processes

    def process(p: int) -> None:
        devices = range(p * per, (p + 1) * per)
        sim = Simulation(
            DEVICES, 1, partition=Partition(frozenset(devices), ThreadTransport(hub, p)), **options
        )
        outs, bodies = make(sim, devices)
        try:
            sim.run(bodies)
        except Exception as e:  # noqa: BLE001 - the test looks at it
            results[p] = (None, e, sim)
            return
        results[p] = ({d: sim.value(outs[d]).copy() for d in devices}, None, sim)

    threads = [threading.Thread(target=process, args=(p,)) for p in range(processes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r is not None for r in results)
    return results


@pytest.mark.timeout(60)
@pytest.mark.parametrize("processes", [2, 4])
def test_ring_over_processes_equals_one_process(processes):
    one = Simulation(DEVICES, 1, seed=3)
    outs, bodies = _ring(one, range(DEVICES))
    one.run(bodies)
    want = {d: one.value(outs[d]) for d in range(DEVICES)}
    for d in range(DEVICES):
        np.testing.assert_array_equal(want[d], np.arange(8.0) + 10 * ((d - 1) % DEVICES))
    runs = [_split(processes, _ring, seed=3) for _ in range(2)]
    for results in runs:
        for values, error, sim in results:
            assert error is None
            for d, value in values.items():
                assert value.tobytes() == want[d].tobytes()
            assert sim.rounds is not None and sim.rounds.rounds >= 2
    # deterministic: the same schedule on every run
    assert [r[2].schedule for r in runs[0]] == [r[2].schedule for r in runs[1]]


def _stuck(sim: Simulation, devices: range):
    """Each device signals its right neighbour once and waits for 2: all block."""
    sems = [
        sim.allocate_semaphores(d, 0, kind=SemaphoreKind.REGULAR, name="s") for d in range(DEVICES)
    ]

    def body(d: int):
        def run() -> None:
            right = ((d + 1) % DEVICES, 0)
            sim.semaphore_signal(int(sems[d]), 1, core=(d, 0), target=right)
            sim.semaphore_wait(int(sems[d]), 2, core=(d, 0))

        return run

    return [], {(d, 0): body(d) for d in devices}


@pytest.mark.timeout(60)
def test_deadlock_over_processes_names_every_core_on_every_process():
    results = _split(2, _stuck)
    messages = []
    for _, error, _ in results:
        assert isinstance(error, DeadlockError)
        messages.append(str(error))
    assert messages[0] == messages[1]
    assert messages[0].startswith(
        "deadlock: every core is blocked and no DMA can make progress (across 2 processes)."
    )
    for d in range(DEVICES):
        assert (
            f"device {d} core 0 (process {d // 2}) waits on semaphore 's' (id 1) for 2, count 1"
        ) in messages[0]


def _failing(sim: Simulation, devices: range):
    outs, bodies = _ring(sim, devices)
    if 2 in devices:

        def fail() -> None:
            raise ValueError("device 2 broke")

        bodies[(2, 0)] = fail
    return outs, bodies


@pytest.mark.timeout(60)
def test_a_failing_process_is_an_error_on_the_others():
    (_, error0, _), (_, error1, _) = _split(2, _failing)
    assert isinstance(error1, ValueError)
    assert isinstance(error0, PeerProcessError)
    assert "process 1 failed: ValueError: device 2 broke" in str(error0)


def _racy(sim: Simulation, devices: range):
    """Device d DMAs into device d+1's output while d+1 stores into it, unordered."""
    outs, _ = _ring(sim, range(0))
    xs = [
        sim.allocate(MemorySpace.HBM, d, 0, name="x", value=np.ones(8, np.float32))
        for d in range(DEVICES)
    ]
    sems = [
        sim.allocate_semaphores(d, 0, kind=SemaphoreKind.DMA, name="s", shape=(2,))
        for d in range(DEVICES)
    ]

    def body(d: int):
        def run() -> None:
            core, right = (d, 0), ((d + 1) % DEVICES, 0)
            sim.barrier(core)
            sim.dma_start(
                xs[d],
                None,
                outs[right[0]],
                None,
                core=core,
                dst_core=right,
                dst_sem=int(sems[d][1]),
                src_sem=int(sems[d][0]),
            )
            sim.write(outs[d], None, np.zeros(8, np.float32), core=core)
            sim.dma_wait(int(sems[d][0]), 32, core=core)
            sim.dma_wait(int(sems[d][1]), 32, core=core)

        return run

    return outs, {(d, 0): body(d) for d in devices}


@pytest.mark.timeout(60)
def test_a_race_across_processes_is_found_where_the_write_lands():
    results = _split(2, _racy, detect_races=True, on_race="collect")
    for p, (_, error, sim) in enumerate(results):
        assert error is None
        reports = [str(r) for r in sim.race_detector.reports]
        remote = [r for r in reports if "(process" in r]
        # device 2p receives from device 2p-1, which the other process simulates
        assert len(remote) == 1, reports
        assert f"data race on 'o (HBM, device {2 * p})'" in remote[0]
        assert f"DMA #0 x->o (process {1 - p})" in remote[0]


@pytest.mark.timeout(60)
def test_race_free_ring_over_processes_reports_nothing():
    results = _split(2, _ring, detect_races=True, on_race="raise")
    for _, error, sim in results:
        assert error is None and not sim.race_detector.reports


def _fetch_and_add(sim: Simulation, devices: range):
    """Remote DMAs of every kind: device d reads device d+1's ``x`` into its ``out``,
    adds its ``x`` into device d+1's ``acc``, and copies part of device d+2's ``x``
    into device d+1's ``fwd`` (read and write both remote). Race-free."""
    xs = [
        sim.allocate(MemorySpace.HBM, d, 0, name="x", value=np.arange(8.0, dtype=np.float32) / 3 + d)
        for d in range(DEVICES)
    ]
    outs = [sim.allocate(MemorySpace.HBM, d, 0, name="out", shape=(8,), dtype=np.float32)
            for d in range(DEVICES)]
    accs = [
        sim.allocate(MemorySpace.HBM, d, 0, name="acc", value=np.full(8, 0.1 * (d + 1), np.float32))
        for d in range(DEVICES)
    ]
    fwds = [sim.allocate(MemorySpace.HBM, d, 0, name="fwd", shape=(8,), dtype=np.float32)
            for d in range(DEVICES)]
    sems = [sim.allocate_semaphores(d, 0, kind=SemaphoreKind.DMA, name="s", shape=(5,))
            for d in range(DEVICES)]

    def body(d: int):
        def run() -> None:
            core = (d, 0)
            right, right2 = (d + 1) % DEVICES, (d + 2) % DEVICES
            s = [int(i) for i in sems[d]]
            sim.barrier(core)
            sim.dma_start(xs[right], None, outs[d], None, core=core, dst_sem=s[0])
            sim.dma_start(xs[d], None, accs[right], None, core=core, dst_core=(right, 0),
                          dst_sem=s[1], src_sem=s[2], add=True)
            sim.dma_start(xs[right2], (slice(0, 4),), fwds[right], (slice(2, 6),), core=core,
                          dst_core=(right, 0), dst_sem=s[3], src_sem=s[4])
            sim.dma_wait(s[0], 32, core=core)
            sim.dma_wait(s[2], 32, core=core)
            sim.dma_wait(s[1], 32, core=core)
            sim.dma_wait(s[4], 16, core=core)
            sim.dma_wait(s[3], 16, core=core)

        return run

    return {"out": outs, "acc": accs, "fwd": fwds}, {(d, 0): body(d) for d in devices}


def _fetch_and_add_outs(sim: Simulation, devices: range):
    bufs, bodies = _fetch_and_add(sim, devices)
    return bufs["out"], bodies


@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", [2, 4])
def test_remote_reads_and_adds_over_processes_equal_one_process(processes):
    options = dict(seed=5, uninitialized_reads="warn")
    one = Simulation(DEVICES, 1, **options)
    bufs, bodies = _fetch_and_add(one, range(DEVICES))
    one.run(bodies)
    x = [np.arange(8.0, dtype=np.float32) / 3 + d for d in range(DEVICES)]
    for d in range(DEVICES):
        left = (d - 1) % DEVICES
        np.testing.assert_array_equal(one.value(bufs["out"][d]), x[(d + 1) % DEVICES])
        np.testing.assert_array_equal(
            one.value(bufs["acc"][d]), np.full(8, 0.1 * (d + 1), np.float32) + x[left]
        )
        np.testing.assert_array_equal(one.value(bufs["fwd"][d])[2:6], x[(d + 1) % DEVICES][:4])

    def state(sim: Simulation, d: int) -> list[tuple[bytes, bytes]]:
        out = []
        for name in ("out", "acc", "fwd"):
            buf = sim.buffers.by_key[bufs[name][d].key]
            out.append((sim.value(bufs[name][d]).tobytes(), buf.written.tobytes()))
        return out

    want = {d: state(one, d) for d in range(DEVICES)}
    runs = []
    for _ in range(2):
        results = _split(processes, _fetch_and_add_outs, **options)
        runs.append(results)
        per = DEVICES // processes
        for p, (_, error, sim) in enumerate(results):
            assert error is None, error
            for d in range(p * per, (p + 1) * per):  # (buffer keys: the same everywhere)
                assert state(sim, d) == want[d], d
            assert sim.rounds is not None and sim.rounds.messages_sent > 0
    assert [r[2].schedule for r in runs[0]] == [r[2].schedule for r in runs[1]]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("processes", [2, 4])
def test_remote_reads_and_adds_over_processes_are_race_free(processes):
    results = _split(processes, _fetch_and_add_outs, detect_races=True, on_race="raise")
    for _, error, sim in results:
        assert error is None and not sim.race_detector.reports


def _racy_read(sim: Simulation, devices: range):
    """Device d reads device d+1's ``x`` while d+1 overwrites it, unordered."""
    xs = [sim.allocate(MemorySpace.HBM, d, 0, name="x", value=np.ones(8, np.float32))
          for d in range(DEVICES)]
    outs = [sim.allocate(MemorySpace.HBM, d, 0, name="o", shape=(8,), dtype=np.float32)
            for d in range(DEVICES)]
    sems = [sim.allocate_semaphores(d, 0, kind=SemaphoreKind.DMA, name="s")
            for d in range(DEVICES)]

    def body(d: int):
        def run() -> None:
            core = (d, 0)
            sim.barrier(core)
            sim.dma_start(xs[(d + 1) % DEVICES], None, outs[d], None, core=core, dst_sem=int(sems[d]))
            sim.write(xs[d], None, np.zeros(8, np.float32), core=core)
            sim.dma_wait(int(sems[d]), 32, core=core)

        return run

    return outs, {(d, 0): body(d) for d in devices}


@pytest.mark.timeout(60)
def test_a_race_with_a_remote_read_is_found_where_the_source_is():
    runs = [_split(2, _racy_read, detect_races=True, on_race="collect") for _ in range(2)]
    for results in runs:
        for p, (_, error, sim) in enumerate(results):
            assert error is None
            reports = [str(r) for r in sim.race_detector.reports]
            remote = [r for r in reports if "(process" in r]
            # device 2p's x is read by device 2p-1, which the other process simulates
            assert len(reports) == 2 and len(remote) == 1, reports
            assert f"data race on 'x (HBM, device {2 * p})'" in remote[0]
            assert f"DMA #0 x->o (process {1 - p})" in remote[0]
    assert [[str(r) for r in sim.race_detector.reports] for _, _, sim in runs[0]] == [
        [str(r) for r in sim.race_detector.reports] for _, _, sim in runs[1]
    ]
