"""Python's cyclic garbage collector during a run: the heap from before it is frozen.

A run allocates objects that live until it ends (DMAs, semaphore clocks, race-detector
events, every core's frames); past a quarter of the long-lived heap they trigger a full
collection, which walks *every* object of the process. Under jax a 256-device launch
sits on a heap of millions of objects (compiled programs, the interpreter's caches), so
those collections cost more than the simulation itself. ``frozen_heap()`` moves the
objects that exist when the run starts to the collector's permanent generation
(``gc.freeze``) and back when it ends (``gc.unfreeze``): collections during the run walk
only what the run allocated. Nothing is disabled and refcounting frees garbage as usual;
cyclic garbage among the frozen objects waits for the run's end. Runs nest and may
overlap on several threads (the outermost one freezes); a process that froze its heap
itself (``gc.get_freeze_count() > 0``) is left alone.

During the run the youngest generation's threshold is also raised (700 -> ``YOUNG``
allocations): a run keeps much of what it allocates until it ends (the race detector's
events, one per access, live as long as the shadow state names them), so every young
collection walks survivors and promotes them; with races on at 64 devices the default
made ~180 young collections per call, ~15% of its time. Refcounting still frees
garbage at once; only cyclic garbage waits for a larger batch.

A whole launch (its setup, run and teardown) may run inside ``frozen_heap(collect=True)``:
a launch is one big reference cycle (the launch, its cores, their evaluators and
greenlets, the simulation) holding everything it made (at 256 devices 130k semaphores),
so when it is dropped nothing is freed until a collection of the generation it reached.
Unfrozen after the run, that is the oldest one, and the whole jax heap is walked once
per large launch to free it (~1.4-1.8 s at 256 devices). With ``collect=True`` the
outermost block, on leaving, collects while the heap is still frozen when the block
allocated enough to have triggered a young collection (a large launch): the collection
then walks only what the block allocated and frees the dropped launch; smaller blocks
leave their garbage to the collector as before (a collection costs more than they do).
Such a block also raises the middle generation's threshold (10 -> ``MIDDLE``): each of
its collections walks every survivor of the block so far (at 256 devices two of them
took ~0.5 s per launch), and the collection on leaving frees the block's cycles anyway.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["collection_count", "frozen_heap"]

_lock = threading.Lock()
_depth = 0  # runs inside frozen_heap now
_froze = False  # whether the outermost one froze the heap (and so must unfreeze it)
_thresholds: tuple[int, ...] | None = None  # the collector's thresholds before the run
_collections = 0  # collections before the outermost block began

YOUNG = 20_000  # the youngest generation's threshold during a run
MIDDLE = 100  # the middle generation's threshold in a block that collects on leaving


@contextlib.contextmanager
def frozen_heap(collect: bool = False) -> Iterator[None]:
    """Freeze the objects that exist now for the duration of the ``with`` block; with
    ``collect``, the outermost block collects its own cyclic garbage on leaving when it
    allocated enough to trigger a young collection (see the module docstring)."""
    global _depth, _froze, _thresholds, _collections
    with _lock:
        if _depth == 0 and gc.isenabled() and gc.get_freeze_count() == 0:
            gc.freeze()
            _froze = True
            _thresholds = gc.get_threshold()
            _collections = collection_count()
            young = max(_thresholds[0], YOUNG)
            # The collection on leaving covers the middle generation too: fewer of its
            # collections meanwhile (each walks all the block's survivors so far).
            middle = max(_thresholds[1], MIDDLE) if collect else _thresholds[1]
            gc.set_threshold(young, middle, *_thresholds[2:])
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _froze:
                _froze = False
                assert _thresholds is not None
                gc.set_threshold(*_thresholds)
                _thresholds = None
                if collect and collection_count() > _collections:
                    gc.collect()  # walks only the unfrozen objects: what the block made
                gc.unfreeze()


def collection_count() -> int:
    """How many collections (of any generation) ran so far in this process."""
    return sum(int(stats["collections"]) for stats in gc.get_stats())
