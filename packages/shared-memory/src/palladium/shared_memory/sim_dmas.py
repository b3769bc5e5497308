"""The DMA starts of a simulated launch (a ``Simulation`` collaborator): a DMA checked,
told to the race detector and observers, and handed to the launch's ``DmaQueue``
(``dma_queue``), which runs it when it is needed."""

from __future__ import annotations

from typing import Any

from palladium.shared_memory.buffers import BufferRef, outside_mask
from palladium.shared_memory.dma import Dma, DmaView
from palladium.shared_memory.dma_queue import DmaQueue
from palladium.shared_memory.errors import ConfigError, at_site, core_name
from palladium.shared_memory.observer import dma_event
from palladium.shared_memory.regions import AccessPlan, describe_region
from palladium.shared_memory.semaphore_table import SemaphoreTable
from palladium.shared_memory.sim_buffers import BufferStore
from palladium.shared_memory.sim_state import CoreId, LaunchLinks, UninitializedReports, site_line


def _described(region: Any) -> str:
    """``region`` (or a plan's region) as messages show it."""
    return describe_region(region.region if region.__class__ is AccessPlan else region)


def _share(b: Any, core: CoreId, site: object) -> None:
    """A DMA that ``core`` starts on the private buffer ``b`` makes it shared: from now on
    the race detector hears of its accesses. Sound for its own core's DMA (every earlier
    access of the core happens before the DMA starts); another core's DMA could race
    with accesses never recorded, so the caller's promise was wrong."""
    if not b.private:
        return
    if (b.ref.device, b.ref.core) != (int(core[0]), int(core[1])):
        raise ConfigError(
            f"{core_name(core)}: a DMA reaches {b.ref.label}, which was allocated private to "
            f"{core_name((b.ref.device, b.ref.core))}{at_site(site)}: only that core's own "
            f"DMAs may reach a private buffer (its accesses before them were not recorded). "
            f"Allocate it shared (the default), or with palladium.interpret report this as a "
            f"bug and run with InterpretParams(detect_races=False) meanwhile."
        )
    b.private = False
    b.quiet = b.read_only


class DmaIssuer:
    """Starts the DMAs of a launch between the buffers of ``buffers``, signalling the
    semaphores of ``semaphores``, into ``queue`` (waiting for one is a semaphore wait,
    ``sim_semaphores``). ``links``: the race detector, a partitioned run's rounds, the
    current scheduler and observers (``LaunchLinks``)."""

    __slots__ = ("actor", "buffers", "det", "links", "local", "oob_raise", "queue",
                 "reports", "rounds", "semaphores")

    def __init__(self, buffers: BufferStore, semaphores: SemaphoreTable, queue: DmaQueue,
                 links: LaunchLinks, reports: UninitializedReports) -> None:
        self.buffers, self.semaphores, self.queue = buffers, semaphores, queue
        self.links = links
        self.det, self.actor, self.rounds = links.det, links.actor, links.rounds
        self.local = links.local
        self.reports = reports
        self.oob_raise = buffers.oob_raise

    def dma_start(
        self,
        src: BufferRef,
        src_region: Any,
        dst: BufferRef,
        dst_region: Any,
        *,
        core: CoreId,
        dst_sem: Any,
        src_sem: Any = None,
        dst_core: CoreId | None = None,
        site: object = None,
        name: str | None = None,
        view: DmaView | None = None,
        add: bool = False,
    ) -> None:
        """Start copying ``src[src_region]`` into ``dst[dst_region]`` (see API.md); with
        ``add`` the destination accumulates (``dst += src``) instead. Either region may
        be a plan (``plan``) of its buffer."""
        task = getattr(self.local, "task", None)
        self.links.sched.check()
        sb, db = self.buffers.get(src), self.buffers.get(dst)
        if sb.quiet or db.quiet:
            if db.read_only:
                raise db.read_only_error(f"a DMA into {dst.name}", core, site)
            _share(sb, core, site)
            _share(db, core, site)
        sp, dp = sb.plan(src_region), db.plan(dst_region)
        if view is None and sp.shape != dp.shape:
            raise ConfigError(
                f"{core_name(core)}: DMA from {src.label}{_described(src_region)} (shape "
                f"{sp.shape}) to {dst.label}{_described(dst_region)} (shape {dp.shape}): "
                f"the shapes differ{at_site(site)}"
            )
        if view is None and sb.data.dtype != db.data.dtype:
            # A DMA moves bytes: it never converts values (a view's ``convert`` may).
            raise ConfigError(
                f"{core_name(core)}: DMA from {src.label} ({sb.data.dtype}) to {dst.label} "
                f"({db.data.dtype}): the dtypes differ; a DMA copies bytes{at_site(site)}"
            )
        src_mask = None if view is None else view.src_mask
        dst_mask = None if view is None else view.dst_mask
        if sp.oob and self.oob_raise and (src_mask is None or outside_mask(sp, src_mask).any()):
            raise sb.oob_error("DMA read", sp, core, site, hint=True)
        if dp.oob:
            db.check_write_bounds(dp, dst_mask, "DMA write", core, site)
        if dst_core is None and dst.device == core[0] and type(core[0]) is int \
                and type(core[1]) is int:
            dst_core = core  # (the common case: this core, its ints as they are)
        else:
            if dst_core is None:
                # Like the reference: the same core index on the destination's device.
                dst_core = core if dst.device == core[0] else (dst.device, core[1])
            dst_core = (int(dst_core[0]), int(dst_core[1]))
        remote = self.rounds is not None and self.rounds.crosses(src, dst, dst_core)
        dsem = self.semaphores.get(dst_core, dst_sem)
        ssem = self.semaphores.get(core, src_sem) if src_sem is not None else None
        queue = self.queue
        dma_id = queue.next_id()
        if name is None:
            name = f"DMA #{dma_id} {src.name}->{dst.name}"
        actor = None
        if self.det is not None:
            actor = self.det.new_actor(name, parent=self.actor(core))
        dma = Dma(dma_id, name, core, sb, sp, db, dp, ssem, dsem, actor, site, view, add)
        if sb.written is not None and self.reports.mode in ("warn", "raise"):
            dma.on_unwritten = self._dma_of_unwritten
        obs = self.links.obs
        if obs is not None:
            event = dma_event(dma, dst_core)
            obs.dma_start(event)
            if obs.wants("dma_complete"):  # (no callback per DMA for no listener)
                dma.on_done = lambda obs=obs: obs.dma_complete(event)
        if remote:
            assert self.rounds is not None
            self.rounds.start_dma(dma, dst_core)
        else:
            queue.add(dma)
        self.links.sched.yield_point(task)

    def _dma_of_unwritten(self, dma: Dma, missing: Any) -> None:
        """A DMA's source region was never written at all (``uninitialized_reads``)."""
        src = dma.src
        region = src.describe_elements(dma.src_plan, missing)
        text = (f"{core_name(dma.core)}: a DMA ({dma.name}) reads never-written memory: "
                f"{src.ref.label} region {region} (none of the elements it copies was ever "
                f"written by a store, DMA, block copy or input){at_site(dma.site)}. On a TPU "
                f"it copies whatever an earlier kernel left there.")
        self.reports.report(text, (src.ref.name, src.ref.space, site_line(dma.site)))
