"""The buffers of a simulated launch (a ``Simulation`` collaborator): allocation, reads,
writes, swaps, block copies, reference counts, what was written."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from palladium.shared_memory.buffers import (
    Buffer,
    BufferRef,
    MemorySpace,
    is_float_dtype,
)
from palladium.shared_memory.dma import report_read, report_write
from palladium.shared_memory.errors import ConfigError, SimulationError, at_site, core_name
from palladium.shared_memory.options import SimulationOptions
from palladium.shared_memory.regions import AccessPlan
from palladium.shared_memory.sim_state import (
    CoreId,
    LaunchLinks,
    UninitializedOrigin,
    UninitializedReports,
    site_line,
)
from palladium.shared_memory.tpu_facts import padded_shape, uninitialized_value

_ELLIPSIS = (Ellipsis,)


class BufferStore:
    """Every buffer of a launch by key, and the operations on them (see ``API.md``).

    ``check_core`` validates a ``(device, core)``; ``links`` the race detector, a
    partitioned run's rounds and the observers (``sim_state.LaunchLinks``).
    """

    __slots__ = ("actor", "by_key", "check_core", "det", "links", "next_key", "oob_raise",
                 "found_uninitialized", "options", "out_of_bounds_hint", "phantom_floats",
                 "report_reads", "reports",
                 "rounds", "track_written")

    def __init__(self, options: SimulationOptions, links: LaunchLinks, *,
                 check_core: Callable[[Any], CoreId], reports: UninitializedReports,
                 out_of_bounds_hint: str) -> None:
        self.by_key: dict[int, Buffer] = {}  # the live buffers (freed ones are dropped)
        self.next_key: Iterator[int] = itertools.count()
        self.check_core = check_core
        self.links = links
        self.det, self.actor, self.rounds = links.det, links.actor, links.rounds
        self.reports = reports
        self.options = options
        self.out_of_bounds_hint = out_of_bounds_hint
        self.oob_raise = options.out_of_bounds == "raise"
        self.track_written = options.uninitialized_reads != "off"
        # "on_use": reads are not reported here (the client reports where it uses them)
        self.report_reads = options.uninitialized_reads in ("warn", "raise")
        # whether ``uninitialized`` found any element without initialised data
        self.found_uninitialized = False
        self.phantom_floats = not options.keep_float_data

    def get(self, buf: BufferRef) -> Buffer:
        """The buffer ``buf`` names; raises if it was freed."""
        b = self.by_key.get(buf.key)
        if b is None:
            raise SimulationError(f"buffer {buf.label} was used after it was freed")
        return b

    def allocate(
        self,
        space: MemorySpace,
        device: int,
        core: int,
        *,
        name: str,
        shape: Any = None,
        dtype: Any = None,
        value: np.ndarray | None = None,
        fill: str | None = None,
        private: bool = False,
        read_only: bool = False,
        storage: np.ndarray | None = None,
    ) -> BufferRef:
        """Allocate a buffer holding a copy of ``value`` (``read_only``: ``value`` itself,
        not writable through the buffer), else uninitialised memory.

        ``storage`` (no ``value``): a writable C-contiguous array of ``shape`` and
        ``dtype`` to hold the data instead of a new one, filled here as a new one would
        be (unused where the buffer holds no data): a caller allocating many buffers of
        one shape passes slices of one large array, whose memory the OS hands out in
        huge pages, not one 4 KiB page fault at a time.

        HBM and host memory belong to the device (``core`` is ignored); VMEM and SMEM to
        one core. ``private`` (VMEM/SMEM): the caller knows that no DMA started by another
        core will touch it, so only its core does and its accesses cannot race: the race
        detector does not hear of them. A DMA its own core starts on it makes it shared
        from then on (every earlier access of the core happens before that DMA); one
        started by another core is a ``ConfigError``. ``read_only``: the caller knows
        that nothing will write it during the run (an input nothing writes): reads cannot
        race with reads, so the race detector does not hear of them; a store or a DMA
        into it is a ``ConfigError``.
        """
        space = MemorySpace(space)
        core = 0 if space.per_device else int(core)
        self.check_core((device, core))
        # Another process's device (partitioned): a stand-in without data, never read.
        stand_in = self.rounds is not None and not self.rounds.is_local(device)
        if value is not None and (stand_in or self.phantom_floats and is_float_dtype(
                np.dtype(dtype) if dtype is not None else np.asarray(value).dtype)):
            # no data: the value is not copied (a zero-stride array of the fill)
            value = np.asarray(value, dtype=dtype)
            shape, dtype, value = value.shape, value.dtype, None
        if value is not None:
            if read_only:
                # never written: the buffer holds ``value`` itself, through a view numpy
                # refuses to write to (a launch's inputs are the callback's own copies)
                data = np.asarray(value, dtype=dtype).view()
                data.flags.writeable = False
            else:
                data = np.array(value, dtype=dtype, copy=True)
            if shape is not None and tuple(shape) != data.shape:
                raise ConfigError(f"buffer '{name}': value has shape {data.shape}, not {tuple(shape)}")
        else:
            if shape is None or dtype is None:
                raise ConfigError(f"buffer '{name}': give a value, or a shape and a dtype")
            dtype = np.dtype(dtype)
            fill_value = uninitialized_value(dtype, fill or self.options.uninitialized)
            shape = tuple(int(d) for d in shape)
            if shape and (stand_in or self.phantom_floats and is_float_dtype(dtype)):
                data = np.broadcast_to(np.asarray(fill_value, dtype), shape)
            elif storage is not None:
                if (storage.shape != shape or storage.dtype != dtype
                        or not storage.flags.writeable or not storage.flags.c_contiguous):
                    raise ConfigError(
                        f"buffer '{name}': storage is {'' if storage.flags.writeable else 'a read-only '}"
                        f"{storage.dtype}{list(storage.shape)}, not a writable C-contiguous "
                        f"{dtype}{list(shape)}")
                np.copyto(storage, fill_value, casting="unsafe")  # as np.full fills
                data = storage
            else:
                data = np.full(shape, fill_value, dtype)
        bound = data.shape
        # Host memory is not laid out in TPU tiles; SMEM holds scalars.
        options = self.options
        if options.bounds == "padded" and space in (MemorySpace.HBM, MemorySpace.VMEM):
            bound = padded_shape(data.shape, data.dtype, options.tiling,
                                 generation=options.tpu_generation)
        key = next(self.next_key)
        ref = BufferRef(key, space, int(device), core, name, data.shape, data.dtype)
        if private and space.per_device:
            raise ConfigError(f"buffer '{name}': {space.value} belongs to the device; only "
                              f"VMEM and SMEM can be private to a core")
        self.by_key[key] = buf = Buffer(
            ref, data, bound, uninitialized_value(data.dtype, fill or options.uninitialized),
            self.out_of_bounds_hint,
            np.full(data.shape, value is not None)
            if self.track_written and (data.flags.writeable or read_only)
            else np.broadcast_to(np.False_, data.shape) if self.track_written and stand_in
            else None,
        )
        buf.private, buf.read_only = private, read_only
        buf.quiet = private or read_only
        if self.rounds is not None:
            self.rounds.allocated(key, int(device), core, space.value)
        if self.det is not None and (self.rounds is None or self.rounds.is_local(device)):
            # (another process's buffer is checked by that process)
            self.det.register_buffer(key, data.shape, f"{name} ({ref.where})")
        if self.links.obs is not None:
            self.links.obs.allocate(ref, data.nbytes, (int(device), core))
        return ref

    def incref(self, buf: BufferRef) -> None:
        """One more owner of ``buf``: it survives one more ``free``."""
        self.get(buf).refcount += 1

    def free(self, buf: BufferRef) -> None:
        """Drop one reference; the last one deallocates the buffer."""
        b = self.get(buf)
        b.refcount -= 1
        if b.refcount == 0:
            del self.by_key[buf.key]
            if self.det is not None:
                self.det.free_buffer(buf.key)
            if self.links.obs is not None:
                self.links.obs.free(buf, b.data.nbytes, (buf.device, buf.core))

    def is_allocated(self, buf: BufferRef) -> bool:
        """Whether ``buf`` has not been freed yet."""
        return buf.key in self.by_key

    def contents(self, buf: BufferRef) -> np.ndarray:
        """The array ``buf`` holds, itself (not a copy): for a client that computes a
        whole run of accesses elsewhere and stores the result back in place. Nothing is
        checked, counted or told to the race detector: the client answers for that."""
        return self.get(buf).data

    def record_access(self, buf: BufferRef, region: Any, *, write: bool, core: CoreId,
                      site: object = None) -> None:
        """Tell the race detector of a read (or write) of ``buf[region]`` by ``core`` that
        a client did on the array of ``contents`` (the same event ``read``/``write``
        would give; nothing else is checked). No-op without the race detector."""
        if self.det is None:
            return
        b = self.by_key.get(buf.key) or self.get(buf)
        plan = b.plan(region)
        if plan.index is None:
            return
        report = report_write if write else report_read
        report(self.det, self.actor(core), b, plan, None, site)

    def watched(self, buf: BufferRef) -> bool:
        """Whether the race detector hears of accesses to ``buf`` now: races are on and
        the buffer is neither private to its core nor read-only (a client with accesses
        to report may skip those of an unwatched buffer: ``record_access`` ignores them)."""
        return self.det is not None and not (self.by_key.get(buf.key) or self.get(buf)).quiet

    def plan(self, buf: BufferRef, region: Any) -> AccessPlan:
        """``region`` of ``buf`` resolved once: pass the plan instead of the region to
        ``read``, ``write``, ``swap`` or ``dma_start`` (of ``buf`` or any buffer of the
        same shape and bounds) and neither the simulator nor the race detector parses
        the region again. A plan is immutable; keep it as long as the region is used."""
        return self.get(buf).plan(region)

    def read(self, buf: BufferRef, region: Any, *, mask: Any = None, core: CoreId, site: object = None,
             check_written: bool = True, agent: Any = None) -> np.ndarray:
        """A copy of ``buf[region]`` as read by ``core``.

        With ``mask`` (broadcastable to the region's shape) only the True elements are
        read: a False element may lie out of bounds (it reads the fill), and the race
        detector sees only the True ones. With ``uninitialized_reads`` on, reading an
        element nothing wrote is reported.
        """
        b = self.by_key.get(buf.key) or self.get(buf)
        plan = b.plan(region)
        if plan.full and not b.phantom:  # the common case, inlined: every load reads
            out = b.data[plan.index + _ELLIPSIS].copy()
        else:
            out = b.read(plan, self.oob_raise, "read", core, site, mask)
        if b.written is not None and check_written and self.report_reads:
            missing = b.unwritten(plan, mask)
            if missing is not None:
                self._report_unwritten(b, plan, missing, "read", core, site)
        if self.det is not None and plan.index is not None and not b.quiet:
            report_read(self.det, self.actor(core) if agent is None else agent, b, plan, mask,
                        site)
        return out

    def write(self, buf: BufferRef, region: Any, value: Any, *, mask: Any = None, core: CoreId,
              site: object = None, agent: Any = None) -> None:
        """Store ``value`` into ``buf[region]`` (only where ``mask`` is True); with
        ``agent`` (``fork_agent``) the race detector hears of it as the agent's."""
        b = self.by_key.get(buf.key) or self.get(buf)
        plan = b.plan(region)
        if b.read_only:
            raise b.read_only_error("a store", core, site)
        mask = b.write(plan, value, mask, "write", core, site)
        if self.det is not None and plan.index is not None and not b.quiet:
            self._race_write(core, buf.key, plan, mask, site, agent)

    def swap(self, buf: BufferRef, region: Any, value: Any, *, mask: Any = None, core: CoreId, site: object = None) -> np.ndarray:
        """Store ``value`` (where ``mask``) into ``buf[region]``; return the old contents."""
        b = self.by_key.get(buf.key) or self.get(buf)
        plan = b.plan(region)
        if b.read_only:
            raise b.read_only_error("a store", core, site)
        old, mask = b.swap(plan, value, mask, core, site)
        if self.det is not None and plan.index is not None and not b.quiet:
            self._race_write(core, buf.key, plan, mask, site)
        return old

    def _race_write(self, core: Any, key: Any, plan: AccessPlan, mask: Any, site: object,
                    agent: Any = None) -> None:
        """``mask``: of the stored elements already (what ``Buffer.write`` returns)."""
        assert self.det is not None
        report_write(self.det, self.actor(core) if agent is None else agent, self.by_key[key],
                     plan, mask, site, stored=True)

    # -- what was written (``uninitialized_reads``) ------------------------------------

    def copy(self, src: BufferRef, src_region: Any, dst: BufferRef, dst_region: Any, *,
             core: CoreId, site: object = None) -> np.ndarray:
        """``dst[dst_region] = src[src_region]`` done by ``core`` (a block copy): a read and
        a write for the race detector, carrying written-ness and taint (``read_block``,
        ``write_block``). Returns the data."""
        block = self.read_block(src, src_region, core=core, site=site)
        self.write_block(dst, dst_region, block, core=core, site=site)
        return block[0]

    # -- block transfers of the BlockSpec pipeline, in two halves ------------------------

    def fork_agent(self, core: CoreId, name: str) -> Any:
        """A race-detector actor forked from ``core`` now (None without the detector): a
        block transfer the BlockSpec pipeline runs beside the core (its DMA engine), whose
        accesses (``agent=`` of ``read``/``write``/``read_block``/``write_block``) race
        with whatever ``core`` does until ``join_agent``."""
        if self.det is None:
            return None
        return self.det.new_actor(name, parent=self.actor(core))

    def join_agent(self, core: CoreId, agent: Any) -> None:
        """The transfer ``agent`` is done: what it did happens-before ``core``'s future."""
        if agent is None or self.det is None:
            return
        self.det.finish(agent)
        self.det.join(self.actor(core), agent)

    def read_block(self, src: BufferRef, src_region: Any, *, core: CoreId, site: object = None,
                   agent: Any = None) -> tuple[np.ndarray, np.ndarray | None, Any]:
        """The first half of a block copy, read now (by ``agent`` if given): the data, which
        elements were written (None: all) and the source's buffer and plan (its taint).
        A partial edge block's padding is unwritten under "on_use" (garbage on a TPU)."""
        sb = self.by_key.get(src.key) or self.get(src)
        splan = sb.plan(src_region)
        data = self.read(src, splan, core=core, site=site, check_written=False, agent=agent)
        bits = None
        if sb.written is not None and not (splan.full and sb.is_clean()):
            # (a written source: the write of write_block marks the region already)
            bits = sb.written_bits(splan)
            if bits is None:
                bits = np.ones(splan.shape, bool)
            elif not splan.full:
                whole = np.full(splan.shape, not self.padding_uninitialized)
                whole[splan.pos] = bits
                bits = whole
        return data, bits, (sb, splan)

    def write_block(self, dst: BufferRef, dst_region: Any,
                    block: tuple[np.ndarray, np.ndarray | None, Any], *, core: CoreId,
                    site: object = None, agent: Any = None) -> None:
        """The second half: store a ``read_block`` result into ``dst[dst_region]`` (by
        ``agent`` if given), its written-ness and taint with it."""
        data, bits, (sb, splan) = block
        db = self.by_key.get(dst.key) or self.get(dst)
        dplan = db.plan(dst_region)
        self.write(dst, dplan, data, core=core, site=site, agent=agent)
        if db.written is not None and bits is not None:
            bits = bits if dplan.full else bits[dplan.pos]
            db.set_written(dplan, bits)
            if bits.all():
                pass
            elif sb.taint is not None:
                db.taint = sb.taint
            elif self.padding_uninitialized and not splan.full:
                db.taint = UninitializedOrigin(
                    f"the padding of a partial edge block of {sb.ref.label}: elements "
                    f"{db.describe_elements(dplan, ~bits)} of {db.ref.label} lie past the "
                    f"end of its {list(sb.logical)} array", site, "padding")

    @property
    def padding_uninitialized(self) -> bool:
        """Whether a block copy's padding (past its source's end) is uninitialised."""
        return self.options.uninitialized_reads == "on_use"

    def uninitialized_elements(self, buf: BufferRef, plan: AccessPlan) -> np.ndarray | None:
        """``uninitialized_reads="on_use"``: which elements of the planned region hold
        no initialised data (a mask of the region's shape; elements past the buffer's
        end count as uninitialised), or None when every element does (or nothing is
        tracked). Not a read: nothing is reported or told to the race detector."""
        b = self.by_key.get(buf.key) or self.get(buf)
        written = b.written
        if written is None or b.clean:
            return None
        if plan.full:
            part = written[plan.index + _ELLIPSIS]
            if part.all():
                return None
            self.found_uninitialized = True
            return ~part
        out = np.ones(plan.shape, bool)
        if plan.index is not None:
            out[plan.pos] = ~written[plan.index]
        self.found_uninitialized = True
        return out

    def set_initialized(self, buf: BufferRef, plan: AccessPlan, initialized: Any,
                        mask: Any = None, taint: Any = None) -> None:
        """After a store: which elements of the planned region (where ``mask``) now hold
        initialised data (``initialized``, broadcast to the region); ``taint``: where
        the uninitialised data stored came from (kept as the buffer's ``taint``)."""
        b = self.by_key.get(buf.key) or self.get(buf)
        if b.written is None or plan.index is None:
            return
        bits = np.broadcast_to(np.asarray(initialized, bool), plan.shape)
        if not plan.full:
            bits = bits[plan.pos]
        b.set_written(plan, bits, None if mask is None else
                      np.broadcast_to(np.asarray(mask, bool), plan.shape))
        if taint is not None:
            b.taint = taint

    def initialized_mask(self, buf: BufferRef) -> np.ndarray | None:
        """The array of ``buf``'s initialised elements itself (None: not tracked), for a
        client that works on ``contents`` elsewhere and writes the mask back in place."""
        b = self.by_key.get(buf.key) or self.get(buf)
        b.clean = None  # (the client may clear bits)
        return b.written

    def taint(self, buf: BufferRef) -> Any:
        """Where the uninitialised data ``buf`` holds came from (its ``taint``), or None."""
        return (self.by_key.get(buf.key) or self.get(buf)).taint

    def initialized(self, buf: BufferRef) -> bool:
        """Whether every element of ``buf`` holds initialised data (or nothing is
        tracked): a client may then work on its ``contents`` without tracking."""
        return (self.by_key.get(buf.key) or self.get(buf)).is_clean()

    def mark_written(self, buf: BufferRef, written: bool = True) -> None:
        """Mark every element of ``buf`` as written (or, ``written=False``, as never
        written: a block buffer about to hold the next block)."""
        b = self.get(buf)
        if b.written is not None:
            b.written[...] = written
            b.taint = None
            b.clean = written

    def unwritten(self, buf: BufferRef, region: Any) -> tuple[str, int, int] | None:
        """The elements of ``buf[region]`` nothing wrote, as (their bounding box in the
        buffer, e.g. ``[8:16, 0:128]``, how many, of how many); None if every element
        was written or ``uninitialized_reads`` is off. Not a read: nothing is reported."""
        b = self.get(buf)
        if b.written is None:
            return None
        plan = b.plan(region)
        missing = b.unwritten(plan)
        if missing is None:
            return None
        return b.describe_elements(plan, missing), int(np.count_nonzero(missing)), missing.size

    def report_uninitialized(self, text: str, key: object) -> None:
        """Deliver a client's uninitialised-memory report (an output nothing wrote) as
        the simulation's own: per ``uninitialized_reads``, once per ``key`` when warning.
        ``text`` is whole (the simulation's hint is not appended)."""
        self.reports.report(text, key, hint=False)

    def _report_unwritten(self, b: Buffer, plan: AccessPlan, missing: np.ndarray, what: str,
                          core: CoreId, site: object) -> None:
        n, total = int(np.count_nonzero(missing)), int(missing.size)
        text = (f"{core_name(core)}: {what} of never-written memory: {b.ref.label} region "
                f"{b.describe_elements(plan, missing)} ({n} of the {total} elements read were "
                f"never written by a store, DMA, block copy or input){at_site(site)}. On a "
                f"TPU these bytes are whatever an earlier kernel left there.")
        self.reports.report(text, (b.ref.name, b.ref.space, site_line(site)))

    def value(self, buf: BufferRef) -> np.ndarray:
        """The whole logical contents of ``buf`` (a copy; no race check)."""
        return np.array(self.get(buf).data)
