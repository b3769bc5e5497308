"""The timeline of a ring all-gather on N simulated chips (examples/collectives.py): one
launch record for all devices, a core track and a DMA engine track per device, and a
time that grows with the device count as the ICI link bandwidth says."""

import collectives
import numpy as np
import pytest
from collectives import all_gather, reference, run

import palladium.interpret as pi
from palladium.interpret import InterpretParams
from palladium.interpret.perf import chip_model

V5E = chip_model("v5e")
ROWS, COLS = 64, 1024  # one device's shard: 256 KiB of f32


def _gather(n):
    x = collectives.iota((n * ROWS, COLS)) % 251
    with pi.timeline() as tl:
        out = run(lambda s, n: all_gather(s, n=n, interpret=InterpretParams(chip="v5e")), n, x)
    np.testing.assert_array_equal(out, reference("all_gather", x, n))
    (rec,) = tl.launches
    return rec


@pytest.mark.timeout(240)
def test_ring_all_gather_time_grows_with_devices_per_ici_bandwidth():
    chunk = ROWS * COLS * 4
    per_hop = V5E.dma_latency_s + chunk / V5E.ici_bytes_per_second
    recs = {n: _gather(n) for n in (2, 3, 4)}
    for n, rec in recs.items():
        assert rec.num_devices == n and rec.bound == "ICI"
        tracks = {s.track for s in rec.spans}
        assert {(d, "core 0") for d in range(n)} <= tracks
        assert {(d, "DMA engine 0") for d in range(n)} <= tracks
        # n - 1 hops over one link each, plus the local copy (HBM) and the launch's
        # prologue, one step and epilogue: under 3 us on v5e
        fixed = rec.predicted_seconds - (n - 1) * per_hop
        assert 0 < fixed < 3e-6
        remote = [s for s in rec.spans if s.cat == "dma" and s.name.startswith("o_ref->")]
        assert len(remote) == n * (n - 1)
        assert all(s.args["bytes"] == chunk for s in remote)
    growth = [(recs[b].predicted_seconds - recs[a].predicted_seconds) / ((b - a) * per_hop)
              for a, b in ((2, 3), (3, 4))]
    assert growth == pytest.approx([1.0, 1.0], rel=0.05)
