"""The simulated state of a compiled launch, as traced arrays: buffers, semaphores, the
DMAs in flight and the flags that send the launch back to the simulator.

A compiled launch (``compiled_launch.py``) runs a whole kernel launch as one XLA
executable. A DMA copies its data when it starts and is the next bytes of its
semaphore's stream; a ``dma_wait`` takes the next bytes of the stream: the simulator's
``on_wait`` mode lands a semaphore's DMAs in issue order until they cover the wait, so a
DMA is in flight until a wait took its last byte. Wherever that could give
other results than the simulator, or the simulator would report something, a flag is
set and the launch's results are dropped: it runs again in the simulator, which reports
it exactly as ever. The flags (``FLAG_*``):

- an access or a DMA region out of bounds (the simulator's error);
- an access or DMA that touches a region a DMA in flight writes, or writes a region one
  reads (the simulator's data could differ; with races on, the detector may report it);
- a wait no DMA in flight can satisfy (a deadlock), more DMAs in flight than the table
  holds, a DMA left in flight or bytes left on a semaphore at the end (a leak);
- a ``while`` loop past ``WHILE_LIMIT`` (the watchdog's), an output block revisited, a
  block index out of range;
- an input block the BlockSpec pipeline copies in (during the step before) where that
  step's aliased output is written back: the pipeline reads the old block, a race
  (``run/grid_loop.py``); the compiled launch copies blocks strictly between steps.

The DMAs in flight are a ring of ``DMA_SLOTS`` columns: the n-th DMA of the launch takes
column n mod ``DMA_SLOTS`` (a DMA still in flight there raises a flag). A region is kept
as the interval of flat element offsets it spans in its buffer (a superset of its
elements: a strided region can only raise a flag too many, never too few).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from palladium.interpret import _jax_compat as jc
from palladium.interpret.compiled import index_math as im
from palladium.interpret.errors import UnsupportedFeatureError

__all__ = ["DMA_SLOTS", "FLAGS", "Handle", "LaunchState", "SemHandle", "TraceFacts", "View"]

#: DMAs a compiled launch keeps in flight at once (more: the launch runs simulated).
DMA_SLOTS = 32
FLAG_BOUNDS, FLAG_CONFLICT, FLAG_DEADLOCK, FLAG_SLOTS = 1, 2, 4, 8
FLAG_LOOP, FLAG_LEAK, FLAG_REVISIT, FLAG_BLOCK = 16, 32, 64, 128
FLAG_PREFETCH = 256
#: What each flag means (the launch's note when it runs simulated).
FLAGS = {FLAG_BOUNDS: "an access out of bounds", FLAG_CONFLICT: "an access to a DMA in flight",
         FLAG_DEADLOCK: "a wait no DMA satisfies", FLAG_SLOTS: "too many DMAs in flight",
         FLAG_LOOP: "a loop past its limit", FLAG_LEAK: "a DMA or semaphore left at the end",
         FLAG_REVISIT: "an output block revisited", FLAG_BLOCK: "a block index out of range",
         FLAG_PREFETCH: "an input block prefetched before its write-back"}


# The rows of the DMA table (``LaunchState.empty_table``): a free column has -1 as its
# semaphore and buffers (so no wait and no access matches it). A DMA is the bytes up to
# ``end`` of its semaphore's stream: ``sems[0]`` counts the bytes issued on each
# semaphore, ``sems[1]`` the bytes waits took.
_FIELDS = ("sem", "end", "dbuf", "dlo", "dhi", "sbuf", "slo", "shi")
_SEM, _END, _DBUF, _DLO, _DHI, _SBUF, _SLO, _SHI = range(len(_FIELDS))
_MAX_BYTES = np.iinfo(np.int32).max


@dataclasses.dataclass(frozen=True)
class Handle:
    """A kernel ref: buffer ``buf`` of the launch state (static while tracing)."""

    buf: int


@dataclasses.dataclass(frozen=True)
class SemHandle:
    """A semaphore array: its semaphores are ``base + flat index`` of the state's counts."""

    base: int
    shape: tuple[int, ...]


