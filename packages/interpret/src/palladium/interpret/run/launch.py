"""One kernel launch: the simulated memory, the grid loop on every core, the outputs.

Created per host call and dropped afterwards, so a failure leaves nothing. By job:
:mod:`~palladium.interpret.run.memory_map` (operands, scratch, scoped allocations, peer
buffers), :mod:`~palladium.interpret.run.grid_loop` (iteration order, megacore split, each
core's loop and revisit check), and :class:`Launch`, which ties them together and
answers the evaluator's questions (``eval.context.LaunchServices``) for a core and grid
point it is given.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.chip import DEFAULT_CHIP, chip_record
from palladium.interpret.errors import (
    KernelError,
    PalladiumError,
    UninitializedUseError,
    UnsupportedFeatureError,
)
from palladium.interpret.eval.context import CoreId, Where
from palladium.interpret.eval.program import ProgramCache
from palladium.interpret.eval.steering_values import unused_values
from palladium.interpret.eval.value_shadows import describe_origin, fix_hint
from palladium.interpret.kernel.jaxpr_checks import negative_grid_message
from palladium.interpret.kernel.prepared_kernel import PreparedKernel
from palladium.interpret.observe.observers import LaunchInfo, launch_observers, may_observe
from palladium.interpret.params import InterpretParams
from palladium.interpret.run.devices import DeviceMesh
from palladium.interpret.run.execution_plan import SIMULATED, ExecutionPlan, plan_launch
from palladium.interpret.run.grid_loop import CoreRun, schedule
from palladium.interpret.run.memory_map import MemoryMap
from palladium.interpret.run.output_blocks import output_storage
from palladium.interpret.state.process_state import STATE
from palladium.race_detect.call_log import MAX_KEYS
from palladium.shared_memory import (
    BufferRef,
    Observer,
    ObserverSet,
    Partition,
    SemaphoreLeakError,
    Simulation,
)

_UNINITIALIZED_HINT = (
    "Write every element before it is read (initialise scratch and accumulators, e.g. "
    "under pl.when(pl.program_id(...) == 0)); for a kernel that means it, pass "
    "InterpretParams(uninitialized_reads='off')."
)

_OUT_OF_BOUNDS_HINT = (
    "Pass InterpretParams(out_of_bounds_reads='uninitialized') to read uninitialised values "
    "there, or buffer_bounds='padded' to allow reads into TPU tile padding."
)


def launch_grid(kernel: PreparedKernel, dyn: list[Any]) -> tuple[int, ...]:
    """The grid of a launch of ``kernel`` whose dynamic grid bounds are ``dyn``."""
    it = iter(dyn)
    return tuple(int(np.asarray(next(it))) if isinstance(g, jc.DynamicGridDim) or g is None
                 else int(g) for g in kernel.grid_mapping.grid)


def _target_key(core_id: CoreId, device_id: Any, core_index: Any,
                id_type: Any) -> tuple[Any, ...] | None:
    """What ``Launch.remote_core`` answers from: the core, the id type and the integer
    value of each part of ``device_id`` (a tuple, a list or one value; each a Python int
    or an integer numpy scalar or 0-d array); None for anything else (a ``core_index``,
    a ``{axis: index}`` dict, a float): then it is resolved on every call."""
    if core_index is not None:
        return None
    parts = device_id if type(device_id) is tuple or type(device_id) is list else (device_id,)
    key: list[Any] = [core_id, id(id_type)]
    for p in parts:
        t = type(p)
        if t is int:
            key.append(p)
        elif (t is np.ndarray and not p.ndim or isinstance(p, np.integer)) and p.dtype.kind in "iu":
            key.append(int(p))
        else:
            return None
    return tuple(key)


class Launch:
    """The state of one kernel launch, shared by the cores that run it."""

    def __init__(self, kernel: PreparedKernel, params: InterpretParams,
                 mesh: DeviceMesh | None = None, *, observe: bool = True,
                 partition: Partition | None = None, plan: ExecutionPlan | None = None) -> None:
        self.kernel = kernel
        self.params = params
        self.observe = observe  # False: a re-run (order trials), not shown to observers
        #: How this launch runs, and why (``execution_plan.py``); without one (a launch
        #: made outside ``jax_hook``), the plan of the kernel's next launch number.
        self.plan: ExecutionPlan = plan if plan is not None else plan_launch(
            kernel, params, kernel.launches.next(), observed=may_observe(params))
        self.mesh = mesh if mesh is not None else DeviceMesh()
        self.num_devices = max(self.mesh.num_devices, 1)
        self.kernel_name = kernel.name
        self.programs: ProgramCache = kernel.programs
        self.inherited_sources: dict[int, Any] = kernel.inherited_sources
        # skip_unused_integer_ops: what the body computes that steers nothing (not where
        # an output aliases an input: a block written back may be read again)
        self.unused_values = (
            unused_values(kernel.jaxpr)
            if params.skip_unused_integer_ops and not kernel.spec.input_output_aliases
            else None)
        gm = kernel.grid_mapping
        self.chip = params.chip or DEFAULT_CHIP
        self.chip_record = chip_record(self.chip)
        self.num_cores = (
            math.prod(kernel.mesh.shape.values()) if kernel.is_core_map
            else params.num_cores_or_threads
        )
        if params.dma_order_trials:
            # each trial runs under its own seed, so its own memo key: room for them all
            kernel.race_memo.reserve(MAX_KEYS * (1 + params.dma_order_trials))
        self.sim = Simulation(
            self.num_devices,
            self.num_cores,
            options=params.simulation_options(self.chip_record.generation),
            watchdog_hint=("Raise InterpretParams(watchdog_timeout=...) if the kernel is "
                           "merely slow, or pass None to turn the watchdog off."),
            out_of_bounds_hint=_OUT_OF_BOUNDS_HINT,
            uninitialized_hint=_UNINITIALIZED_HINT,
            snapshot_bytes=params.failure_snapshot_bytes,
            partition=partition,
            race_memo=kernel.race_memo,
        )
        # The devices this process runs (all of them unless split over processes).
        self.local_devices = (frozenset(range(self.num_devices)) if partition is None
                              else partition.local_devices)
        self.core_runs: dict[CoreId, CoreRun] = {}
        self.sim.grid_point_of = self._grid_point_of
        self.memory = MemoryMap(self.sim, kernel, params, self.num_cores)
        self.vmapped_dims = tuple(gm.vmapped_dims)
        self.grid_names = tuple(gm.grid_names) if gm.grid_names is not None else ()
        self.grid: tuple[int, ...] = ()
        self._targets: dict[tuple[Any, ...], CoreId] = {}  # remote_core's answers

    # --- what the evaluator may ask (eval.context.LaunchServices) -----------------------
    @property
    def number(self) -> int:
        """Which launch of the kernel in this process this is (1 for the first; a trial
        rerun has the number of the launch it checks)."""
        return self.plan.number

    @property
    def collective_id(self) -> int | None:
        """The kernel's ``CompilerParams(collective_id=...)`` (None without one)."""
        cid = getattr(self.kernel.compiler_params, "collective_id", None)
        return None if cid is None else int(cid)

    @property
    def debug_checks(self) -> bool:
        """Whether ``pl.debug_check`` checks (``pl.enable_debug_checks`` at lowering)."""
        return self.kernel.debug_checks

    def program_ids(self, grid_point: tuple[int, ...] | None) -> tuple[int, ...]:
        point = grid_point or ()
        return tuple(p for d, p in enumerate(point) if d not in self.vmapped_dims)

    def program_counts(self) -> tuple[int, ...]:
        return tuple(n for d, n in enumerate(self.grid) if d not in self.vmapped_dims)

    def axis_index(self, core: CoreId, grid_point: tuple[int, ...] | None, name: Any,
                   where: Where) -> tuple[int, int]:
        if name in self.kernel.core_axis_names:
            return core[1], self.num_cores
        if name in self.grid_names:
            d = self.grid_names.index(name)
            return (grid_point or ())[d], self.grid[d]
        position = self.mesh.axis_position(core[0], name)
        if position is not None:
            return position
        raise UnsupportedFeatureError(
            f"lax.axis_index('{name}'): the axis is neither a grid axis, a core axis of "
            f"this kernel, nor a mesh axis of the surrounding shard_map {self.mesh.axis_names} "
            f"({where()})"
        )

    def remote_core(self, core_id: CoreId, device_id: Any, core_index: Any, id_type: Any,
                    where: Where) -> CoreId | None:
        if device_id is None and core_index is None:
            return None
        # A ring's DMA names its peer the same way on every step: the answer for these
        # integer values is kept for the launch (a failed resolution raises, never kept).
        key = _target_key(core_id, device_id, core_index, id_type)
        if key is not None:
            known = self._targets.get(key)
            if known is not None:
                return known
        target = self._remote_core(core_id, device_id, core_index, id_type, where)
        if key is not None and target is not None:
            self._targets[key] = target
        return target

    def _remote_core(self, core_id: CoreId, device_id: Any, core_index: Any, id_type: Any,
                     where: Where) -> CoreId | None:
        device, core = core_id
        if device_id is not None:
            device, axis_core = self.mesh.resolve(
                device_id, id_type, core_id[0], self.kernel.core_axis_names,
                lambda: str(where()),
            )
            if axis_core is not None:
                if core_index is not None:
                    raise KernelError(
                        f"both core_index and a core axis in device_id name the target core "
                        f"({where()})"
                    )
                core = axis_core
        if core_index is not None:
            core = int(np.asarray(core_index))
        if not 0 <= core < self.num_cores:
            raise KernelError(
                f"remote operation targets core {core}, but the kernel runs on "
                f"{self.num_cores} core(s) ({where()})"
            )
        return (device, core)

    # --- the launch itself ------------------------------------------------------------------
    def execute_devices(self, device_args: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """Run the launch on every device at once (``device_args[d]``: device ``d``'s
        operands) in one simulation; each device's outputs."""
        k = self.kernel
        gm = k.grid_mapping
        n_dyn, n_idx = gm.num_dynamic_grid_bounds, gm.num_index_operands
        grids = {self._grid(args[:n_dyn]) for args in device_args}
        if len(grids) != 1:
            raise KernelError(
                f"kernel '{self.kernel_name}': the devices' dynamic grids differ {sorted(grids)}; "
                f"every device of a launch must run the same grid"
            )
        self.grid = grids.pop()
        if self.observe:
            launch_info = LaunchInfo(self.kernel_name, self.grid, len(device_args),
                                     self.num_cores, self.chip, self.params, k,
                                     k.launch_location, self.plan)
            for observer in launch_observers(
                    launch_info, lambda observers: self._final_info(launch_info, observers)):
                self.sim.add_observer(observer)
        if not self.plan.trial:
            k.launches.last_plan = self.plan
        aliases = {o: i - n_idx for i, o in k.input_output_aliases}
        if any(i < 0 for i in aliases.values()):
            raise UnsupportedFeatureError("aliasing a scalar-prefetch operand to an output")
        for o, i in aliases.items():
            if k.outputs[o].has_element_padding or k.inputs[i].has_element_padding:
                raise UnsupportedFeatureError(
                    f"output '{k.outputs[o].name}' aliases input '{k.inputs[i].name}' and "
                    f"one of them has pl.Element padding"
                )
        points = schedule(k, self.grid, self.num_cores, self.vmapped_dims, self.params.seed)
        bodies = {}
        device_outputs = []
        storage = {o: output_storage(k, info.padded_shape, info.dtype, len(device_args))
                   for o, info in enumerate(k.outputs) if o not in aliases}
        for device, args in enumerate(device_args):
            scalars, inputs = args[n_dyn : n_dyn + n_idx], args[n_dyn + n_idx :]
            hbm_inputs = [self.memory.hbm_operand(device, info, np.asarray(x),
                                                  read_only=i in k.read_only_inputs)
                          for i, (info, x) in enumerate(zip(k.inputs, inputs))]
            hbm_outputs = []
            for o, info in enumerate(k.outputs):
                if o in aliases:
                    hbm_outputs.append(hbm_inputs[aliases[o]])
                else:
                    hbm_outputs.append(self.memory.hbm_output(device, info,
                                                              storage[o][device]))
            device_outputs.append(hbm_outputs)
            for c in range(self.num_cores):
                core = (device, c)
                operands = self.memory.core_operands(core, scalars, hbm_inputs, hbm_outputs)
                run = CoreRun(self, core, operands, points[c], hbm_inputs, hbm_outputs,
                              set(aliases))
                self.core_runs[core] = run
                if device in self.local_devices:
                    bodies[core] = run.run
        try:
            try:
                self._run(bodies)
            finally:
                if self.sim.buffers.found_uninitialized:
                    k.reads_uninitialized = True
            for device, hbm_outputs in enumerate(device_outputs):
                if device in self.local_devices:
                    self._check_outputs_written(hbm_outputs, aliases)
            if self.sim.buffers.found_uninitialized and len(device_args) == 1:
                # read uninitialised memory, reported nothing: a compiled launch may
                # stand for a launch with these scalar operands
                k.clean_scalar_keys.add(k.scalar_key(device_args[0]))
        except PalladiumError as e:
            if getattr(e, "snapshot", None) is None and self.params.failure_snapshot_bytes:
                e.snapshot = self.sim.snapshot(  # type: ignore[attr-defined]
                    self.params.failure_snapshot_bytes, title=f"simulated state at the failure ({type(e).__name__}):")
            raise
        results: list[list[np.ndarray]] = []
        for device, hbm_outputs in enumerate(device_outputs):
            if device not in self.local_devices:
                results.append([])  # another process's device: its outputs are there
                continue
            outs = []
            for buf, aval, info in zip(hbm_outputs, k.out_avals, k.outputs):
                # the buffer's own array, not a copy: the simulation is over, and the
                # callback's caller copies the result into the output
                value = self.sim.contents(buf)
                value = value[info.array_region(tuple(aval.shape))]
                # np.ascontiguousarray makes a 0-d value 1-d: keep the output's shape.
                outs.append(np.ascontiguousarray(value, dtype=aval.dtype).reshape(aval.shape))
            results.append(outs)
        # The launch is over: its semaphores (one object each, 130k at 256 devices) are
        # freed now, not by the collection of the dropped launch (jax_hook._execute).
        self.sim.semaphores.clear()
        return results

    def _final_info(self, info: LaunchInfo, observers: list[Observer]) -> LaunchInfo:
        """The launch's info once its observers are known: with an observer of every
        equation (the timeline), its compiled segments run one by one."""
        if ObserverSet(observers).wants("compute"):
            self.plan = self.plan.fall_back(
                "an observer is told of every equation (a timeline)", SIMULATED)
        return dataclasses.replace(info, plan=self.plan)

    def _run(self, bodies: dict[CoreId, Any]) -> None:
        """Run the cores (with progress reports while it lasts)."""
        interval = self.params.progress_interval
        key = None if interval is None else STATE.progress.register(
            self.kernel_name, interval, self.progress_text)
        try:
            self.sim.run(bodies, check_leaks=True)
        except SemaphoreLeakError as e:
            if f"kernel '{self.kernel_name}'" in str(e):
                raise
            raise SemaphoreLeakError(f"{self.kernel.named()}: {e}") from e
        finally:
            if key is not None:
                STATE.progress.unregister(key)

    def _check_outputs_written(self, hbm_outputs: list[BufferRef], aliases: dict[int, int]) -> None:
        """``uninitialized_reads``: report each output region nothing wrote."""
        k = self.kernel
        on_use = self.params.uninitialized_reads == "on_use"
        for o, (buf, aval, info) in enumerate(zip(hbm_outputs, k.out_avals, k.outputs)):
            if o in aliases and not on_use:
                continue
            found = self.sim.unwritten(buf, info.array_region(tuple(aval.shape)))
            if found is None:
                continue
            region, n, total = found
            head = f"{k.named()}: output '{info.name}' (HBM, device {buf.device}) "
            never = (f"was never written in region {region} ({n} of its {total} elements) "
                     f"by the end of the launch: the caller receives uninitialised memory (on "
                     f"a TPU, garbage). Write every output block the grid visits (or give the "
                     f"output an input_output_alias); ")
            if on_use:
                k.reads_uninitialized = True
                taint = self.sim.taint(buf)
                if taint is None:
                    raise UninitializedUseError(
                        head + never + "if the kernel means it, pass "
                        "InterpretParams(uninitialized_reads='off').")
                raise UninitializedUseError(
                    head + f"holds data derived from uninitialised memory in region "
                    f"{region} ({n} of its {total} elements) when the launch ends: "
                    f"{describe_origin(taint)}. The caller receives it (on a TPU, "
                    f"garbage). {fix_hint(taint)} If the kernel means it, pass "
                    f"InterpretParams(uninitialized_reads='off').")
            self.sim.report_uninitialized(
                head + never + "for a kernel that means it, pass "
                "InterpretParams(uninitialized_reads='off').", (info.name, "output"))

    def _grid_point_of(self, core: CoreId) -> tuple[int, ...] | None:
        run = self.core_runs.get(core)
        return None if run is None else run.point

    def progress_text(self) -> str:
        """Where the launch is now: each core and the DMAs in flight (a progress report)."""
        lines = [f"  {state}" for state in self.sim.core_states()]
        dmas = self.sim.dmas_in_flight()
        lines.append(f"  DMAs in flight: {len(dmas)}" + ("" if not dmas else ""))
        lines += [f"    {d}" for d in dmas[:16]]
        if len(dmas) > 16:
            lines.append(f"    ... and {len(dmas) - 16} more")
        return "\n".join(lines)

    def _grid(self, dyn: list[Any]) -> tuple[int, ...]:
        grid = launch_grid(self.kernel, dyn)
        for d, size in enumerate(grid):
            if size < 0:
                raise KernelError(negative_grid_message(self.kernel, d, size, grid, dynamic=True))
        return grid

    @property
    def needs_initial_barrier(self) -> bool:
        """A multi-device kernel without a ``collective_id`` starts with a barrier of all
        devices (it cannot synchronise through the barrier semaphore itself)."""
        cp = self.kernel.compiler_params
        return self.num_devices > 1 and getattr(cp, "collective_id", None) is None
