"""Vector clock operations: increment, join, happens-before, snapshots."""

from palladium.race_detect import Clock, VectorClock


def test_increment_and_time():
    vc = VectorClock()
    vc.set(2, 1, "core 0")
    assert vc.times == [0, 0, 1]
    vc.increment(2)
    assert vc.time(2) == 2
    assert vc.time(7) == 0
    assert vc.entries() == (("core 0", 2),)


def test_join_takes_elementwise_max_with_names():
    a = VectorClock([3, 0, 1], ["core 0", "", "DMA #1"])
    b = VectorClock([1, 4, 2, 5], ["core 0", "core 1", "DMA #2", "DMA #3"])
    a.join(b)
    assert a.times == [3, 4, 2, 5]
    assert a.names == ["core 0", "core 1", "DMA #2", "DMA #3"]
    assert b.times == [1, 4, 2, 5]  # the other side is unchanged


def test_covers_is_the_epoch_test():
    vc = VectorClock([2, 5], ["a", "b"])
    assert vc.covers(1, 5)
    assert vc.covers(1, 4)
    assert not vc.covers(1, 6)
    assert not vc.covers(3, 1)  # a slot it never heard of


def test_snapshot_is_immutable_and_independent():
    vc = VectorClock([1, 2], ["a", "b"])
    snap = vc.snapshot()
    vc.increment(0)
    assert snap.times == (1, 2)
    assert snap.entries() == (("a", 1), ("b", 2))


def test_clock_happens_before_and_join():
    a = Clock((1, 0), ("a", ""))
    b = Clock((1, 1), ("a", "b"))
    c = Clock((0, 2), ("", "b"))
    assert a <= b and a.happens_before(b)
    assert not b.happens_before(a)
    assert not a.happens_before(a)
    assert not a <= c and not c <= a  # concurrent
    assert a.join(c) == Clock((1, 2), ("a", "b"))
    assert Clock() <= a


def test_a_snapshot_keeps_its_times_and_names_when_the_clock_joins_or_grows():
    # Snapshots share the clock's arrays until it changes (copy on write).
    vc = VectorClock([1, 2], ["a", "b"])
    snap = vc.snapshot()
    assert vc.snapshot() is snap  # unchanged clock: the same snapshot
    vc.join(VectorClock([0, 5, 3], ["", "b2", "c"]))
    vc.set(4, 1, "e")
    assert snap.times == (1, 2) and snap.names == ("a", "b")
    assert snap.entries() == (("a", 1), ("b", 2))
    assert vc.entries() == (("a", 1), ("b2", 5), ("c", 3), ("e", 1))
    later = vc.snapshot()
    vc.increment(0)
    assert later.entries() == (("a", 1), ("b2", 5), ("c", 3), ("e", 1))
    assert vc.time(0) == 2


def test_a_join_takes_many_names_from_a_snapshot():
    other = VectorClock(list(range(1, 101)), [f"core {i}" for i in range(100)]).snapshot()
    vc = VectorClock([50] * 100, ["old"] * 100)
    vc.join(other)
    assert vc.times == [max(50, t) for t in range(1, 101)]
    assert vc.names == ["old"] * 50 + [f"core {i}" for i in range(50, 100)]


def test_a_join_that_takes_one_entry_changes_that_entry_only_and_not_a_snapshot():
    vc = VectorClock([3, 1, 4], ["a", "b", "c"])
    snap = vc.snapshot()
    vc.join(Clock((0, 7, 4), ("", "b2", "c2")))  # one newer entry; an equal one stays
    assert vc.times == [3, 7, 4]
    assert vc.names == ["a", "b2", "c"]
    assert snap.entries() == (("a", 3), ("b", 1), ("c", 4))
    vc.join(Clock((0, 7, 4), ("", "b3", "c3")))  # nothing newer: nothing taken
    assert vc.names == ["a", "b2", "c"]
