"""A DMA's calls: forked actors without a clock of their own, ``read_release`` and
``write_release`` (an access and a release in one call), and the clocks they release
(``Clock.of_fork``: the parent's times plus one entry, joined without building them)."""

import numpy as np
import pytest

from palladium.race_detect import Clock, DataRaceError, RaceDetector, VectorClock
from palladium.race_detect.slot_names import SlotNames


def _scenario(mode: str) -> tuple:
    """Two cores and six DMAs: a copy within one buffer (its write overlaps its own
    read), slot reuse, a read racing with an unwaited DMA's write, two unordered writes.
    ``mode``: "fused" (read_release/write_release), "apart" (read, release, write,
    finish_release) or "own" (as "apart", each DMA given its own clock at once)."""
    det = RaceDetector(on_race="collect")
    det.register_buffer("x", (8, 4), "x")
    det.register_buffer("y", (8, 4), "y")
    root = det.new_actor("kernel launch")
    cores = [det.new_actor(f"core {i}", parent=root) for i in range(2)]
    det.write(cores[0], "x", site="init")
    det.barrier([root, *cores])
    clocks: list[Clock] = []

    def dma(core, name, src, src_region, dst, dst_region, wait=True):
        actor = det.new_actor(name, parent=core)
        if mode == "own":
            actor.vector  # noqa: B018 - builds the clock of its own now
        sprep, dprep = det.prepare(src, src_region), det.prepare(dst, dst_region)
        if mode == "fused":
            sent = det.read_release(actor, src, sprep, site=f"{name} read")
            done = det.write_release(actor, dst, dprep, site=f"{name} write")
        else:
            det.read(actor, src, sprep, site=f"{name} read")
            sent = det.release(actor)
            det.write(actor, dst, dprep, site=f"{name} write")
            done = det.finish_release(actor)
        clocks.extend((sent, done))
        if wait:
            det.acquire_all(core, [sent, done])
        return actor

    dma(cores[0], "DMA #0", "x", (slice(0, 4),), "x", (slice(2, 6),))  # overlaps itself
    dma(cores[0], "DMA #1", "x", (slice(4, 8),), "y", (slice(4, 8),))  # slot of #0 again
    late = dma(cores[0], "DMA #2", "x", (slice(0, 2),), "y", (slice(0, 2),), wait=False)
    dma(cores[1], "DMA #3", "y", (slice(0, 2),), "y", (slice(2, 4),))  # reads #2's write
    dma(cores[0], "DMA #4", "x", (slice(0, 1),), "y", (slice(6, 7),), wait=False)
    dma(cores[1], "DMA #5", "x", (slice(1, 2),), "y", (slice(6, 7),), wait=False)  # vs #4
    det.read(cores[0], "y", (slice(4, 6),), site="core 0 read")
    return ([str(r) for r in det.reports], [r.first.clock for r in det.reports],
            [(c.times, c.names, c.finished_slot) for c in clocks],
            [c.vector.times for c in cores], det.num_slots, late.time, det.live_records())


def test_read_release_and_write_release_are_their_parts_and_a_forked_clock_its_array():
    fused, apart, own = _scenario("fused"), _scenario("apart"), _scenario("own")
    assert fused == apart == own
    messages = fused[0]
    assert len(messages) == 2
    assert messages[0].splitlines() == [
        "data race on 'y' at element (0, 0): write (DMA #2 write) and read (DMA #3 read) "
        "are not ordered",
        "  write by 'DMA #2' to y[0:2, :] at DMA #2 write",
        "  read by 'DMA #3' of y[0:2, :] at DMA #3 read",
        "  no semaphore wait, barrier or join orders them (vector clocks {kernel launch: 3, "
        "core 0: 4, core 1: 1, DMA #2: 6} and {kernel launch: 3, core 0: 1, core 1: 2, "
        "DMA #3: 1})"]
    assert messages[1].splitlines() == [
        "data race on 'y' at element (6, 0): write (DMA #4 write) and write (DMA #5 write) "
        "are not ordered",
        "  write by 'DMA #4' to y[6:7, :] at DMA #4 write",
        "  write by 'DMA #5' to y[6:7, :] at DMA #5 write",
        "  no semaphore wait, barrier or join orders them (vector clocks {kernel launch: 3, "
        "core 0: 5, core 1: 1, DMA #1: 4, DMA #4: 2} and {kernel launch: 3, core 0: 1, "
        "core 1: 3, DMA #5: 4})"]
    # DMA #0's write of x[2:6] follows its own read of x[0:4] (no race); DMAs #1 and #2
    # took #0's slot, #5 took #3's (their cores had waited for them): 6 slots for the
    # launch, 2 cores and 6 DMAs. DMA #2 read at 5 and wrote at 6.
    assert fused[4] == 6 and fused[5] == 6


