"""The race detector alone: one launch's detector calls recorded under jax, replayed without it.

A steady race-on launch of a multi-device collective (``_harness.collective``: the ring
all-gather or jax's shipped all-gather) is run once with every ``RaceDetector`` call
logged (actors, clocks and buffer keys by number, the prepared regions as they are); the
log is then replayed against a fresh detector in a process without jax, timed in CPU
seconds, and the reports, slot count and live records are summed up in a digest. So a
change to ``race_detect`` is measured in isolation (no interpreter, no scheduler, no
collector of a jax heap) and checked to report exactly the same races: ``--drop K`` skips
every K-th acquire, which makes a race-free log report races.

    python benchmarks/race_replay.py                          # both kernels, 64 devices
    python benchmarks/race_replay.py --devices 16 --drop 97   # smaller, with races
    python benchmarks/race_replay.py --replay LOG.pkl         # an existing log
    python benchmarks/race_replay.py --replay LOG.pkl --fused # a DMA's parts as one call each
    python benchmarks/race_replay.py --memo --drop 13         # into MemoDetectors that
                                  # remember the log without drops first (then: the same digest)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
_METHODS = ("new_actor", "finish", "join", "release", "acquire", "barrier",
            "register_buffer", "free_buffer", "read", "write", "finish_release", "acquire_all",
            "read_release", "write_release")


def record(name: str, n: int, out: str) -> None:
    """Log every detector call of the second race-on launch of ``name`` into ``out``."""
    sys.path.insert(0, HERE)
    from _harness import collective

    import palladium.interpret as pi
    from palladium.race_detect import RaceMemo
    from palladium.race_detect import detector as module

    # Nothing remembered: every launch's calls reach the eager detector, to be logged.
    RaceMemo.get = lambda self, key: None  # type: ignore[method-assign]
    log: list[tuple[Any, ...]] = []
    on = [False]
    numbers: dict[int, tuple[int, Any]] = {}  # id -> (number, the object, kept alive)

    def number(obj: Any) -> int:
        if id(obj) not in numbers:
            numbers[id(obj)] = (len(numbers), obj)
        return numbers[id(obj)][0]

    def logged(method: str) -> Any:
        original = getattr(module.RaceDetector, method)

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            if on[0]:
                entry: tuple[Any, ...] = (method, number(self))
                if method == "new_actor":
                    parent = kwargs.get("parent", args[1] if len(args) > 1 else None)
                    entry += (args[0], None if parent is None else number(parent), number(result))
                elif method in ("finish", "release"):
                    entry += (number(args[0]),) + ((number(result),) if method == "release" else ())
                elif method == "finish_release":  # logged as its two parts
                    log.append(("finish", number(self), number(args[0])))
                    entry = ("release", number(self), number(args[0]), number(result))
                elif method in ("read_release", "write_release"):  # logged as their parts
                    actor, key = number(args[0]), number(args[1])
                    region = kwargs.get("region", args[2] if len(args) > 2 else None)
                    site = kwargs.get("site", args[3] if len(args) > 3 else None)
                    log.append(("read" if method == "read_release" else "write",
                                number(self), actor, key, region, str(site), None))
                    if method == "write_release":
                        log.append(("finish", number(self), actor))
                    entry = ("release", number(self), actor, number(result))
                elif method == "acquire_all":  # logged as one acquire per clock
                    log.extend(("acquire", number(self), number(args[0]), number(c))
                               for c in args[1])
                    return result
                elif method in ("join", "acquire"):
                    entry += (number(args[0]), number(args[1]))
                elif method == "barrier":
                    entry += ([number(a) for a in args[0]],)
                elif method == "register_buffer":
                    entry += (number(args[0]), args[1], args[2])
                elif method == "free_buffer":
                    entry += (number(args[0]),)
                else:
                    region = kwargs.get("region", args[2] if len(args) > 2 else None)
                    site = kwargs.get("site", args[3] if len(args) > 3 else None)
                    entry += (number(args[0]), number(args[1]), region, str(site),
                              kwargs.get("mask"))
                log.append(entry)
            return result
        return call

    for method in _METHODS:
        setattr(module.RaceDetector, method, logged(method))
    f, x, _ = collective(name, n, pi.InterpretParams(detect_races=True),
                         pi.force_tpu_interpret_mode)
    f(x).block_until_ready()  # compiles (and warms the interpreter's caches)
    on[0] = True
    f(x).block_until_ready()
    on[0] = False
    with open(out, "wb") as fh:
        pickle.dump(log, fh, protocol=5)


def fused(log: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``log`` with each unmasked read then release of one actor as one ``read_release``
    entry, and each unmasked write, finish, release as one ``write_release`` (how a DMA
    makes them; ``record`` logs them as their parts)."""
    out: list[tuple[Any, ...]] = []
    i, n = 0, len(log)
    while i < n:
        entry = log[i]
        method, d = entry[0], entry[1]
        if method in ("read", "write") and entry[6] is None:
            actor = entry[2]
            if (method == "read" and i + 1 < n and log[i + 1][:3] == ("release", d, actor)):
                out.append(("read_release", d, *entry[2:6], log[i + 1][3]))
                i += 2
                continue
            if (method == "write" and i + 2 < n and log[i + 1] == ("finish", d, actor)
                    and log[i + 2][:3] == ("release", d, actor)):
                out.append(("write_release", d, *entry[2:6], log[i + 2][3]))
                i += 3
                continue
        out.append(entry)
        i += 1
    return out


