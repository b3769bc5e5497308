"""One kernel launch: allocate the simulated memory, walk the grid on every core, return
the outputs. Created per host call and dropped afterwards, so a failure leaves nothing."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.blocks import BlockSpecInfo, memory_space_of
from palladium.interpret.chip import DEFAULT_CHIP, chip_facts
from palladium.interpret.devices import DeviceMesh
from palladium.interpret.errors import (
    JAX_HBM_IN_RUN_SCOPED,
    KernelError,
    RevisitError,
    UnsupportedFeatureError,
    jax_block_index_phrase,
    jax_revisit_phrase,
)
from palladium.interpret.eval.evaluator import CoreEvaluator
from palladium.interpret.eval.refs import MemRef, SemaphoreRef
from palladium.interpret.grid_blocks import GridBlocks
from palladium.interpret.grid_order import parallel_orders
from palladium.interpret.kernel import PreparedKernel
from palladium.interpret.kernel_checks import is_parallel
from palladium.interpret.observers import LaunchInfo, launch_observers
from palladium.interpret.params import InterpretParams
from palladium.interpret.site import Site
from palladium.shared_memory import (
    BlockCopy,
    MemorySpace,
    SemaphoreKind,
    SemaphoreLeakError,
    Simulation,
    uninitialized_value,
)

CoreId = tuple[int, int]


def _semaphore_kind(dtype: Any) -> SemaphoreKind:
    if isinstance(dtype, jc.DMASemaphoreDType):
        return SemaphoreKind.DMA
    if isinstance(dtype, jc.BarrierSemaphoreDType):
        return SemaphoreKind.BARRIER
    return SemaphoreKind.REGULAR


_OUT_OF_BOUNDS_HINT = (
    "Pass InterpretParams(out_of_bounds_reads='uninitialized') to read uninitialised values "
    "there, or buffer_bounds='padded' to allow reads into TPU tile padding."
)


class Launch:
    """The state of one kernel launch, shared by the cores that run it."""

    def __init__(self, kernel: PreparedKernel, params: InterpretParams,
                 mesh: DeviceMesh | None = None, *, observe: bool = True) -> None:
        self.kernel = kernel
        self.params = params
        self.observe = observe  # False: a re-run (order trials), not shown to observers
        self.mesh = mesh if mesh is not None else DeviceMesh()
        self.num_devices = max(self.mesh.num_devices, 1)
        self.kernel_name = kernel.name
        self.programs = kernel.programs
        gm = kernel.grid_mapping
        self.chip = params.chip or DEFAULT_CHIP
        self.chip_facts = chip_facts(self.chip)
        self.num_cores = (
            math.prod(kernel.mesh.shape.values()) if kernel.is_core_map
            else params.num_cores_or_threads
        )
        self.sim = Simulation(
            self.num_devices,
            self.num_cores,
            options=params.simulation_options(self.chip_facts.generation),
            out_of_bounds_hint=_OUT_OF_BOUNDS_HINT,
        )
        self.vmapped_dims = tuple(gm.vmapped_dims)
        self.grid_names = tuple(gm.grid_names) if gm.grid_names is not None else ()
        self.grid: tuple[int, ...] = ()
        # Buffers each core allocated, in program order: a remote DMA to core c targets
        # "the buffer core c allocated at the same position".
        self._core_buffers: dict[CoreId, list[Any]] = {}
        self._position: dict[Any, int] = {}
        self._shared_hbm: dict[tuple[int, int], Any] = {}
        self._scoped_hbm_exits: dict[Any, int] = {}  # buffer key -> cores that left its scope
        # HBM buffers of each device in allocation order: a remote DMA into HBM targets
        # "the buffer the other device allocated at the same position".
        self._device_hbm: dict[int, list[Any]] = {}
        self._hbm_seq: dict[CoreId, int] = {}

    # --- helpers used by the rules --------------------------------------------------------
    def fill_value(self, dtype: Any) -> Any:
        return uninitialized_value(dtype, self.params.uninitialized_memory)

    def program_ids(self, ev: CoreEvaluator) -> tuple[int, ...]:
        point = ev.grid_point or ()
        return tuple(p for d, p in enumerate(point) if d not in self.vmapped_dims)

    def program_counts(self) -> tuple[int, ...]:
        return tuple(n for d, n in enumerate(self.grid) if d not in self.vmapped_dims)

    def axis_index(self, ev: CoreEvaluator, name: Any, eqn: Any) -> tuple[int, int]:
        if name in self.kernel.core_axis_names:
            return ev.core[1], self.num_cores
        if name in self.grid_names:
            d = self.grid_names.index(name)
            return (ev.grid_point or ())[d], self.grid[d]
        position = self.mesh.axis_position(ev.core[0], name)
        if position is not None:
            return position
        raise UnsupportedFeatureError(
            f"lax.axis_index('{name}'): the axis is neither a grid axis, a core axis of "
            f"this kernel, nor a mesh axis of the surrounding shard_map {self.mesh.axis_names} "
            f"({ev.site(eqn)})"
        )

    def remote_core(
        self, ev: CoreEvaluator, device_id: Any, core_index: Any, id_type: Any, eqn: Any
    ) -> CoreId | None:
        if device_id is None and core_index is None:
            return None
        device, core = ev.core
        if device_id is not None:
            device, axis_core = self.mesh.resolve(
                device_id, id_type, ev.core[0], self.kernel.core_axis_names,
                lambda: str(ev.site(eqn)),
            )
            if axis_core is not None:
                if core_index is not None:
                    raise KernelError(
                        f"both core_index and a core axis in device_id name the target core "
                        f"({ev.site(eqn)})"
                    )
                core = axis_core
        if core_index is not None:
            core = int(np.asarray(core_index))
        if not 0 <= core < self.num_cores:
            raise KernelError(
                f"remote operation targets core {core}, but the kernel runs on "
                f"{self.num_cores} core(s) ({ev.site(eqn)})"
            )
        return (device, core)

    def peer_buffer(self, buf: Any, target: CoreId) -> Any:
        """The buffer on ``target`` that corresponds to ``buf`` (same allocation position)."""
        if buf.space == MemorySpace.HBM:
            if target[0] == buf.device:
                return buf
            peers = self._device_hbm.get(target[0], [])
        else:
            peers = self._core_buffers.get(target, [])
        pos = self._position.get(buf.key)
        if pos is None or pos >= len(peers):
            raise KernelError(
                f"no buffer corresponding to '{buf.name}' on device {target[0]} core {target[1]}"
            )
        return peers[pos]

    def _allocate(self, core: CoreId, space: Any, name: str, shape: Any, dtype: Any,
                  value: Any = None) -> Any:
        buf = self.sim.allocate(
            space, core[0], core[1], name=name,
            shape=None if value is not None else tuple(shape),
            dtype=None if value is not None else np.dtype(dtype),
            value=value,
        )
        lst = (self._device_hbm.setdefault(core[0], []) if space == MemorySpace.HBM
               else self._core_buffers.setdefault(core, []))
        self._position[buf.key] = len(lst)
        lst.append(buf)
        return buf

    def allocate_scoped(self, ev: CoreEvaluator, aval: Any, name: str, eqn: Any) -> Any:
        space = memory_space_of(getattr(aval, "memory_space", None))
        if space == "semaphore":
            kind = _semaphore_kind(aval.dtype)
            ids = self.sim.allocate_semaphores(ev.core[0], ev.core[1], kind=kind, name=name,
                                               shape=tuple(aval.shape))
            return SemaphoreRef(np.asarray(ids), kind, name)
        if space == MemorySpace.HBM:
            if not self.params.allow_hbm_allocation_in_run_scoped:
                raise KernelError(
                    f"run_scoped allocates '{name}' in HBM, which a TPU kernel cannot do; pass "
                    f"InterpretParams(allow_hbm_allocation_in_run_scoped=True) to simulate it "
                    f"anyway ({ev.site(eqn)}). {JAX_HBM_IN_RUN_SCOPED}"
                )
            seq = self._hbm_seq.get(ev.core, 0)
            self._hbm_seq[ev.core] = seq + 1
            key = (ev.core[0], seq)
            # HBM belongs to the device: the k-th HBM allocation of each of its cores is
            # one buffer, allocated by the first core to enter the scope and freed when
            # every core has left it (a core that leaves early must not free it under
            # the others).
            buf = self._shared_hbm.get(key)
            if buf is None:
                buf = self._allocate(ev.core, space, name, aval.shape, aval.dtype)
                self._shared_hbm[key] = buf
                self._scoped_hbm_exits[buf.key] = 0
            return MemRef(buf)
        return MemRef(self._allocate(ev.core, space, name, aval.shape, aval.dtype))

    def free_scoped(self, ev: CoreEvaluator, alloc: Any, eqn: Any) -> None:
        if isinstance(alloc, SemaphoreRef):
            try:
                self.sim.free_semaphores(alloc.ids, device=ev.core[0], core=ev.core[1])
            except SemaphoreLeakError as e:
                raise SemaphoreLeakError(f"{ev.site(eqn)}: {e}") from e
        elif alloc.buffer.key in self._scoped_hbm_exits:
            exits = self._scoped_hbm_exits[alloc.buffer.key] + 1
            self._scoped_hbm_exits[alloc.buffer.key] = exits
            if exits == self.num_cores:
                self.sim.free(alloc.buffer)
        else:
            self.sim.free(alloc.buffer)

    # --- the launch itself ------------------------------------------------------------------
    def execute(self, args: list[np.ndarray]) -> list[np.ndarray]:
        """Run the launch on one device with the callback's operands; its outputs."""
        return self.execute_devices([args])[0]

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
                                     k.launch_location)
            for observer in launch_observers(launch_info):
                self.sim.add_observer(observer)
        aliases = {o: i - n_idx for i, o in k.input_output_aliases}
        if any(i < 0 for i in aliases.values()):
            raise UnsupportedFeatureError("aliasing a scalar-prefetch operand to an output")
        for o, i in aliases.items():
            if k.outputs[o].has_element_padding or k.inputs[i].has_element_padding:
                raise UnsupportedFeatureError(
                    f"output '{k.outputs[o].name}' aliases input '{k.inputs[i].name}' and "
                    f"one of them has pl.Element padding"
                )
        schedule = self._schedule()
        bodies = {}
        device_outputs = []
        for device, args in enumerate(device_args):
            scalars, inputs = args[n_dyn : n_dyn + n_idx], args[n_dyn + n_idx :]
            hbm_inputs = [self._hbm_operand(device, info, np.asarray(x))
                          for info, x in zip(k.inputs, inputs)]
            hbm_outputs = []
            for o, info in enumerate(k.outputs):
                if o in aliases:
                    hbm_outputs.append(hbm_inputs[aliases[o]])
                else:
                    hbm_outputs.append(self._allocate(
                        (device, 0), MemorySpace.HBM, _hbm_name(info), info.padded_shape,
                        info.dtype))
            device_outputs.append(hbm_outputs)
            for c in range(self.num_cores):
                core = (device, c)
                operands = self._core_operands(core, scalars, hbm_inputs, hbm_outputs)
                bodies[core] = _CoreRun(self, core, operands, schedule[c], hbm_inputs,
                                        hbm_outputs, set(aliases)).run
        try:
            self.sim.run(bodies, check_leaks=True)
        except SemaphoreLeakError as e:
            if f"kernel '{self.kernel_name}'" in str(e):
                raise
            where = self.kernel.launch_location
            raise SemaphoreLeakError(
                f"kernel '{self.kernel_name}'" + (f" ({where})" if where else "") + f": {e}"
            ) from e
        results = []
        for hbm_outputs in device_outputs:
            outs = []
            for buf, aval, info in zip(hbm_outputs, k.out_avals, k.outputs):
                value = np.asarray(self.sim.value(buf))
                value = value[info.array_region(tuple(aval.shape))]
                # np.ascontiguousarray makes a 0-d value 1-d: keep the output's shape.
                outs.append(np.ascontiguousarray(value, dtype=aval.dtype).reshape(aval.shape))
            results.append(outs)
        return results

    def _grid(self, dyn: list[Any]) -> tuple[int, ...]:
        dyn_iter = iter(dyn)
        return tuple(
            int(np.asarray(next(dyn_iter))) if isinstance(g, jc.DynamicGridDim) or g is None
            else int(g)
            for g in self.kernel.grid_mapping.grid
        )

    @property
    def needs_initial_barrier(self) -> bool:
        """A multi-device kernel without a ``collective_id`` starts with a barrier of all
        devices (it cannot synchronise through the barrier semaphore itself)."""
        cp = self.kernel.compiler_params
        return self.num_devices > 1 and getattr(cp, "collective_id", None) is None

    def _hbm_operand(self, device: int, info: BlockSpecInfo, x: np.ndarray) -> Any:
        padded = info.padded_shape
        if padded != tuple(x.shape):
            full = np.full(padded, self.fill_value(x.dtype), dtype=x.dtype)
            full[info.array_region(tuple(x.shape))] = x
            x = full
        return self._allocate((device, 0), MemorySpace.HBM, _hbm_name(info), None, None,
                              value=x)

    def _core_operands(self, core: CoreId, scalars: list[Any], hbm_inputs: list[Any],
                       hbm_outputs: list[Any]) -> list[Any]:
        k = self.kernel
        operands: list[Any] = []
        for name, value in zip(k.scalar_names, scalars):
            operands.append(MemRef(self._allocate(core, MemorySpace.SMEM, name, None, None,
                                                  value=np.asarray(value))))
        for info, hbm in [*zip(k.inputs, hbm_inputs), *zip(k.outputs, hbm_outputs)]:
            if info.in_hbm:
                operands.append(MemRef(hbm))
            else:
                operands.append(MemRef(self._allocate(core, info.space, info.name,
                                                      info.block_shape, info.dtype)))
        for i, s in enumerate(k.scratch):
            space = k.scratch_space(i)
            aval = s.aval
            if space == "semaphore":
                kind = _semaphore_kind(aval.dtype)
                ids = self.sim.allocate_semaphores(core[0], core[1], kind=kind, name=s.name,
                                                   shape=tuple(aval.shape))
                operands.append(SemaphoreRef(np.asarray(ids), kind, s.name))
            elif space == MemorySpace.HBM:
                key = (core[0], -1 - i)
                if key not in self._shared_hbm:
                    self._shared_hbm[key] = self._allocate(core, space, s.name, aval.shape,
                                                           aval.dtype)
                operands.append(MemRef(self._shared_hbm[key]))
            else:
                operands.append(MemRef(self._allocate(core, space, s.name, aval.shape,
                                                      aval.dtype)))
        return operands

    def _semantics(self) -> tuple[bool, ...]:
        n = len(self.grid)
        cp = self.kernel.compiler_params
        sem = getattr(cp, "dimension_semantics", None) if cp is not None else None
        if self.kernel.is_core_map:
            return (self.num_cores > 1,) * n
        if sem is None:
            own = [False] * (n - len(self.vmapped_dims))
        else:
            own = [is_parallel(s) for s in sem]
        # Under vmap jax prepends batch axes to the grid; Mosaic treats them as parallel.
        it = iter(own)
        flags = tuple(True if d in self.vmapped_dims else next(it, False) for d in range(n))
        for a, b in zip(flags, flags[1:]):
            if b and not a:
                raise KernelError(
                    f"kernel '{self.kernel_name}': dimension_semantics {tuple(sem or ())} — "
                    f"parallel dimensions must form a prefix of the grid {self.grid}"
                )
        return flags

    def _schedule(self) -> list[list[tuple[int, ...]]]:
        """The grid points each core runs, in order."""
        grid = self.grid
        parallel = self._semantics()
        shuffled = [] if self.kernel.is_core_map else [n for n, p in zip(grid, parallel) if p]
        orders = iter(parallel_orders(tuple(shuffled), self.params.seed))
        coords = [next(orders) if p and not self.kernel.is_core_map else None
                  for p in parallel]
        total = math.prod(grid)
        par_size = math.prod(n for n, p in zip(grid, parallel) if p)
        per_core = math.ceil(par_size / self.num_cores) if par_size else 0
        per_point = total // par_size if par_size else 0
        out = []
        for c in range(self.num_cores):
            lo = min(c * per_core * per_point, total)
            hi = min((c + 1) * per_core * per_point, total)
            pts = []
            for linear in range(lo, hi):
                idx = np.unravel_index(linear, grid) if grid else ()
                pts.append(tuple(int(cs[i]) if cs is not None else int(i)
                                 for i, cs in zip(idx, coords)))
            out.append(pts)
        return out


