"""The state a traced kernel body reads and writes: the protocol of the one traced
evaluator (``traced_eval.py``), for a compiled segment and a compiled launch alike.

A :class:`TracedState` is the refs' contents as traced arrays (``bufs``, a ref being a
static :class:`Handle` into them) and ``flag``: the bits (``FLAG_*``) of everything that
makes the traced results differ from the simulator's, or the simulator report
something; a raised flag drops the results and the equations run simulated, which
reports it exactly as ever. Three optional parts:

- the DMA table (``dma_table.DmaTable``, a compiled launch's): semaphores and the DMAs
  in flight, against which every access is checked;
- the access log (``log``, a compiled segment's with races on): every access's start
  indices, in order, replayed to the race detector (``eval/segment_races.py``);
- the masks of initialised elements (``masks``, a compiled segment's with
  ``uninitialized_reads="on_use"``): a store marks its region, a read of an element not
  marked raises ``FLAG_UNINIT`` (the segment runs one by one, where values carry shadows).

Loops and conditionals carry :meth:`TracedState.carry` and rebuild a child from it; the
log is not carried (an access inside a ``cond`` or ``while`` is not logged:
``segment_races.access_log_plan`` refuses such a segment; ``scan`` stacks its body's).
A region is a :class:`View`: per buffer dimension a start (a Python int while static,
else an int32 tracer: ``index_math``), size and stride.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from palladium.interpret import _jax_compat as jc
from palladium.interpret.compiled import index_math as im
from palladium.interpret.errors import UnsupportedFeatureError

if TYPE_CHECKING:  # (the DMA table reads the state's flags)
    from palladium.interpret.compiled.dma_table import DmaTable

__all__ = ["FLAGS", "GridContext", "Handle", "SemHandle", "TraceFacts", "TracedState", "View",
           "apply_indexers", "flat_span", "read_view", "write_view"]

FLAG_BOUNDS, FLAG_CONFLICT, FLAG_DEADLOCK, FLAG_SLOTS = 1, 2, 4, 8
FLAG_LOOP, FLAG_LEAK, FLAG_REVISIT, FLAG_BLOCK = 16, 32, 64, 128
FLAG_PREFETCH, FLAG_UNINIT = 256, 512
#: Not a difference from the simulator: an inline run's ``while`` loops went past the
#: iterations it was given (``TracedState.budget``); the launch runs again, compiled, on
#: the worker thread with no such bound (``compiled_launch.py``).
FLAG_BUDGET = 1024
#: What each flag means (the launch's note when it runs simulated).
FLAGS = {FLAG_BOUNDS: "an access out of bounds", FLAG_CONFLICT: "an access to a DMA in flight",
         FLAG_DEADLOCK: "a wait no DMA satisfies", FLAG_SLOTS: "too many DMAs in flight",
         FLAG_LOOP: "a loop past its limit", FLAG_LEAK: "a DMA or semaphore left at the end",
         FLAG_REVISIT: "an output block revisited", FLAG_BLOCK: "a block index out of range",
         FLAG_PREFETCH: "an input block prefetched before its write-back",
         FLAG_UNINIT: "a read of an element nothing initialised"}


@dataclasses.dataclass(frozen=True)
class Handle:
    """A kernel ref: buffer ``buf`` of the traced state (static while tracing)."""

    buf: int


@dataclasses.dataclass(frozen=True)
class SemHandle:
    """A semaphore array: its semaphores are ``base + flat index`` of the DMA table's."""

    base: int
    shape: tuple[int, ...]


class GridContext:
    """What ``pl.program_id`` and ``pl.num_programs`` answer at the traced grid point
    (``ids[axis]``: the program id of grid axis ``axis``)."""

    def __init__(self, ids: Any, counts: Sequence[int]) -> None:
        self.ids, self.counts = ids, list(counts)


@dataclasses.dataclass
class View:
    """A region of a buffer: per dimension a start, size and stride, and whether an
    integer index dropped it."""

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
    """[lo, hi): the flat element offsets ``view`` spans in a buffer of ``shape`` (a
    superset of a strided region's elements: a flag too many, never too few)."""
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
    """What a first trace of a launch found out, for the second: the buffers DMAs write
    and read (only accesses that can conflict with a DMA are checked: reads of the first,
    writes of either) and the buffers anything writes (only those are carried through
    loops and conditionals; the rest are constants). None: all of them (the first trace,
    which fills the ``*_found`` sets, and a compiled segment). ``gathering``: the first
    trace, whose program is never compiled, so it emits no conflict checks."""

    dma_dst: frozenset[int] | None = None
    dma_src: frozenset[int] | None = None
    carried: frozenset[int] | None = None
    dst_found: set[int] = dataclasses.field(default_factory=set)
    src_found: set[int] = dataclasses.field(default_factory=set)
    written_found: set[int] = dataclasses.field(default_factory=set)
    gathering: bool = False

    def conflicts(self, buf: int, write: bool) -> tuple[bool, bool]:
        """Whether an access of ``buf`` can touch a region a DMA in flight writes, and
        (a write) one a DMA in flight reads."""
        if self.gathering:
            return False, False
        dst = self.dma_dst is None or buf in self.dma_dst
        src = write and (self.dma_src is None or buf in self.dma_src)
        return dst, src

    def second(self) -> TraceFacts:
        """The facts for the second trace."""
        return TraceFacts(frozenset(self.dst_found), frozenset(self.src_found),
                          frozenset(self.written_found))


