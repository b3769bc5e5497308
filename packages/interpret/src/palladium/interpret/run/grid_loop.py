"""The grid loop of a launch: which grid points each core runs, and one core's loop.

:func:`schedule` orders the grid (parallel dimensions permuted by the seed, the parallel
sub-grid split over the cores: megacore); :class:`CoreRun` walks one core's points,
copying a block HBM <-> VMEM only when its index changes, and checks that no output
block is revisited after it was written back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from palladium.interpret.errors import (
    KernelError,
    RevisitError,
    jax_revisit_phrase,
)
from palladium.interpret.eval.context import CoreId
from palladium.interpret.eval.evaluator import CoreEvaluator
from palladium.interpret.eval.site import Site
from palladium.interpret.kernel.blocks import BlockSpecInfo
from palladium.interpret.kernel.grid_blocks import GridBlocks
from palladium.interpret.kernel.jaxpr_checks import is_parallel
from palladium.interpret.kernel.prepared_kernel import PreparedKernel
from palladium.interpret.run.block_messages import BlockIndexHeadline, BlockIndexHint
from palladium.interpret.run.body_memo import BodyMemo
from palladium.interpret.run.grid_points import grid_points
from palladium.shared_memory import AccessPlan, BlockCopy

if TYPE_CHECKING:  # the launch creates the core runs
    from palladium.interpret.run.launch import Launch

__all__ = ["CoreRun", "parallel_dimensions", "schedule"]


GridPoint = tuple[int, ...]


def parallel_dimensions(kernel: PreparedKernel, grid: GridPoint, num_cores: int,
                    vmapped_dims: tuple[int, ...]) -> tuple[bool, ...]:
    """Which grid dimensions are parallel (a prefix of the grid, else ``KernelError``)."""
    n = len(grid)
    cp = kernel.compiler_params
    sem = getattr(cp, "dimension_semantics", None) if cp is not None else None
    if kernel.is_core_map:
        return (num_cores > 1,) * n
    if sem is None:
        own = [False] * (n - len(vmapped_dims))
    else:
        own = [is_parallel(s) for s in sem]
    # Under vmap jax prepends batch axes to the grid; Mosaic treats them as parallel.
    it = iter(own)
    flags = tuple(True if d in vmapped_dims else next(it, False) for d in range(n))
    for a, b in zip(flags, flags[1:]):
        if b and not a:
            raise KernelError(
                f"kernel '{kernel.name}': dimension_semantics {tuple(sem or ())} — "
                f"parallel dimensions must form a prefix of the grid {grid}"
            )
    return flags


def schedule(kernel: PreparedKernel, grid: GridPoint, num_cores: int,
             vmapped_dims: tuple[int, ...], seed: int) -> list[Sequence[GridPoint]]:
    """The grid points each core runs, in order (computed per index for a large grid:
    ``grid_points``)."""
    parallel = parallel_dimensions(kernel, grid, num_cores, vmapped_dims)
    return grid_points(grid, parallel, seed, num_cores, shuffle=not kernel.is_core_map)


class _StepSite:
    """Where a core's grid loop is, for the watchdog's message: formatted from the
    core's current grid point only when a message needs it (no object per step)."""

    __slots__ = ("run",)

    def __init__(self, run: CoreRun) -> None:
        self.run = run

    def __str__(self) -> str:
        return str(self.run._site(self.run.point or (), "grid step"))


class _CopySite:
    """Where a block copy happens (``CoreRun._copy_site``), made only when something
    reads it (a message): a grid step copies blocks far more often than it fails."""

    __slots__ = ("run", "info", "block", "point", "direction", "_site")

    def __init__(self, run: CoreRun, info: BlockSpecInfo, block: tuple[int, ...],
                 point: GridPoint, direction: str) -> None:
        self.run, self.info, self.block, self.point = run, info, block, point
        self.direction = direction  # "input" or "output"
        self._site: Site | None = None

    def site(self) -> Site:
        if self._site is None:
            self._site = self.run._copy_site(self.info, self.block, self.point,
                                             self.direction)
        return self._site

    def __getattr__(self, name: str) -> Any:  # (the Site's fields and source_line)
        if name.startswith("_"):  # (no copy or pickle protocol through the Site)
            raise AttributeError(name)
        return getattr(self.site(), name)

    def __str__(self) -> str:
        return str(self.site())