def test_a_forked_actor_shares_its_parents_times_until_it_needs_its_own():
    det = RaceDetector(on_race="collect")
    core = det.new_actor("core 0")
    core.vector.set(0, 5, "core 0")
    dma = det.new_actor("DMA #0", parent=core)
    assert dma.own_vector is None and dma.base is not None
    assert dma.clock().entries() == (("core 0", 5), ("DMA #0", 1))
    assert core.vector.times == [6] and dma.base.tolist() == [5]  # the parent copied
    assert det.release(dma).entries() == (("core 0", 5), ("DMA #0", 1))
    assert dma.time == 2 and dma.own_vector is None
    other = det.new_actor("core 1")
    det.join(other, dma)  # any other use gives the DMA its own clock, the same times
    assert dma.own_vector is not None and dma.vector.times == [5, 3]  # the join ticked it
    assert other.vector.entries() == (("core 0", 5), ("DMA #0", 2), ("core 1", 1))


def test_a_fork_clock_is_its_base_with_one_entry_and_joins_as_that_array():
    names = SlotNames(shared=True)
    base = np.array([3, 0, 7], np.int64)
    for slot, time in ((1, 4), (5, 2)):  # inside the base, and past its end
        fork = Clock.of_fork(base, names, slot, time, finished_slot=slot)
        expected = [3, 4, 7] if slot == 1 else [3, 0, 7, 0, 0, 2]
        assert list(fork.times) == expected and fork.time(slot) == time
        assert fork == Clock(expected) and fork.finished_slot == slot
        assert base.tolist() == [3, 0, 7]  # never changed
        for mine in ([1, 9], [1, 9, 0, 5], [0, 0, 0, 0, 0, 0, 9]):
            for shared in (False, True):
                a = VectorClock(mine, namer=names)
                if shared:
                    a.snapshot()  # the next change copies the array
                b = VectorClock(mine, namer=names)
                a.join(Clock.of_fork(base, names, slot, time))
                b.join(Clock.of_array(np.array(expected, np.int64), SlotNames()))
                assert a.times == b.times, (slot, mine, shared)


def test_on_race_raise_stops_a_dma_call_at_the_racing_access():
    det = RaceDetector(on_race="raise")
    det.register_buffer("x", (4,), "x")
    core = det.new_actor("core 0")
    writer = det.new_actor("DMA #0", parent=core)
    det.write(writer, "x", site="w")  # core 0 never waits for it
    reader = det.new_actor("DMA #1", parent=core)
    with pytest.raises(DataRaceError, match=r"write by 'DMA #0' to x\[:\] at w\n  read by "
                                        r"'DMA #1' of x\[0:2\] at r\n"):
        det.read_release(reader, "x", slice(0, 2), site="r")
    assert reader.time == 1  # raised at the read: not released (no tick)
    third = det.new_actor("DMA #2", parent=core)
    with pytest.raises(DataRaceError, match=r"write by 'DMA #0' to x\[:\] at w\n  write by "
                                        r"'DMA #2' to x\[2:4\] at w2\n"):
        det.write_release(third, "x", slice(2, 4), site="w2")
    assert [a.finished for a in (writer, reader, third)] == [False, False, False]
    released = det.release(third)  # raised at the write: not finished, an ordinary release
    assert released.finished_slot == -1 and released.entries()[-1] == ("DMA #2", 1)
    assert det.num_slots == 4  # no slot was freed: nothing finished


def test_a_core_observing_its_own_dmas_release_takes_only_the_dmas_entry():
    det = RaceDetector(on_race="collect")
    cores = [det.new_actor(f"core {i}") for i in range(3)]
    core = cores[0]
    dma = det.new_actor("DMA #0", parent=core)  # its base is core 0's clock at the fork
    sent = det.release(dma)
    det.acquire(core, det.release(cores[1]))  # core 0 moves on: core 1's entry, a tick
    core.vector.increment(core.slot)
    full = VectorClock(core.vector.array, namer=det.slot_names)
    full.join(Clock.of_array(sent.array, det.slot_names))  # the whole join, as an array
    det.acquire(core, sent)
    assert core.vector.times == full.times == [3, 1, 0, 1]
    other = cores[2]  # another core's join of the same clock takes the whole base
    det.acquire(other, sent)
    assert other.vector.times == [1, 0, 1, 1]