def _hbm_name(info: BlockSpecInfo) -> str:
    return info.name if info.in_hbm else f"{info.name} (HBM)"


class _CoreRun:
    """The grid loop of one simulated core."""

    def __init__(self, launch: Launch, core: CoreId, operands: list[Any],
                 points: list[tuple[int, ...]], hbm_inputs: list[Any], hbm_outputs: list[Any],
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
        self.ev = CoreEvaluator(launch, core)
        self.blocks = GridBlocks((*k.inputs, *k.outputs), len(k.grid_mapping.grid))

    def _block_indices(self, point: tuple[int, ...]) -> list[tuple[int, ...]]:
        fast = self.blocks.indices(point)
        if fast is not None:
            return fast
        ev = self.ev
        saved = ev.grid_point
        ev.grid_point = point
        out = []
        k = self.launch.kernel
        for info in (*k.inputs, *k.outputs):
            idx = ev.eval_closed(info.index_map, [*(np.int32(p) for p in point), *self.scalar_refs])
            out.append(tuple(int(np.asarray(i)) for i in idx))
        ev.grid_point = saved
        return out

    def _site(self, point: tuple[int, ...], what: str, headline: str | None = None) -> Site:
        return Site(kernel=self.launch.kernel_name, core=self.core, grid_point=point, what=what,
                    source_info=self.launch.kernel.launch_location,
                    out_of_bounds_headline=headline)

    def run(self) -> None:
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
        for step, point in enumerate(self.points):
            self.ev.grid_point = point
            if record is not None:
                record(point, self.core[1])
            if obs is not None:
                obs.grid_step_begin(self.core, step, point)
            for i, info in enumerate(k.inputs):
                if info.in_hbm or (prev is not None and prev[i] == cur[i]):
                    continue
                site = self._site(point, f"copy of block {cur[i]} of input '{info.name}' into "
                                         f"{info.space.name}",
                                  jax_block_index_phrase(cur[i], "input", info.name, point))
                data = sim.read(self.hbm_inputs[i], self.blocks.region(i, cur[i]), core=self.core,
                                site=site)
                sim.write(self.input_refs[i].buffer, info.block_region(cur[i]), data,
                          core=self.core, site=site)
                if obs is not None:
                    obs.block_copy(BlockCopy(self.core, info.name, "in", cur[i], data.nbytes,
                                             step, point, info.buffer_count, info.space))
            self.ev.eval_jaxpr(k.jaxpr, [], self.operands)
            if obs is not None:
                obs.grid_step_end(self.core, step, point)
            nxt = self._block_indices(self.points[step + 1]) if step + 1 < len(self.points) else None
            for o, info in enumerate(k.outputs):
                if info.in_hbm:
                    continue
                b = cur[n_in + o]
                if nxt is None or nxt[n_in + o] != b:
                    site = self._site(point, f"copy of block {b} of output '{info.name}' to HBM",
                                      jax_block_index_phrase(b, "output", info.name, point))
                    data = sim.read(self.output_refs[o].buffer, info.block_region(b),
                                    core=self.core, site=site)
                    sim.write(self.hbm_outputs[o], self.blocks.region(n_in + o, b), data,
                              core=self.core, site=site)
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
            prev, cur = cur, nxt if nxt is not None else cur
