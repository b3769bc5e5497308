"""DMAs: a read phase (snapshot the source, signal the send semaphore) and a write phase
(store into the destination, signal the receive semaphore), each its own race-detector
actor forked from the issuing core.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from palladium.shared_memory.buffers import Buffer, stored_mask
from palladium.shared_memory.regions import AccessPlan
from palladium.shared_memory.semaphores import Semaphore

__all__ = ["Dma", "DmaState", "DmaView"]


@dataclasses.dataclass(frozen=True)
class DmaView:
    """How a DMA maps its source region onto its destination region when they are not
    the same elements in the same shape (the interpreter's reshaped or bitcast refs).

    ``src_mask``: the elements of the source region read (None: all; the bytes signalled
    are those of the True elements). ``convert``: turns the source region's data (the
    fill where not read) into the destination region's data. ``dst_mask``: the elements
    of the destination region written (None: all). Masks have the regions' shapes.
    """

    src_mask: np.ndarray | None = None
    dst_mask: np.ndarray | None = None
    convert: Callable[[np.ndarray], np.ndarray] | None = None


_PLAIN = DmaView()  # a DMA of the regions' elements as they are


def _report(event: Any, actor: Any, buf: Buffer, plan: AccessPlan, mask: Any, site: object,
            stored: bool) -> None:
    """Tell the race detector about the stored elements of ``plan`` (where ``mask``, of
    the region's shape; ``stored``: already of the stored elements only). A private
    buffer's accesses are not told: only its core makes them, they cannot race."""
    if buf.quiet:
        return
    race = plan.prepared or plan.race_access()
    if mask is None:
        event(actor, buf.ref.key, race, site=site)
        return
    sub = mask if stored else stored_mask(plan, mask)
    if sub.any():
        shape = buf.data[plan.index + (Ellipsis,)].shape
        event(actor, buf.ref.key, race, site=site, mask=np.broadcast_to(sub, shape))


def report_read(det: Any, actor: Any, buf: Buffer, plan: AccessPlan, mask: Any, site: object,
                *, stored: bool = False) -> None:
    """Tell the race detector that ``actor`` read the stored elements of ``plan``: the
    one place every read the detector hears of (loads, block copies, DMAs, remote reads,
    replayed accesses) is turned into its event."""
    _report(det.read, actor, buf, plan, mask, site, stored)


def report_write(det: Any, actor: Any, buf: Buffer, plan: AccessPlan, mask: Any, site: object,
                 *, stored: bool = False) -> None:
    """Tell the race detector that ``actor`` wrote the stored elements of ``plan``."""
    _report(det.write, actor, buf, plan, mask, site, stored)


def _report_release(det: Any, method: str, actor: Any, buf: Buffer, plan: AccessPlan,
                    mask: Any, site: object) -> Any:
    """A DMA's access told to the race detector and its clock released in one call
    (``det.read_release`` / ``det.write_release``: ``method``) when the access is one
    unmasked event; otherwise ``report_read`` / ``report_write`` then the release."""
    if mask is None and not buf.quiet:
        race = plan.prepared or plan.race_access()
        return getattr(det, method)(actor, buf.ref.key, race, site)
    if method == "read_release":
        _report(det.read, actor, buf, plan, mask, site, False)
        return det.release(actor)
    _report(det.write, actor, buf, plan, mask, site, False)
    return det.finish_release(actor)


class DmaState(enum.Enum):
    """Progress of a DMA: started, source read, destination written."""

    STARTED = 0
    READ = 1
    DONE = 2


class Dma:
    """One DMA in flight (owned by a ``Simulation``)."""

    __slots__ = (
        "actor", "add", "bits", "convert", "core", "data", "dst", "dst_mask", "dst_plan", "dst_sem",
        "hollow", "id", "name", "nbytes", "on_done", "on_unwritten", "queued", "site", "src", "src_mask",
        "sent", "src_plan", "src_sem", "state",
    )

    def __init__(
        self, dma_id: int, name: str, core: Any, src: Buffer, src_plan: AccessPlan, dst: Buffer,
        dst_plan: AccessPlan, src_sem: Semaphore | None, dst_sem: Semaphore, actor: Any, site: object,
        view: DmaView | None = None, add: bool = False,
    ) -> None:
        self.id = dma_id
        self.name = name
        self.core = core
        self.src = src
        self.src_plan = src_plan
        self.dst = dst
        self.dst_plan = dst_plan
        self.src_sem = src_sem
        self.dst_sem = dst_sem
        self.actor = actor
        self.site = site
        self.state = DmaState.STARTED
        self.queued = False
        self.data: np.ndarray | None = None
        view = view or _PLAIN  # not a new DmaView per DMA
        self.src_mask = view.src_mask
        self.dst_mask = view.dst_mask
        self.convert = view.convert
        self.add = add
        self.on_done: Callable[[], None] | None = None  # told when the DMA completes
        # A list to receive the data written (a DMA into another process's device).
        self.sent: list[Any] | None = None
        # uninitialized_reads: the written-ness of the source region (read phase), and who
        # is told when the DMA reads a source region nothing ever wrote.
        self.bits: np.ndarray | None = None
        self.on_unwritten: Callable[[Dma, np.ndarray], None] | None = None
        count = (math.prod(src_plan.shape) if view.src_mask is None
                 else int(np.count_nonzero(view.src_mask)))
        self.nbytes = count * src.data.dtype.itemsize
        # Between two buffers without data (``keep_float_data=False``), as it is: reading
        # the source gives the fill and the write checks bounds only, which ``dma_start``
        # did; the phases then only signal (``execute_read``, ``execute``).
        self.hollow = (src.phantom and dst.phantom and view.convert is None and not add
                       and view.src_mask is None and view.dst_mask is None)

    def queue(self) -> None:
        """Put this DMA on its semaphores' pending lists (it completes when waited for)."""
        self.queued = True
        self.dst_sem.add_pending(self)
        self.dst_sem.add_live(1)
        if self.src_sem is not None and self.src_sem is not self.dst_sem:
            self.src_sem.add_pending(self)
            self.src_sem.add_live(1)

    def signals(self, sem: Semaphore) -> bool:
        """Whether this DMA will still signal ``sem``."""
        if sem is self.dst_sem and self.state is not DmaState.DONE:
            return True
        return sem is self.src_sem and self.state is DmaState.STARTED

    def execute_for(self, sem: Semaphore, det: Any) -> None:
        """Run as far as needed to signal ``sem`` (read only for the send semaphore)."""
        if sem is self.dst_sem:
            self.execute(det)
        else:
            self.execute_read(det)

    def execute_read(self, det: Any) -> None:
        """Read the source and signal the send semaphore with the bytes read."""
        if self.state is not DmaState.STARTED:
            return
        plan = self.src_plan
        if det is None and self.hollow and self.sent is None and self.src.written is None:
            self._end_read(None, None, None)  # type: ignore[arg-type]
            return
        data = self.src.read(plan, False, "DMA read", self.core, self.site, self.src_mask)
        stored = self.src.written_bits(plan) if self.src.written is not None else None
        if det is not None and plan.index is not None:
            clock = _report_release(det, "read_release", self.actor, self.src, plan,
                                    self.src_mask, self.site)
            self._end_read(data, stored, clock)
        else:
            self.read_from(data, stored, det)

    def read_from(self, data: np.ndarray, stored: np.ndarray | None, det: Any) -> None:
        """End the read phase with ``data``, the source region as read (by this process,
        or by the one that owns the source); ``stored``: the written-mask of its stored
        elements (None: not tracked). Signals the send semaphore with the bytes read."""
        self._end_read(data, stored, det.release(self.actor) if det is not None else None)

    def _end_read(self, data: np.ndarray, stored: np.ndarray | None, clock: Any) -> None:
        """``read_from`` with the clock the read phase released (None: races off)."""
        self.data = data
        if stored is not None:
            self._read_bits(stored)
        self.state = DmaState.READ
        if self.src_sem is not None:
            if self.queued and self.src_sem is not self.dst_sem:
                self.src_sem.add_live(-1)
            self.src_sem.signal(self.nbytes, clock)

    def _read_bits(self, stored: np.ndarray) -> None:
        """Keep which elements of the source region were ever written (region-shaped;
        elements beyond the buffer or not read count as written); report a source
        region of which nothing was."""
        plan = self.src_plan
        if plan.full:
            bits = stored
        else:
            bits = np.ones(plan.shape, bool)
            bits[plan.pos] = stored
        if self.src_mask is not None:
            read = np.broadcast_to(np.asarray(self.src_mask, bool), plan.shape)
            bits = bits | ~read
            stored_read = stored_mask(plan, self.src_mask)
        else:
            stored_read = None
        self.bits = bits
        if self.on_unwritten is not None and stored.size and not stored.all():
            missing = ~stored if stored_read is None else ~stored & np.broadcast_to(
                stored_read, stored.shape)
            if missing.any() and not (stored if stored_read is None
                                      else stored & stored_read).any():
                self.on_unwritten(self, missing)

    def _carried_bits(self) -> np.ndarray:
        """The source's written-ness as the destination's stored elements will have it."""
        bits = self.bits
        assert bits is not None
        plan = self.dst_plan
        if self.convert is not None or bits.shape != plan.shape:
            bits = np.asarray(bits.all())  # a reshaped or bitcast view: all or nothing
        if not plan.full and bits.ndim:
            bits = bits[plan.pos]
        return bits

    def _write_bits(self, old: np.ndarray | None) -> None:
        """Carry the source's written-ness to the destination region."""
        bits = self._carried_bits()
        if old is not None:  # dst += src: written where both were
            bits = bits & old
        self.dst.set_written(self.dst_plan, bits, self.dst_mask)
        if self.src.taint is not None and not np.all(bits):
            self.dst.taint = self.src.taint  # where the uninitialised data came from
        self.bits = None

    def execute(self, det: Any) -> None:
        """Run both phases; signal the receive semaphore with the bytes written."""
        if self.state is DmaState.DONE:
            return
        self.execute_read(det)
        if (det is None and self.hollow and self.sent is None and self.dst.written is None
                and self.src.written is None):
            self._done(None)
            return
        data = self.data
        if self.convert is not None:
            assert data is not None
            if not data.flags.writeable:  # a buffer without data (keep_float_data=False):
                data = np.ascontiguousarray(data)  # a view of other dtype needs real bytes
            data = self.convert(data)
        if self.sent is not None:
            self._send(data, det)
            return
        plan = self.dst_plan
        if self.add:  # the destination accumulates: dst += data
            old = self.dst.read(plan, False, "DMA add", self.core, self.site, self.dst_mask)
            data = (old + data).astype(old.dtype, copy=False)
        old_bits = self.dst.written_bits(plan) if self.add else None
        self.dst.write(plan, data, self.dst_mask, "DMA write", self.core, self.site)
        if self.bits is not None and self.dst.written is not None:
            self._write_bits(old_bits)
        clock = None
        if det is not None:
            # Finished before the release, so the release does not tick: the clock it
            # hands to the receive semaphore holds the DMA's final time, and a core that
            # waited on it can give the DMA's slot to its next DMA
            # (RaceDetector._reusable_slot).
            if plan.index is not None:
                clock = _report_release(det, "write_release", self.actor, self.dst, plan,
                                        self.dst_mask, self.site)
            else:
                clock = det.finish_release(self.actor)
        self._done(clock)

    def _send(self, data: Any, det: Any) -> None:
        """Into another process's device: keep in ``sent`` what the owner applies (the
        data to store or add, the written-mask it carries or None, the clock released);
        the owner writes it and checks the write, where it lands."""
        assert self.sent is not None
        bits = None
        if self.bits is not None and self.dst.written is not None:
            bits = self._carried_bits()
        self.bits = None
        clock = None
        if det is not None:
            clock = det.finish_release(self.actor)
        self.sent[:] = [data, bits, clock]
        self._done(clock)

    def _done(self, clock: Any) -> None:
        self.data = None
        self.state = DmaState.DONE
        if self.queued:
            self.dst_sem.add_live(-1)
        self.dst_sem.signal(self.nbytes, clock)
        if self.on_done is not None:
            self.on_done()