class TracedState:
    """The traced state (see the module's docstring). ``old_read``: whether a swap's old
    value is read (where masks are tracked, a swap whose old value nothing reads reads
    no element)."""

    def __init__(self, bufs: list[Any], flag: Any, facts: TraceFacts,
                 dma: DmaTable | None = None, grid: GridContext | None = None,
                 log: list[Any] | None = None, masks: dict[int, Any] | None = None,
                 old_read: Any = None, fixed: list[Any] | None = None) -> None:
        self.bufs, self.flag, self.facts, self.dma, self.grid = bufs, flag, facts, dma, grid
        self.log, self.masks, self.old_read = log, masks, old_read
        # where set (a traced bool): the equations run unconditionally stand for a
        # branch taken only where it holds; every store and flag is conditioned on it
        self.pred: Any = None
        # a compiled launch's: the ``while`` iterations run so far (carried) and how many
        # it may run (a traced int32 operand of the executable); None: not counted
        self.loops: Any = None
        self.budget: Any = None
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

    def store(self, buf: int, view: View, value: Any) -> None:
        """Store ``value`` into region ``view`` of buffer ``buf`` (where ``pred`` is set,
        only where it holds: the region keeps its contents elsewhere)."""
        array = self.bufs[buf]
        if self.pred is not None:
            value = jnp.where(self.pred, jnp.broadcast_to(jnp.asarray(value, array.dtype),
                                                          view.shape), read_view(array, view))
        self.write(buf, write_view(array, view, value))

    def carry(self) -> tuple[Any, ...]:
        """What loops and conditionals carry: the buffers something writes (None in the
        place of the others), the flag, the DMA table's arrays and the masks."""
        if self.dma is not None:
            self.dma.flush(self)
        bufs = [b if self._carried(i) else None for i, b in enumerate(self.bufs)]
        return (bufs, self.flag, None if self.dma is None else self.dma.arrays(), self.masks,
                self.loops)

    def restore(self, carry: tuple[Any, ...]) -> None:
        if self.dma is not None and (self.dma.pending or self.dma.waits):
            raise AssertionError("a traced state restored over DMAs pending")
        bufs, self.flag, dma, masks, self.loops = carry
        self.bufs = [self.fixed[i] if b is None else b for i, b in enumerate(bufs)]
        if self.dma is not None:
            self.dma = self.dma.of(dma)
        self.masks = None if masks is None else dict(masks)

    def child(self, carry: tuple[Any, ...], log: bool = False) -> TracedState:
        """A state for a loop's body or a branch (``log``: with a log of its own)."""
        if self.pred is not None:
            raise AssertionError("a loop or conditional inside a branch run unconditionally")
        inner = TracedState(list(self.bufs), self.flag, self.facts, self.dma, self.grid,
                            [] if log and self.log is not None else None, None,
                            self.old_read, self.fixed)
        inner.budget = self.budget
        inner.restore(carry)
        return inner

    def raise_flag(self, bit: int, cond: Any) -> None:
        """Set flag ``bit`` where ``cond`` holds (a static False: nothing to trace)."""
        if im.is_static(cond) and not cond:
            return
        if self.pred is not None:
            cond = jnp.logical_and(self.pred, im.traced_bool(cond))
        self.flag = lax.bitwise_or(self.flag, lax.select(
            im.traced_bool(cond), np.int32(bit), np.int32(0)))

    def logged(self, view: View) -> None:
        """An access of ``view``: its start indices, to the log (if one is kept)."""
        if self.log is not None:
            self.log.append(jnp.stack([im.traced_index(s) for s in view.starts])
                            if view.starts else jnp.zeros((0,), jnp.int32))

    def check_access(self, buf: int, view: View, write: bool, reads: bool = True) -> None:
        """A core access (or block copy) of ``view`` of buffer ``buf`` that writes or
        not and ``reads`` its old contents: against the DMAs in flight and the mask of
        initialised elements."""
        if self.dma is not None and any(self.facts.conflicts(buf, write)):
            self.dma.flush(self)
            lo, hi = flat_span(self.bufs[buf].shape, view)
            self.raise_flag(FLAG_CONFLICT, self.dma.overlaps(self.facts, buf, lo, hi, write))
        masks = self.masks
        mask = None if masks is None else masks.get(buf)
        if masks is None or mask is None:
            return
        if reads:
            self.raise_flag(FLAG_UNINIT, jnp.logical_not(jnp.all(read_view(mask, view))))
        if write:
            masks[buf] = (jnp.bool_(True) if mask.ndim == 0 else  # (a ref stored whole)
                               write_view(mask, view, True))