@dataclasses.dataclass
class View:
    """A region of a buffer: per buffer dimension a start (a Python int while static, else
    an int32 tracer: ``index_math``), size and stride, and whether an integer index
    dropped it."""

    starts: list[Any]
    sizes: list[int]
    strides: list[int]
    dropped: list[bool]

    @classmethod
    def whole(cls, shape: tuple[int, ...]) -> View:
        n = len(shape)
        return cls([0] * n, list(shape), [1] * n, [False] * n)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s for s, d in zip(self.sizes, self.dropped) if not d)


def _as_index(x: Any) -> Any:
    if getattr(x, "shape", ()) != ():
        raise UnsupportedFeatureError("a compiled launch takes scalar and slice indices only")
    return im.as_index(x)


def apply_indexers(view: View, transforms: Any, ok: Any = True) -> tuple[View, Any]:
    """``view`` narrowed by a chain of ``NDIndexer`` transforms; ``ok`` and-ed with every
    index being in bounds (a Python bool while static: ``index_math``)."""
    for t in transforms:
        if not isinstance(t, jc.NDIndexer):
            raise UnsupportedFeatureError(f"a compiled launch takes no {type(t).__name__}")
        visible = [d for d, gone in enumerate(view.dropped) if not gone]
        if len(t.indices) > len(visible):
            raise UnsupportedFeatureError("an indexer of more dimensions than the ref")
        starts, sizes, strides, dropped = (list(view.starts), list(view.sizes),
                                           list(view.strides), list(view.dropped))
        for d, i in zip(visible, t.indices):
            if isinstance(i, jc.Slice):
                if not isinstance(i.size, int | np.integer) or not isinstance(i.stride, int | np.integer):
                    raise UnsupportedFeatureError("a slice of traced size or stride")
                start, size, stride = _as_index(i.start), int(i.size), int(i.stride)
                if size:  # (``fits``: no int32 sum of a traced start can wrap)
                    ok = im.all_of(ok, im.fits(start, (size - 1) * stride + 1, view.sizes[d]))
            else:
                start, size, stride = _as_index(i), 1, 1
                ok = im.all_of(ok, im.at_most(0, start), im.less(start, view.sizes[d]))
                dropped[d] = True
            starts[d] = im.add(view.starts[d], im.mul(start, view.strides[d]))
            sizes[d] = size
            strides[d] = view.strides[d] * stride
        view = View(starts, sizes, strides, dropped)
    return view, ok


def read_view(array: Any, view: View) -> Any:
    extent = [(n - 1) * s + 1 if n else 0 for n, s in zip(view.sizes, view.strides)]
    block = lax.dynamic_slice(array, view.starts, extent)
    if any(s != 1 for s in view.strides):
        block = lax.slice(block, [0] * block.ndim, block.shape, view.strides)
    return block.reshape(view.shape)


def write_view(array: Any, view: View, value: Any) -> Any:
    if any(s != 1 and n > 1 for s, n in zip(view.strides, view.sizes)):
        raise UnsupportedFeatureError("a compiled launch writes no strided region")
    value = jnp.broadcast_to(jnp.asarray(value, array.dtype), view.shape).reshape(view.sizes)
    return lax.dynamic_update_slice(array, value, view.starts)


def flat_span(shape: tuple[int, ...], view: View) -> tuple[Any, Any]:
    """[lo, hi): the flat element offsets ``view`` spans in a buffer of ``shape``."""
    step = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    lo: Any = 0
    hi: Any = 1
    for start, size, stride, st in zip(view.starts, view.sizes, view.strides, step):
        lo = im.add(lo, im.mul(start, st))
        hi = im.add(hi, im.mul(im.add(start, max(size - 1, 0) * stride), st))
    if any(n == 0 for n in view.sizes):
        hi = lo
    return im.traced_index(lo), im.traced_index(hi)