def replay(log: list[tuple[Any, ...]], drop: int = 0,
           memos: dict[int, Any] | None = None) -> list[Any]:
    """Run ``log`` against fresh detectors (``on_race="collect"``); skip every ``drop``-th
    acquire. Returns the detectors. ``memos``: ``MemoDetector``s over these memos (one
    per detector of the log, made on first use)."""
    from palladium.race_detect import MemoDetector, RaceDetector, RaceMemo

    def make(d: int) -> Any:
        if memos is None:
            return RaceDetector(on_race="collect")
        return MemoDetector("collect", memos.setdefault(d, RaceMemo()))

    detectors: dict[int, Any] = {}
    actors: dict[int, Any] = {}
    clocks: dict[int, Any] = {}
    acquires = 0
    for method, d, *rest in log:
        det = detectors.get(d)
        if det is None:
            det = detectors[d] = make(d)
        if method in ("read_release", "write_release"):
            actor, key, region, site, clock = rest
            clocks[clock] = getattr(det, method)(actors[actor], key, region, site)
        elif method == "new_actor":
            name, parent, actor = rest
            actors[actor] = det.new_actor(name, parent=None if parent is None else actors[parent])
        elif method == "release":
            clocks[rest[1]] = det.release(actors[rest[0]])
        elif method == "acquire":
            acquires += 1
            if not (drop and acquires % drop == 0):
                det.acquire(actors[rest[0]], clocks[rest[1]])
        elif method in ("read", "write"):
            actor, key, region, site, mask = rest
            getattr(det, method)(actors[actor], key, region, site, mask=mask)
        elif method == "finish":
            det.finish(actors[rest[0]])
        elif method == "join":
            det.join(actors[rest[0]], actors[rest[1]])
        elif method == "barrier":
            det.barrier([actors[a] for a in rest[0]])
        elif method == "register_buffer":
            det.register_buffer(*rest)
        else:
            det.free_buffer(rest[0])
    return list(detectors.values())


def digest(detectors: list[Any]) -> tuple[int, str, list[int], list[int]]:
    """(reports, a digest of every report's repr and message, slots, live records)."""
    reports = [r for d in detectors for r in d.reports]
    text = "\n".join(f"{r!r}|{r}" for r in reports)
    return (len(reports), hashlib.sha256(text.encode()).hexdigest()[:16],
            [d.num_slots for d in detectors], [d.live_records() for d in detectors])


def measure(path: str, repeats: int, drop: int, fuse: bool = False, memo: bool = False) -> str:
    import gc

    with open(path, "rb") as fh:
        log = pickle.load(fh)
    if fuse:
        log = fused(log)
    memos: dict[int, Any] | None = None
    if memo:  # each detector's log without drops remembered (it is race-free)
        memos = {}
        for det in replay(log, 0, memos):
            det.remember()
    times, summary = [], None
    for _ in range(repeats):
        gc.collect()
        t0 = time.process_time()
        detectors = replay(log, drop, memos)
        times.append(time.process_time() - t0)
        summary = summary or digest(detectors)
        del detectors
    assert summary is not None
    times.sort()
    calls = len(log)
    reports, text, slots, live = summary
    return (f"| {os.path.basename(path)} | {calls} | {times[0]:.3f} / {times[len(times) // 2]:.3f} s "
            f"| {times[0] / calls * 1e6:.1f} us | {reports} | {text} | {slots} | {live} |")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", nargs=3, metavar=("NAME", "N", "OUT"))
    parser.add_argument("--replay", nargs="*", default=None, metavar="LOG")
    parser.add_argument("--kernels", nargs="*", default=["all_gather", "jax_all_gather"])
    parser.add_argument("--devices", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--drop", type=int, default=0, help="skip every K-th acquire")
    parser.add_argument("--fused", action="store_true",
                        help="replay a DMA's parts as read_release / write_release")
    parser.add_argument("--memo", action="store_true",
                        help="replay into MemoDetectors remembering the log without drops")
    args = parser.parse_args(argv)
    if args.record:
        name, n, out = args.record
        record(name, int(n), out)
        return 0
    paths = args.replay
    if paths is None:
        tmp = tempfile.mkdtemp(prefix="race_replay_")
        paths = []
        for name in args.kernels:
            out = os.path.join(tmp, f"{name}_{args.devices}.pkl")
            env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count="
                       f"{args.devices + 1}")
            subprocess.run([sys.executable, os.path.abspath(__file__), "--record", name,
                            str(args.devices), out], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            paths.append(out)
    print(f"race detector replay (drop every {args.drop or 'no'} acquire"
          f"{', fused' if args.fused else ''}{', memo' if args.memo else ''}), CPU seconds "
          f"min / median of {args.repeats}\n")
    print("| log | calls | replay | per call | reports | digest | slots | live records |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        print(measure(path, args.repeats, args.drop, args.fused, args.memo), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
