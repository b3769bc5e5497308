"""Clock entries named by the slots' histories (``SlotNames``), and the detector's calls
for a DMA's end (``finish_release``) and a wait's clocks (``acquire_all``)."""

from palladium.race_detect import ClockExchange, RaceDetector, VectorClock
from palladium.race_detect.slot_names import SlotNames


def test_a_slots_times_are_named_by_the_occupant_that_started_last_before_them():
    names = SlotNames()
    names.set(2, 1, "DMA #1")
    names.set(2, 5, "DMA #2")
    names.set(0, 1, "core 0")
    assert [names.name(2, t) for t in range(8)] == ["", "DMA #1", "DMA #1", "DMA #1",
                                                   "DMA #1", "DMA #2", "DMA #2", "DMA #2"]
    assert names.name(1, 3) == "" and names.name(9, 1) == ""  # never named
    assert names.names((4, 0, 6)) == ("core 0", "", "DMA #2")


def test_names_set_out_of_time_order_and_again_at_the_same_time():
    # A proxy slot learns a remote slot's times in any order (imports from several
    # processes); a name given again for the same time replaces the old one.
    names = SlotNames()
    names.set(0, 7, "c")
    names.set(0, 3, "b")
    names.set(0, 1, "x")
    names.set(0, 1, "a")
    assert [names.name(0, t) for t in (1, 2, 3, 6, 7, 9)] == ["a", "a", "b", "b", "c", "c"]


def test_a_clock_made_from_names_has_its_own_table_and_a_copy_does_too():
    a = VectorClock([1, 0, 2], ["a", "", "c"])
    b = a.copy()
    b.set(0, 1, "z")  # changes b's names only
    assert a.names == ["a", "", "c"] and b.names == ["z", "", "c"]
    det = RaceDetector()
    core = det.new_actor("core 0")
    assert core.vector.copy().namer is det.slot_names  # the detector's: shared, not copied


def test_a_report_names_each_clock_entry_by_the_actor_that_made_it_across_slot_reuse():
    det = RaceDetector(on_race="collect")
    det.register_buffer("x", (8,), "x")
    core = det.new_actor("core 0")  # slot 0, time 1
    for i in range(3):  # three DMAs in turn on slot 1, each waited for
        dma = det.new_actor(f"DMA #{i}", parent=core)
        det.write(dma, "x", slice(0, 4), site=f"w{i}")
        det.acquire(core, det.finish_release(dma))
    assert det.num_slots == 2
    # DMA #0 ran at time 1 of slot 1, DMA #1 at 2, DMA #2 at 3 (one past the last final);
    # each fork ticked the core (1 -> 4), and the fork of DMA #3 ticks it to 5.
    late = det.new_actor("DMA #3", parent=core)  # slot 1 again, time 4
    det.write(late, "x", slice(4, 8), site="w3")
    det.read(core, "x", site="r")  # did not wait for DMA #3: a race on x[4:8]
    (report,) = det.reports
    assert report.first.clock == (("core 0", 4), ("DMA #3", 4))
    assert report.second.clock == (("core 0", 5), ("DMA #2", 3))
    assert str(report).splitlines() == [
        "data race on 'x' at element (4,): write (w3) and read (r) are not ordered",
        "  write by 'DMA #3' to x[4:8] at w3",
        "  read by 'core 0' of x[:] at r",
        "  no semaphore wait, barrier or join orders them (vector clocks {core 0: 4, "
        "DMA #3: 4} and {core 0: 5, DMA #2: 3})"]


def test_finish_release_is_finish_then_release_and_acquire_all_is_each_acquire():
    def run(fused: bool) -> tuple:
        det = RaceDetector(on_race="collect")
        det.register_buffer("x", (8,), "x")
        core = det.new_actor("core 0")
        clocks = []
        for i in range(3):
            dma = det.new_actor(f"DMA #{i}", parent=core)
            det.write(dma, "x", slice(2 * i, 2 * i + 2))
            if fused:
                clocks.append(det.finish_release(dma))
            else:
                det.finish(dma)
                clocks.append(det.release(dma))
        if fused:
            det.acquire_all(core, clocks)
        else:
            for clock in clocks:
                det.acquire(core, clock)
        det.read(core, "x", slice(0, 6))
        nxt = det.new_actor("DMA #3", parent=core)
        return ([(c.times, c.names, c.finished_slot) for c in clocks], core.vector.times,
                core.reusable_slots, nxt.slot, det.reports, det.num_slots)

    fused, apart = run(True), run(False)
    assert fused == apart
    assert fused[0][2] == ((3, 0, 0, 1), ("core 0", "", "", "DMA #2"), 3)  # no tick
    assert fused[2] == [1, 2] and fused[3] == 3 and fused[4] == []  # hint 3 taken


def test_imported_clocks_name_a_remote_slots_occupants_on_its_proxy_slot():
    sender, receiver = RaceDetector(), RaceDetector(on_race="collect")
    out, into = ClockExchange(sender, 0), ClockExchange(receiver, 1)
    core = sender.new_actor("core 0")
    exported = []
    for i in range(2):  # two DMAs of process 0 on one slot (the second reuses it)
        dma = sender.new_actor(f"DMA #{i}", parent=core)
        exported.append(out.export(sender.finish_release(dma)))
        sender.acquire(core, sender.release(dma))
    assert [e[-1][1:] for e in exported] == [(1, 1, "DMA #0"), (1, 2, "DMA #1")]
    second, first = (into.imported(e) for e in reversed(exported))  # in either order
    assert first.entries() == (("core 0", 1), ("DMA #0", 1))
    assert second.entries() == (("core 0", 2), ("DMA #1", 2))
    receiver.register_buffer("y", (4,), "y")
    local = receiver.new_actor("device 1 core 0")
    receiver.acquire(local, first)
    receiver.write(local, "y", site="a")
    remote = into.actor("DMA #1", 0, 1, exported[1])
    receiver.write(remote, "y", site="b")  # ordered after DMA #0's end only: a race
    (report,) = receiver.reports
    # Slots 0 and 1 are the proxies of process 0's (made by the first import), 2 is local.
    assert report.first.clock == (("core 0", 1), ("DMA #0", 1), ("device 1 core 0", 1))
    assert report.second.clock == (("core 0", 2), ("DMA #1", 2))