@dataclasses.dataclass
class TraceFacts:
    """What a first trace of the launch found out, for the second: the buffers DMAs write
    and read (only accesses that can conflict with a DMA are checked: reads of the first,
    writes of either) and the buffers anything writes (only those are carried through
    loops and conditionals; the rest are constants). None: all of them (the first trace,
    which fills the ``*_found`` sets)."""

    dma_dst: frozenset[int] | None = None
    dma_src: frozenset[int] | None = None
    carried: frozenset[int] | None = None
    dst_found: set[int] = dataclasses.field(default_factory=set)
    src_found: set[int] = dataclasses.field(default_factory=set)
    written_found: set[int] = dataclasses.field(default_factory=set)

    def conflicts(self, buf: int, write: bool) -> tuple[bool, bool]:
        """Whether an access of ``buf`` can touch a region a DMA in flight writes, and
        (a write) one a DMA in flight reads."""
        dst = self.dma_dst is None or buf in self.dma_dst
        src = write and (self.dma_src is None or buf in self.dma_src)
        return dst, src

    def second(self) -> TraceFacts:
        """The facts for the second trace."""
        return TraceFacts(frozenset(self.dst_found), frozenset(self.src_found),
                          frozenset(self.written_found))


class LaunchState:
    """The traced state: ``bufs`` (one array per buffer), ``sems`` (per semaphore the
    bytes DMAs issued on it and the bytes waits took), ``flag``, the DMA table (``dma``)
    and how many DMAs the launch started (``started``: the ring's next column)."""

    def __init__(self, bufs: list[Any], sems: Any, flag: Any, dma: Any, started: Any,
                 facts: TraceFacts, fixed: list[Any] | None = None) -> None:
        self.bufs, self.sems, self.flag, self.dma = bufs, sems, flag, dma
        self.started = started
        self.facts = facts
        # the buffers nothing writes, as they were at the start (shared by every child)
        self.fixed = list(bufs) if fixed is None else fixed

    def _carried(self, buf: int) -> bool:
        return self.facts.carried is None or buf in self.facts.carried

    def write(self, buf: int, value: Any) -> None:
        """Store ``value`` as buffer ``buf``'s new contents."""
        if not self._carried(buf):
            raise AssertionError(f"buffer {buf} was not written in the first trace")
        self.facts.written_found.add(buf)
        self.bufs[buf] = value

    @staticmethod
    def empty_table() -> Any:
        """No DMA in flight: one int32 row per field (``_FIELDS``), one column per slot
        (one array: a DMA's start updates one column), every column free."""
        return jnp.full((len(_FIELDS), DMA_SLOTS), -1, jnp.int32)

    def carry(self) -> tuple[Any, ...]:
        """What loops and conditionals carry: the buffers something writes (None in the
        place of the others), the semaphores, the flag, the DMA table and its ring's
        position."""
        bufs = [b if self._carried(i) else None for i, b in enumerate(self.bufs)]
        return (bufs, self.sems, self.flag, self.dma, self.started)

    def _bufs_of(self, bufs: list[Any]) -> list[Any]:
        return [self.fixed[i] if b is None else b for i, b in enumerate(bufs)]

    def restore(self, carry: tuple[Any, ...]) -> None:
        bufs, self.sems, self.flag, self.dma, self.started = carry
        self.bufs = self._bufs_of(bufs)

    def child(self, carry: tuple[Any, ...]) -> LaunchState:
        bufs, sems, flag, dma, started = carry
        return LaunchState(self._bufs_of(bufs), sems, flag, dma, started, self.facts,
                           self.fixed)

    def raise_flag(self, bit: int, cond: Any) -> None:
        """Set flag ``bit`` where ``cond`` holds (a static False: nothing to trace)."""
        if im.is_static(cond) and not cond:
            return
        self.flag = lax.bitwise_or(self.flag, lax.select(
            im.traced_bool(cond), np.int32(bit), np.int32(0)))

    # --- conflicts with the DMAs in flight ----------------------------------------------
    def check_access(self, buf: int, view: View, write: bool) -> None:
        """A core access (or block copy) of ``view`` of buffer ``buf``."""
        if not any(self.facts.conflicts(buf, write)):
            return
        lo, hi = flat_span(self.bufs[buf].shape, view)
        self.raise_flag(FLAG_CONFLICT, self._overlaps(buf, lo, hi, write))

    def _overlaps(self, buf: int, lo: Any, hi: Any, write: bool) -> Any:
        """Whether ``[lo, hi)`` of ``buf`` overlaps a region a DMA in flight writes (or,
        for a write, reads); only the rows some DMA can match are compared."""
        dst, src = self.facts.conflicts(buf, write)
        t = self.dma

        def hits(b: int, lo_row: int, hi_row: int) -> Any:
            def row(r: int) -> Any:
                return lax.index_in_dim(t, r, keepdims=False)
            return lax.bitwise_and(lax.bitwise_and(lax.eq(row(b), np.int32(buf)),
                                                   lax.lt(row(lo_row), hi)),
                                   lax.lt(lo, row(hi_row)))

        rows = ([hits(_DBUF, _DLO, _DHI)] if dst else []) + (
            [hits(_SBUF, _SLO, _SHI)] if src else [])
        if not rows:
            return False
        hit = rows[0] if len(rows) == 1 else lax.bitwise_or(*rows)
        return lax.reduce_or(hit, (0,))  # (a free column's buffers are -1)

    def start_dma(self, src: tuple[int, View], dst: tuple[int, View], sem: Any,
                  nbytes: int) -> None:
        """Record a DMA (its data is copied by the caller): the bytes
        ``[issued, issued + nbytes)`` of its semaphore's stream."""
        (sbuf, sview), (dbuf, dview) = src, dst
        self.facts.src_found.add(sbuf)
        self.facts.dst_found.add(dbuf)
        slo, shi = flat_span(self.bufs[sbuf].shape, sview)
        dlo, dhi = flat_span(self.bufs[dbuf].shape, dview)
        # it reads what a DMA in flight writes, or writes what one reads or writes
        self.raise_flag(FLAG_CONFLICT, im.any_of(self._overlaps(sbuf, slo, shi, False),
                                                 self._overlaps(dbuf, dlo, dhi, True)))
        rows = self.dma
        slot = self.started % DMA_SLOTS
        self.started = self.started + 1
        issued = self.sems[0, sem]
        # the ring's column is still in flight, or the stream's count would overflow
        self.raise_flag(FLAG_SLOTS, (rows[_SEM, slot] >= 0) | (issued > _MAX_BYTES - nbytes))
        # (an in-place update of the count, read back for the entry: the executable is
        # ~4% faster than with a scatter and the entry reading the old count; one table of
        # DMAs and counts updated by an elementwise ``where`` per DMA was ~40% slower on
        # paged attention, though it had fewer thunks)
        self.sems = lax.dynamic_update_slice(
            self.sems, (issued + jnp.int32(nbytes)).reshape(1, 1), (jnp.int32(0), sem))
        fields = [sem, self.sems[0, sem], dbuf, dlo, dhi, sbuf, slo, shi]
        column = jnp.stack([jnp.asarray(v, jnp.int32) for v in fields])
        self.dma = lax.dynamic_update_slice(rows, column[:, None], (jnp.int32(0), slot))

    def wait_dma(self, sem: Any, nbytes: int) -> None:
        """A ``dma_wait`` of ``nbytes`` on semaphore ``sem``. The simulator lands the
        semaphore's DMAs in issue order until their bytes cover the wait and takes the
        bytes: so the wait takes the next ``nbytes`` of the semaphore's stream, and a DMA
        whose bytes are all taken is no longer in flight. Fewer bytes issued than
        taken: a deadlock (no DMA of this core can ever signal it)."""
        issued, taken = self.sems[0, sem], self.sems[1, sem] + nbytes
        self.raise_flag(FLAG_DEADLOCK, issued < taken)
        rows = self.dma
        done = (rows[_SEM] == sem) & (rows[_END] <= taken)
        self.dma = jnp.where(done[None, :], jnp.int32(-1), rows)  # their columns free
        # a drained semaphore starts its stream again at 0 (no entry refers to it)
        drained = issued == taken
        self.sems = lax.dynamic_update_slice(
            self.sems, jnp.where(drained, 0, jnp.stack([issued, taken]))[:, None],
            (jnp.int32(0), sem))

    def finish(self) -> None:
        """The end of the launch: nothing may be left in flight or on a semaphore."""
        self.raise_flag(FLAG_LEAK, jnp.any(self.dma[_SEM] >= 0)
                        | jnp.any(self.sems[0] != self.sems[1]))
