"""``Simulation.dma_start``: a DMA checked, told to the race detector and observers, and
handed to the launch's ``DmaQueue`` (``dma_queue``), which runs it when it is needed."""

from __future__ import annotations

from typing import Any

from palladium.shared_memory.buffers import BufferRef, outside_mask
from palladium.shared_memory.dma import Dma, DmaView
from palladium.shared_memory.errors import ConfigError, at_site, core_name
from palladium.shared_memory.observer import dma_event
from palladium.shared_memory.regions import AccessPlan, describe_region
from palladium.shared_memory.sim_state import CoreId, SimulationState, site_line


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


class DmaOps(SimulationState):
    """``Simulation``'s DMA operations (waiting for one is a semaphore wait)."""

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
        task = self._task()
        self._sched.check()
        sb, db = self._buffer(src), self._buffer(dst)
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
        if sp.oob and self._oob_raise and (src_mask is None or outside_mask(sp, src_mask).any()):
            raise sb.oob_error("DMA read", sp, core, site, hint=True)
        db.check_write_bounds(dp, dst_mask, "DMA write", core, site)
        if dst_core is None:
            # Like the reference: the same core index on the destination's device.
            dst_core = core if dst.device == core[0] else (dst.device, core[1])
        dst_core = (int(dst_core[0]), int(dst_core[1]))
        remote = self._rounds is not None and self._rounds.crosses(src, dst, dst_core)
        dsem = self._sem(dst_core, dst_sem)
        ssem = self._sem(core, src_sem) if src_sem is not None else None
        queue = self.dma_queue
        dma_id = queue.next_id()
        if name is None:
            name = f"DMA #{dma_id} {src.name}->{dst.name}"
        actor = None
        if self._det is not None:
            actor = self._det.new_actor(name, parent=self._actor(core))
        dma = Dma(dma_id, name, core, sb, sp, db, dp, ssem, dsem, actor, site, view, add)
        if sb.written is not None:
            dma.on_unwritten = self._dma_of_unwritten
        if self._obs is not None:
            event = dma_event(dma, dst_core)
            self._obs.dma_start(event)
            dma.on_done = lambda obs=self._obs: obs.dma_complete(event)
        if remote:
            assert self._rounds is not None
            self._rounds.start_dma(dma, dst_core)
        else:
            queue.add(dma)
        self._sched.yield_point(task)

    def _dma_of_unwritten(self, dma: Dma, missing: Any) -> None:
        """A DMA's source region was never written at all (``uninitialized_reads``)."""
        src = dma.src
        region = src.describe_elements(dma.src_plan, missing)
        text = (f"{core_name(dma.core)}: a DMA ({dma.name}) reads never-written memory: "
                f"{src.ref.label} region {region} (none of the elements it copies was ever "
                f"written by a store, DMA, block copy or input){at_site(dma.site)}. On a TPU "
                f"it copies whatever an earlier kernel left there.")
        self._report_uninitialized(text, (src.ref.name, src.ref.space, site_line(dma.site)))
