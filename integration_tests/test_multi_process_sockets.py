"""The rounds of a split launch over direct TCP connections between the processes
(``multi_process.SocketTransport``, ``peer_links``), and the key-value store's rounds
kept as the fallback (``PALLADIUM_PROCESS_TRANSPORT=kv``).

The workers and their harness are those of ``test_multi_process.py`` (which runs every
scenario there over the connections, the default); here: the connections are made once
and kept across launches, a process killed with a frame half sent or failing on its own
is an error on the others within seconds, and the fallback still works.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_multi_process import _assembled, _collectives, _error, _run

pytestmark = pytest.mark.serial  # processes with heartbeats and deadlines: not beside a parallel run


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("processes", "devices"), [(2, 8), (4, 8)])
def test_connections_are_made_once_and_kept_across_launches(tmp_path, processes, devices):
    results = _run("sockets", processes, devices, str(tmp_path), timeout=300)
    c = _collectives()
    for k, name in enumerate(("all_gather", "right_permute", "all_gather")):
        x = np.asarray(c.inputs(name, devices))
        want = np.asarray(c.reference(name, x, devices))
        np.testing.assert_array_equal(_assembled(results, f"{name}{k}"), want)
    for p, r in enumerate(results):
        assert r is not None
        kinds = {kind for kind, _, _ in r["launches"]}
        assert kinds == {"SocketTransport"}
        assert all(rounds >= 1 for _, rounds, _ in r["launches"])
        first = r["launches"][0][2]
        assert [q for q, _ in first] == [q for q in range(processes) if q != p]
        assert all(ports == first for _, _, ports in r["launches"])  # the same connections
    # both ends of every connection agree: p's (local, peer) port is q's (peer, local)
    ends = {p: dict((q, tuple(ports)) for q, ports in r["launches"][0][2])
            for p, r in enumerate(results)}
    for p in range(processes):
        for q in range(processes):
            if p != q:
                assert ends[p][q] == ends[q][p][::-1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("processes", [2, 4])
def test_a_process_killed_halfway_through_a_frame_is_an_error_on_the_others(tmp_path, processes):
    results = _run("killed_mid_frame", processes, 8, str(tmp_path), timeout=200,
                   expect_killed=(1,))
    for p, r in enumerate(results):
        if p == 1:
            continue
        assert r is not None
        message = _error(r, "killed", "PeerProcessError")
        assert f"process 1 of {processes} stopped responding (" in message
        assert "it died or was killed) while process" in message
        assert "no heartbeat" not in message  # the closed connection said it first
        assert r["seconds"]["killed"] < 10.0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("processes", [2, 4])
def test_a_failing_process_is_an_error_naming_its_error_on_the_others(tmp_path, processes):
    results = _run("failing", processes, 8, str(tmp_path), timeout=200)
    assert _error(results[1], "failed", "RuntimeError") == "injected failure in process 1"
    for p, r in enumerate(results):
        if p == 1:
            continue
        message = _error(r, "failed", "PeerProcessError")
        assert (f"process 1 of {processes} failed in this launch: RuntimeError: injected "
                f"failure in process 1") in message
        assert r["seconds"]["failed"] < 10.0


@pytest.mark.timeout(400)
def test_the_key_value_rounds_remain_as_the_fallback(tmp_path, monkeypatch):
    """``PALLADIUM_PROCESS_TRANSPORT=kv``: the same results, and a killed process found
    by its heartbeat."""
    monkeypatch.setenv("PALLADIUM_PROCESS_TRANSPORT", "kv")
    (tmp_path / "run").mkdir()
    results = _run("sockets", 2, 8, str(tmp_path / "run"), timeout=300)
    c = _collectives()
    x = np.asarray(c.inputs("all_gather", 8))
    np.testing.assert_array_equal(_assembled(results, "all_gather0"),
                                  np.asarray(c.reference("all_gather", x, 8)))
    for r in results:
        assert r is not None
        assert {kind for kind, _, _ in r["launches"]} == {"KvTransport"}
    (tmp_path / "killed").mkdir()
    results = _run("killed", 2, 8, str(tmp_path / "killed"), timeout=200, expect_killed=(1,))
    message = _error(results[0], "killed", "PeerProcessError")
    assert "process 1 of 2 stopped responding (no heartbeat for" in message
