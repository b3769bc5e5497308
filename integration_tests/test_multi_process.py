"""A launch split over the processes of a ``jax.distributed`` run (``multi_process``).

Each test starts P worker processes (``_multi_process_worker.py``) with a local
coordinator on a free loopback port, D/P CPU devices each, and compares what they
return with the one-process run of the same kernels on D devices: bit for bit for the
collectives of examples/collectives.py and jax's shipped all-gather; a deadlock across
processes is a ``DeadlockError`` on every process naming every core; a killed process
is a ``PeerProcessError`` on the others within seconds; a launch only some processes
reach is a ``RendezvousTimeoutError``. Every process is killed in a ``finally``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.serial  # processes with heartbeats and deadlines: not beside a parallel run

WORKER = os.path.join(os.path.dirname(__file__), "_multi_process_worker.py")
COLLECTIVES = ("right_permute", "all_gather", "all_reduce", "reduce_scatter", "jax_all_gather")


def _collectives():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "examples"))
    import collectives

    return collectives


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(
    scenario: str,
    processes: int,
    devices: int,
    out_dir: str,
    timeout: float,
    expect_killed: tuple[int, ...] = (),
    may_die: tuple[int, ...] = (),
) -> list[dict | None]:
    """Start the workers, wait for all (at most ``timeout`` s in all), return each
    one's result (None for a process in ``expect_killed``, or in ``may_die`` and dead)."""
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    env.pop("XLA_FLAGS", None)
    procs = []
    try:
        for p in range(processes):
            log = open(os.path.join(out_dir, f"{p}.log"), "w")  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        WORKER,
                        scenario,
                        str(p),
                        str(processes),
                        str(port),
                        str(devices),
                        out_dir,
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        for proc in procs:
            proc.wait(timeout=timeout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results: list[dict | None] = []
    for p in range(processes):
        path = os.path.join(out_dir, f"{p}.json")
        if p in expect_killed:
            assert not os.path.exists(path)
            results.append(None)
            continue
        if not os.path.exists(path) and p in may_die:
            results.append(None)
            continue
        if not os.path.exists(path):
            with open(os.path.join(out_dir, f"{p}.log")) as f:
                pytest.fail(f"process {p} wrote no result; its log:\n{f.read()[-3000:]}")
        with open(path) as f:
            results.append(json.load(f))
    return results


def _assembled(results: list[dict | None], name: str) -> np.ndarray:
    shards = []
    for r in results:
        assert r is not None
        assert name not in r["errors"], r["errors"].get(name)
        shards += [(first, np.load(path)) for first, path in r["outputs"][name]]
    return np.concatenate([a for _, a in sorted(shards, key=lambda s: s[0])])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The one-process run of the collectives on 8 and 16 devices."""
    out = {}
    for devices in (8, 16):
        d = str(tmp_path_factory.mktemp(f"one{devices}"))
        results = _run("collectives", 1, devices, d, timeout=240)
        out[devices] = {name: _assembled(results, name) for name in COLLECTIVES}
    return out


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("processes", "devices"), [(2, 8), (4, 16)])
def test_collectives_equal_one_process_run(reference, tmp_path, processes, devices):
    results = _run("collectives", processes, devices, str(tmp_path), timeout=420)
    for name in COLLECTIVES:
        got = _assembled(results, name)
        want = reference[devices][name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), name


@pytest.mark.timeout(400)
def test_remote_reads_and_adds_equal_one_process_run(tmp_path):
    """DMAs reading another process's memory and adding into it, 2 and 4 processes,
    byte for byte against one process (race detection on, no report)."""
    runs = {}
    for processes in (1, 2, 4):
        out = tmp_path / str(processes)
        out.mkdir()
        results = _run("remote_reads", processes, 8, str(out), timeout=150)
        runs[processes] = {n: _assembled(results, n) for n in ("out", "acc", "fwd")}
    x = np.arange(8 * 256, dtype=np.float32).reshape(8, 16, 16) / 7
    np.testing.assert_array_equal(runs[1]["out"], np.roll(x, -1, axis=0))
    acc = np.stack([np.full((16, 16), 0.1 * (d + 1), np.float32) for d in range(8)])
    np.testing.assert_array_equal(runs[1]["acc"], acc + np.roll(x, 1, axis=0))
    np.testing.assert_array_equal(runs[1]["fwd"][:, 8:], np.roll(x, -1, axis=0)[:, :8])
    for processes in (2, 4):
        for name, want in runs[1].items():
            got = runs[processes][name]
            assert got.view(np.uint8).tobytes() == want.view(np.uint8).tobytes(), (processes, name)


def _error(result, name, kind):
    """The message of launch ``name``'s error in one process's ``result``, which must be
    a ``kind``."""
    assert result is not None
    got, message = result["errors"][name]
    assert got == kind, (got, message)
    return message


@pytest.mark.timeout(300)
def test_dma_order_trials_across_processes(tmp_path):
    """Each trial is a launch of every process; a difference any process finds is an
    error on every process."""
    results = _run("order_trials", 2, 4, str(tmp_path), timeout=200)
    got = _assembled(results, "all_gather")
    want = np.asarray(_collectives().reference("all_gather", _collectives().inputs("all_gather", 4), 4))
    assert np.array_equal(got, want)
    for r in results:
        message = _error(r, "order", "DmaOrderDependenceError")
        assert "the result depends on the order in which DMAs complete" in message


@pytest.mark.timeout(300)
@pytest.mark.parametrize("processes", [2, 4])
def test_deadlock_across_processes_is_reported_on_every_process(tmp_path, processes):
    results = _run("deadlock", processes, 4, str(tmp_path), timeout=200)
    messages = []
    for r in results:
        messages.append(_error(r, "deadlock", "DeadlockError"))
    assert f"across {processes} processes" in messages[0]
    per = 4 // processes
    for d in range(4):
        assert f"device {d} core 0 (process {d // per}) waits on semaphore" in messages[0]
        assert "for 2, count 1" in messages[0]
    # the same report on every process
    for message in messages[1:]:
        assert messages[0].split("[palladium")[0] == message.split("[palladium")[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("processes", "devices"), [(2, 8), (4, 8)])
def test_killed_process_is_an_error_on_the_others_within_seconds(tmp_path, processes, devices):
    results = _run("killed", processes, devices, str(tmp_path), timeout=200, expect_killed=(1,))
    for p, r in enumerate(results):
        if p == 1:
            continue
        assert r is not None
        assert "warm_up" in r["outputs"]
        message = _error(r, "killed", "PeerProcessError")
        assert f"process 1 of {processes} stopped responding" in message
        assert r["seconds"]["killed"] < 10.0


@pytest.mark.timeout(300)
def test_killed_coordinator_ends_the_other_processes_within_seconds(tmp_path):
    """Process 0 hosts jax's coordination service: when it dies, jax's own client ends
    the others (a fatal error of jax, not catchable in Python); they never hang."""
    results = _run("coordinator_killed", 2, 8, str(tmp_path), timeout=150,
                   expect_killed=(0,), may_die=(1,))
    killed_at = float((tmp_path / "killed_at").read_text())
    if results[1] is None:  # jax's client terminated it
        log = (tmp_path / "1.log").read_text()
        assert "Terminating process because the JAX distributed service detected" in log
        assert os.path.getmtime(tmp_path / "1.log") - killed_at < 15.0
    else:  # (a jax that lets it live: palladium's error then)
        _error(results[1], "killed", "PeerProcessError")
        assert results[1]["ended"] < 15.0


@pytest.mark.timeout(300)
def test_launch_reached_by_some_processes_only_is_an_error(tmp_path):
    results = _run("partial", 2, 4, str(tmp_path), timeout=200)
    message = _error(results[0], "partial", "RendezvousTimeoutError")
    assert "processes [1] never reached this launch" in message


@pytest.mark.timeout(300)
@pytest.mark.parametrize("processes", [2, 4])
def test_race_across_processes_is_found_where_the_remote_write_lands(tmp_path, processes):
    results = _run("race", processes, 4, str(tmp_path), timeout=200)
    per = 4 // processes
    for p, r in enumerate(results):
        assert r is not None
        assert not r["errors"]
        first, second, *clean = r["races"]
        assert first == second  # the same reports on every run
        assert clean == [[], [], []]  # race-free collectives: no false report
        assert len(first) == per  # one race on each of its devices
        for d in range(p * per, (p + 1) * per):
            # device d's output: written by its own local DMA and by device d-1's remote one
            [report] = [t for t in first if f"data race on 'o_ref (HBM, device {d})'" in t]
            sender = (d - 1) % 4
            if sender // per != p:  # the remote DMA comes from another process
                assert f"write by 'x_ref->o_ref (process {sender // per})'" in report
                assert f"device {sender} core 0 (_multi_process_worker.py:" in report


def _scan_reference(x: np.ndarray) -> np.ndarray:
    h, out = np.zeros(x.shape[1]), np.empty_like(x)
    for t in range(x.shape[0]):
        h = 0.5 * h + np.tanh(np.float64(x[t]))
        out[t] = h
    return out


@pytest.mark.timeout(300)
def test_a_second_run_with_a_warm_disk_cache_runs_on_every_process(tmp_path, monkeypatch):
    """Issue 42 item 8: executables from the disk cache were loaded onto
    ``jax.devices("cpu")[0]`` (process 0's device), so every process but 0 failed in
    the second run of a program. They load onto the process's own device."""
    monkeypatch.setenv("PALLADIUM_CACHE_DIR", str(tmp_path / "cache"))
    x = np.linspace(-2, 2, 8 * 64 * 128, dtype=np.float32).reshape(8 * 64, 128)
    runs = []
    for run in ("cold", "warm"):
        (tmp_path / run).mkdir()
        runs.append(_run("warm_cache", 2, 8, str(tmp_path / run), timeout=200))
    (cold_0, cold_1), (warm_0, warm_1) = runs
    assert [r["compiled"] for r in (cold_0, cold_1, warm_0, warm_1)] == [1, 1, 0, 0]
    for results in runs:
        for r in results:
            assert not r["errors"], r["errors"]
        ((_, path),) = results[1]["outputs"]["local"]
        np.testing.assert_allclose(np.load(path), _scan_reference(x[:64]), rtol=1e-5,
                                   atol=1e-5)
        per_device = [_scan_reference(part) for part in np.split(x, 8)]
        np.testing.assert_allclose(_assembled(results, "split"), np.concatenate(per_device),
                                   rtol=1e-5, atol=1e-5)
    for name in ("local", "split"):
        np.testing.assert_array_equal(_assembled(runs[0], name), _assembled(runs[1], name))


@pytest.mark.timeout(200)
def test_a_process_that_dies_before_its_first_launch_is_noticed_within_seconds(tmp_path):
    """Issue 42 item 12: it was noticed only after rendezvous_timeout (30 s here, 120 s
    by default): its heartbeat runs from palladium's import on."""
    results = _run("dies_early", 2, 4, str(tmp_path), timeout=150, expect_killed=(1,))
    message = _error(results[0], "first", "PeerProcessError")
    assert "process 1 of 2 stopped responding (no heartbeat for" in message
    assert "it died or was killed while process 0 waited for it to reach this launch" in message
    assert results[0]["seconds"]["first"] < 10.0


@pytest.mark.timeout(200)
def test_processes_launching_other_seeds_or_kernels_is_a_named_error(tmp_path):
    """Issue 42 item 12: another random_seed or another kernel of the same name ran
    (silently, or into a DeadlockError), a kernel of another name was a
    RendezvousTimeoutError after the timeout; each is a ProcessMismatchError on every
    process naming what each launches."""
    results = _run("mismatch", 2, 4, str(tmp_path), timeout=150)
    advice = ("Every process of a jax.distributed run must run the same kernels, on "
              "operands of the same types, with the same InterpretParams(random_seed=...), "
              "in the same order.")
    for p, r in enumerate(results):
        assert r is not None
        assert "agreed" in r["outputs"]
        seed = _error(r, "seed", "ProcessMismatchError")
        assert seed.startswith("kernel 'kernel' on 4 devices over 2 processes: the processes "
                               f"launch different kernels: process {p} launches kernel "
                               "'kernel' (call key ")
        assert f"with random_seed={p}, process {1 - p} of 2 waits here with kernel " in seed
        assert seed.endswith(f"with random_seed={1 - p}. {advice}")
        same_name = _error(r, "same_name", "ProcessMismatchError")
        keys = [part.split(")")[0] for part in same_name.split("(call key ")[1:]]
        assert len(keys) == 2 and keys[0] != keys[1]
        assert same_name.endswith(advice)
        other = _error(r, "other_name", "ProcessMismatchError")
        mine, theirs = ("kernel", "_scan_kernel") if p == 0 else ("_scan_kernel", "kernel")
        assert f"process {p} launches kernel '{mine}' (call key " in other
        assert f"process {1 - p} of 2 waits at another launch with kernel '{theirs}' (call " \
               "key " in other
        assert r["seconds"]["other_name"] < 15.0
