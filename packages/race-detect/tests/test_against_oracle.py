"""Random programs: the detector reports exactly the racing pairs the brute-force oracle does."""

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from palladium.race_detect import RaceDetector
from palladium.race_detect.oracle import BruteForceDetector
from palladium.race_detect.regions import normalise, region_shape

BUFFERS = {"a": (6,), "b": (3, 4)}


@st.composite
def index(draw, dim):
    if draw(st.booleans()) and draw(st.booleans()):
        return draw(st.integers(-dim, dim - 1))
    bound = st.one_of(st.none(), st.integers(-dim - 2, dim + 2))
    step = draw(st.sampled_from([None, 1, 1, 2, 3, -1, -2]))
    return slice(draw(bound), draw(bound), step)


@st.composite
def region(draw, shape):
    if draw(st.integers(0, 5)) == 0:
        return None
    length = draw(st.integers(0, len(shape)))
    return tuple(draw(index(dim)) for dim in shape[:length])


OPS = ["access"] * 8 + ["fork"] * 2 + ["finish"] * 2 + ["join"] * 3 + ["release", "acquire"] * 2
OPS += ["barrier"]


class Lockstep:
    """Runs every operation on both detectors."""

    def __init__(self):
        self.det = RaceDetector(on_race="collect")
        self.oracle = BruteForceDetector(on_race="collect")
        for key, shape in BUFFERS.items():
            self.det.register_buffer(key, shape, f"buf_{key}")
            self.oracle.register_buffer(key, shape, f"buf_{key}")
        self.actors = []  # (detector actor, oracle actor, finished)
        self.finished = set()
        self.clocks = []
        self.reused = 0

    def new(self, name, parent=None):
        slots_before = self.det.num_slots
        pd, po = (None, None) if parent is None else self.actors[parent]
        self.actors.append((self.det.new_actor(name, pd), self.oracle.new_actor(name, po)))
        self.reused += self.det.num_slots == slots_before

    def live(self):
        return [i for i in range(len(self.actors)) if i not in self.finished]


def run(data, steps):
    ls = Lockstep()
    for i in range(3):
        ls.new(f"core {i}")
    for step in range(steps):
        op = data.draw(st.sampled_from(OPS))
        live = ls.live()
        if not live:
            ls.new(f"core {step}")
            continue
        pick = st.sampled_from(live)
        if op == "access":
            a = data.draw(pick)
            key = data.draw(st.sampled_from(sorted(BUFFERS)))
            shape = BUFFERS[key]
            reg = data.draw(region(shape))
            mask = None
            if data.draw(st.integers(0, 3)) == 0:
                rshape = region_shape(normalise(reg, shape, key), shape)
                size = int(np.prod(rshape, dtype=int))
                bits = data.draw(st.lists(st.booleans(), min_size=size, max_size=size))
                mask = np.array(bits, bool).reshape(rshape)
            fn = "write" if data.draw(st.booleans()) else "read"
            for det, actor in ((ls.det, ls.actors[a][0]), (ls.oracle, ls.actors[a][1])):
                getattr(det, fn)(actor, key, reg, site=step, mask=mask)
        elif op == "fork":
            ls.new(f"DMA #{step}", parent=data.draw(pick))
        elif op == "finish":
            a = data.draw(pick)
            ls.finished.add(a)
            ls.det.finish(ls.actors[a][0])
            ls.oracle.finish(ls.actors[a][1])
        elif op == "join":
            obs = data.draw(pick)
            other = data.draw(st.integers(0, len(ls.actors) - 1))
            ls.det.join(ls.actors[obs][0], ls.actors[other][0])
            ls.oracle.join(ls.actors[obs][1], ls.actors[other][1])
        elif op == "release":
            a = data.draw(pick)
            ls.clocks.append((ls.det.release(ls.actors[a][0]), ls.oracle.release(ls.actors[a][1])))
        elif op == "acquire" and ls.clocks:
            a = data.draw(pick)
            cd, co = data.draw(st.sampled_from(ls.clocks))
            ls.det.acquire(ls.actors[a][0], cd)
            ls.oracle.acquire(ls.actors[a][1], co)
        elif op == "barrier":
            group = data.draw(st.lists(pick, min_size=1, max_size=4))
            ls.det.barrier([ls.actors[i][0] for i in group])
            ls.oracle.barrier([ls.actors[i][1] for i in group])
    return ls


def key(report):
    f, s = report.first, report.second
    return (f.site, f.actor, f.kind, s.site, s.actor, s.kind, s.buffer, s.masked)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_same_racing_pairs_as_the_oracle(data):
    ls = run(data, data.draw(st.integers(1, 45)))
    got = sorted(map(key, ls.det.reports))
    want = sorted(map(key, ls.oracle.reports))
    assert got == want
    assert len(set(got)) == len(got)  # one report per pair
    for r in ls.det.reports:  # the element is touched by both (buffer index in range)
        assert r.element is not None and len(r.element) == len(
            BUFFERS["a" if r.second.buffer == "buf_a" else "b"]
        )
    event(f"races: {min(len(got), 5)}")
    event(f"slot reuses: {min(ls.reused, 3)}")