class CoreRun:
    """The grid loop of one simulated core."""

    def __init__(self, launch: Launch, core: CoreId, operands: list[Any],
                 points: Sequence[GridPoint], hbm_inputs: list[Any], hbm_outputs: list[Any],
                 aliased_outputs: set[int]) -> None:
        self.launch = launch
        self.core = core
        self.operands = operands
        self.points = points
        self.hbm_inputs = hbm_inputs
        self.hbm_outputs = hbm_outputs
        self.aliased = aliased_outputs
        k = launch.kernel
        n_idx = len(k.scalar_names)
        self.scalar_refs = operands[:n_idx]
        self.input_refs = operands[n_idx : n_idx + len(k.inputs)]
        self.output_refs = operands[n_idx + len(k.inputs) : n_idx + len(k.inputs) + len(k.outputs)]
        # The core's context: one per grid point (``ev.at(point)``), sharing the state
        # the core carries from one to the next.
        self.ev = CoreEvaluator(launch, core)
        self.point: tuple[int, ...] | None = None  # the grid point running now
        self.blocks = GridBlocks((*k.inputs, *k.outputs), len(k.grid_mapping.grid))
        # (operand, block index) -> the simulator's plans of the block's HBM region and
        # of the part of the VMEM/SMEM block it fills: resolved once per block, whatever
        # the number of visits, and kept with the kernel for its later launches. A block
        # that fills its whole kernel buffer (no pl.BoundedSlice dimension) has one
        # kernel-side plan per operand (key ``(operand, None)``).
        self._plans = k.copy_plans
        self._dmas = not k.programs.races_ok  # the kernel starts DMAs or uses semaphores
        # (static facts read at every step, looked up once: the spec's, read through)
        self._inputs, self._outputs, self._location = k.inputs, k.outputs, k.launch_location

    def _copy_plans(self, operand: int, block: tuple[int, ...]) -> tuple[AccessPlan, AccessPlan]:
        """(HBM plan, kernel-side plan) of the copy of ``block`` of ``operand`` (inputs
        first, then outputs)."""
        # (the cache's entry read first: a hit at nearly every grid step)
        return (self._plans.entries.get((operand, block))
                or self._plans.get((operand, block), self._resolve_copy, operand, block))

    def _resolve_copy(self, operand: int, block: tuple[int, ...]) -> tuple[AccessPlan, AccessPlan]:
        n_in = len(self.input_refs)
        if operand < n_in:
            hbm, kernel_ref = self.hbm_inputs[operand], self.input_refs[operand]
        else:
            hbm, kernel_ref = self.hbm_outputs[operand - n_in], self.output_refs[operand - n_in]
        sim, info = self.launch.sim, self.blocks.infos[operand]
        part = info.block_region(block)
        if part is None:  # the whole kernel buffer: one plan for every block
            inner = self._plans.get((operand, None), sim.plan, kernel_ref.buffer, None)
        else:
            inner = sim.plan(kernel_ref.buffer, part)
        return (sim.plan(hbm, info.region(block)), inner)

    def _block_indices(self, point: tuple[int, ...]) -> list[tuple[int, ...]]:
        fast = self.blocks.indices(point)
        if fast is not None:
            return fast
        ev = self.ev.at(point)
        out = []
        k = self.launch.kernel
        for info in (*k.inputs, *k.outputs):
            idx = ev.eval_closed(info.index_map, [*(np.int32(p) for p in point), *self.scalar_refs])
            out.append(tuple(int(np.asarray(i)) for i in idx))
        return out

    def _site(self, point: tuple[int, ...], what: str,
              copy: tuple[BlockSpecInfo, tuple[int, ...], str] | None = None) -> Site:
        """Where the loop is; a block copy's (``copy``: operand, block, kind) out-of-bounds
        error names the index map's answer against the valid blocks and suggests fixing
        it (``block_messages``)."""
        return Site(kernel=self.launch.kernel_name, core=self.core, grid_point=point, what=what,
                    source_info=self._location,
                    out_of_bounds_headline=None if copy is None else BlockIndexHeadline(
                        *copy, point),
                    out_of_bounds_hint=None if copy is None else BlockIndexHint(*copy[:2]))

    def run(self) -> None:
        self.ev.probe_environment()  # (once per core's run, not per grid step: ~4 us)
        self._run_grid()
        mxu = self.ev.state.mxu
        if mxu is not None and mxu.leftovers():
            site = self._site(self.point or (), "end of the kernel")
            raise KernelError(
                f"the kernel left {', '.join(mxu.leftovers())} at its end ({site}); a "
                "kernel must load every staged RHS (matmul_acc_lhs(load_staged_rhs=...)) "
                "and pop every accumulator slice it wrote (pltpu.matmul_pop)")

    def _run_grid(self) -> None:
        launch, sim, k = self.launch, self.launch.sim, self.launch.kernel
        params = launch.params
        n_in = len(k.inputs)
        visits: list[dict[tuple[int, ...], list[Any]]] = [{} for _ in k.outputs]
        last: list[tuple[int, ...] | None] = [None] * len(k.outputs)
        if launch.needs_initial_barrier:
            sim.barrier(self.core, site=self._site((), "initial barrier of all devices"))
        if not self.points:
            return
        cur = self._block_indices(self.points[0])
        prev: list[tuple[int, ...]] | None = None
        obs = sim.observers
        record = params.grid_point_recorder_call()
        tick, step_site = sim.tick, _StepSite(self)
        # The BlockSpec pipeline (as a TPU runs it): the next step's input blocks are
        # copied in while this step computes, from HBM as it is before this step's
        # outputs are written back; a write-back is waited for at the end of the next
        # step. Each transfer is an agent of its own for the race detector (forked from
        # the core when it starts, joined when it is waited for), so an output written
        # back where the next input block is being read (an in-place kernel whose output
        # runs ahead of its input) is a race, as on the chip (issue 42, item 3).
        # input -> (block, data, agent, site, the plan of its VMEM side)
        prefetched: dict[int, tuple[tuple[int, ...], Any, Any, Any, AccessPlan]] = {}
        inputs, outputs = self._inputs, self._outputs
        in_hbm = [info.in_hbm for info in inputs]
        out_in_hbm = [info.in_hbm for info in outputs]
        body = self.body = BodyMemo(k.jaxpr, params)  # (bodies that cannot differ: once)
        writing: list[Any] = []  # the agents of the last step's write-backs
        for step, point in enumerate(self.points):
            self.point = point
            ev = self.ev.at(point)
            # Ctrl-C (a cancelled run) and the watchdog are seen here at every grid step,
            # also by a kernel with no scheduling point of its own: a flag read and a
            # clock read (the site is formatted only for the watchdog's message).
            tick(step_site)
            if record is not None:
                record(point, self.core[1])
            if obs is not None:
                obs.grid_step_begin(self.core, step, point)
            for i, info in enumerate(inputs):
                if in_hbm[i] or (prev is not None and prev[i] == cur[i]):
                    continue
                early = prefetched.pop(i, None)
                if early is not None and early[0] == cur[i]:
                    _, block, agent, site, vmem = early
                    sim.join_agent(self.core, agent)
                else:  # the first step's: copied before the grid starts
                    hbm, vmem = self._copy_plans(i, cur[i])
                    site = _CopySite(self, info, cur[i], point, "input")
                    block = sim.read_block(self.hbm_inputs[i], hbm, core=self.core, site=site)
                sim.write_block(self.input_refs[i].buffer, vmem, block, core=self.core, site=site)
                if obs is not None:
                    obs.block_copy(BlockCopy(self.core, info.name, "in", cur[i], block[0].nbytes,
                                             step, point, info.buffer_count, info.space))
            nxt = self._block_indices(self.points[step + 1]) if step + 1 < len(self.points) else None
            if nxt is not None:
                self._prefetch(nxt, cur, step + 1, prefetched, in_hbm)
            body.run(ev, point, self.operands, self.core, obs)
            if obs is not None:
                obs.grid_step_end(self.core, step, point)
            done, writing = writing, []
            for o, info in enumerate(outputs):
                if out_in_hbm[o]:
                    continue
                b = cur[n_in + o]
                if nxt is None or nxt[n_in + o] != b:
                    site = _CopySite(self, info, b, point, "output")
                    hbm, vmem = self._copy_plans(n_in + o, b)
                    block = sim.read_block(self.output_refs[o].buffer, vmem, core=self.core,
                                           site=site)
                    # (an agent of its own only where something else may touch that
                    # HBM meanwhile: the aliased input's next copy, the kernel's DMAs)
                    agent = (sim.fork_agent(self.core, f"write-back of block {b} of output "
                                                       f"'{info.name}' at grid point {point}")
                             if o in self.aliased or self._dmas else None)
                    sim.write_block(self.hbm_outputs[o], hbm, block, core=self.core, site=site,
                                    agent=agent)
                    writing.append(agent)
                    data = block[0]
                    if nxt is not None:  # the buffer's next block starts unwritten
                        sim.mark_written(self.output_refs[o].buffer, False)
                    if obs is not None:
                        obs.block_copy(BlockCopy(self.core, info.name, "out", b, data.nbytes,
                                                 step, point, info.buffer_count, info.space))
                if o in self.aliased:
                    continue
                if last[o] == b:
                    visits[o][b][1] = point
                elif b in visits[o]:
                    first, prev_last = visits[o][b]
                    line = self._site(point, "").source_line
                    raise RevisitError(
                        f"{jax_revisit_phrase(b, o, point)}: "
                        f"kernel '{launch.kernel_name}': output '{info.name}' block {b} is "
                        f"revisited at grid point {point} on core {self.core[1]}; it was written "
                        f"at grid points {first} through {prev_last} and already copied back to "
                        f"HBM when the grid moved on, so that result would be lost. An output's "
                        f"block index may only change between consecutive grid points"
                        + (f" ({line})." if line else ".")
                    )
                else:
                    visits[o][b] = [point, point]
                last[o] = b
            for agent in done:  # the step before's write-backs: waited for now
                sim.join_agent(self.core, agent)
            prev, cur = cur, nxt if nxt is not None else cur
        for agent in writing:
            sim.join_agent(self.core, agent)

    def _prefetch(self, nxt: list[tuple[int, ...]], cur: list[tuple[int, ...]], step: int,
                  prefetched: dict[int, tuple[tuple[int, ...], Any, Any, Any, AccessPlan]],
                  in_hbm: list[bool]) -> None:
        """Start copying grid step ``step``'s input blocks (``nxt``) that differ from this
        step's (``cur``): read from HBM now, each by an agent of its own."""
        sim = self.launch.sim
        point = self.points[step]
        for i, info in enumerate(self._inputs):
            if in_hbm[i] or nxt[i] == cur[i]:
                continue
            site = _CopySite(self, info, nxt[i], point, "input")
            hbm, vmem = self._copy_plans(i, nxt[i])
            # (an input nothing writes is read-only: no agent, no race to report)
            agent = (sim.fork_agent(self.core, f"copy of block {nxt[i]} of input '{info.name}' "
                                               f"for grid point {point}")
                     if sim.watched(self.hbm_inputs[i]) else None)
            prefetched[i] = (nxt[i], sim.read_block(self.hbm_inputs[i], hbm, core=self.core,
                                                    site=site, agent=agent), agent, site, vmem)

    def _copy_site(self, info: BlockSpecInfo, block: tuple[int, ...], point: GridPoint,
                   direction: str) -> Site:
        """The site of the copy of ``block`` of ``info``'s operand at ``point``
        (``direction``: ``"input"``, into the kernel's memory, or ``"output"``, to HBM)."""
        what = (f"copy of block {block} of input '{info.name}' into {info.space.name}"
                if direction == "input" else f"copy of block {block} of output '{info.name}' to HBM")
        return self._site(point, what, (info, block, direction))
