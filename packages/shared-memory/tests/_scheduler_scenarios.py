"""Random small multi-core programs for the scheduler's oracle tests.

A scenario is plain data (so hypothesis can draw and shrink it): a slice shape, the
simulation's options and, per round, one step every core takes (a ring of remote DMAs,
signal-then-wait, a barrier, a yield) with a few per-core extras (``pl.delay``-like yield
points, semaphore reads, DMA starts nobody waits for, waits that may never be satisfied).
``run_scenario`` runs one and returns everything observable about the run: the schedule,
the error (deadlock, leak, ...) and the final buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from palladium.shared_memory import MemorySpace, SemaphoreKind, Simulation

VMEM = MemorySpace.VMEM
ROWS, WIDTH = 4, 2

# Per round, every core does one of these (with a shift: the partner is (i + shift) % cores).
ROUND_KINDS = ("dma_ring", "signal_wait", "barrier", "yield", "dma_send_only")
# Per-core extras before a round's step.
EXTRAS = ("yield", "delay", "read", "stray_dma", "stray_wait", "stray_signal")


@dataclasses.dataclass(frozen=True)
class Scenario:
    devices: int
    cores: int
    seed: int
    mode: str  # "on_wait" | "eager"
    dma_order: str  # "issue" | "random"
    detect_races: bool
    rounds: tuple[tuple[str, int], ...]  # (kind, shift)
    extras: tuple[tuple[int, int, str], ...]  # (round, core index, extra)


def run_scenario(scenario: Scenario, make: Callable[..., Simulation] = Simulation) -> tuple:
    """Run ``scenario`` on ``make(...)``'s simulation; (schedule, error, buffers, races)."""
    s = scenario
    sim = make(num_devices=s.devices, cores_per_device=s.cores, seed=s.seed,
               dma_execution_mode=s.mode, dma_order=s.dma_order, detect_races=s.detect_races,
               on_race="collect")
    cores = [(d, c) for d in range(s.devices) for c in range(s.cores)]
    k = len(cores)
    bufs, sems = {}, {}
    for i, core in enumerate(cores):
        bufs[core] = sim.allocate(VMEM, *core, name="buf",
                                  value=np.full((ROWS, WIDTH), 10 * i, np.int32))
        sems[core] = sim.allocate_semaphores(*core, kind=SemaphoreKind.DMA, name="dma_sems",
                                             shape=(2,))
        sems[core, "reg"] = sim.allocate_semaphores(*core, kind=SemaphoreKind.REGULAR,
                                                    name="reg")
    nbytes = WIDTH * 4
    extras: dict[tuple[int, int], list[str]] = {}
    for r, i, extra in s.extras:
        extras.setdefault((r, i % k), []).append(extra)

    def body(i: int) -> Callable[[], None]:
        me = cores[i]
        send, recv = sems[me]

        def dma_to(j: int, row: int, wait_send: bool, wait_recv: bool) -> None:
            other = cores[j]
            sim.dma_start(bufs[me], (row,), bufs[other], ((row + 1) % ROWS,), core=me,
                          dst_sem=sems[other][1], src_sem=send, dst_core=other,
                          site=f"dma {me}->{other}")
            if wait_send:
                sim.dma_wait(send, nbytes, core=me, site="send wait")
            if wait_recv:
                sim.dma_wait(recv, nbytes, core=me, site="recv wait")

        def run() -> None:
            for r, (kind, shift) in enumerate(s.rounds):
                for extra in extras.get((r, i), []):
                    if extra == "yield":
                        sim.tick(site="loop")
                        sim.yield_point()
                    elif extra == "delay":
                        sim.yield_point(site="delay")
                    elif extra == "read":
                        sim.semaphore_read(recv, core=me)
                    elif extra == "stray_dma":  # received by the partner, never waited for
                        dma_to((i + 1) % k, r % ROWS, wait_send=False, wait_recv=False)
                    elif extra == "stray_wait":  # satisfied only if someone signals
                        sim.semaphore_wait(sems[me, "reg"], 1, core=me, site="stray wait")
                    elif extra == "stray_signal":
                        sim.semaphore_signal(sems[cores[(i + 2) % k], "reg"], 1, core=me,
                                             target=cores[(i + 2) % k])
                partner = (i + shift) % k
                if kind == "dma_ring":
                    dma_to(partner, r % ROWS, wait_send=True, wait_recv=True)
                elif kind == "dma_send_only":  # wait for the receive later, after a yield
                    dma_to(partner, r % ROWS, wait_send=False, wait_recv=False)
                    sim.yield_point()
                    sim.dma_wait(recv, nbytes, core=me, site="late recv wait")
                    sim.dma_wait(send, nbytes, core=me, site="late send wait")
                elif kind == "signal_wait":
                    sim.semaphore_signal(sems[cores[partner], "reg"], 1, core=me,
                                         target=cores[partner])
                    sim.semaphore_wait(sems[me, "reg"], 1, core=me, site="round wait")
                elif kind == "barrier":
                    sim.barrier(me, site=f"barrier {r}")
                else:
                    sim.yield_point()

        return run

    error = None
    try:
        sim.run({core: body(i) for i, core in enumerate(cores)})
    except Exception as e:  # deadlocks and leaks are outcomes too
        error = (type(e).__name__, str(e))
    values = tuple(sim.value(bufs[c]).tobytes() for c in cores)
    det = sim.race_detector
    races = len(det.reports) if det is not None else 0
    return tuple(sim.schedule), error, values, races
