"""``InterpretParams``: how a Pallas TPU kernel is simulated on CPU."""

from __future__ import annotations

import dataclasses
import enum
import inspect
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from palladium.interpret.chip import CHIPS
from palladium.interpret.errors import ConfigError
from palladium.interpret.params_validation import validate_values
from palladium.shared_memory.options import (
    Bounds,
    DmaExecutionMode,
    DmaOrder,
    OnRace,
    OutOfBounds,
    SimulationOptions,
    Uninitialized,
    UninitializedReads,
    check_choice,
    check_on_race,
)

#: ``InterpretParams.compile_check``: who says whether a kernel compiles and fits.
CompileCheck = Literal["auto", "compiler", "approximate", "off"]
COMPILE_CHECKS: tuple[str, ...] = ("auto", "compiler", "approximate", "off")


class LoggingMode(enum.Flag):
    """What the interpreter logs (to the ``palladium.interpret`` logger, level DEBUG).

    ``LAUNCH`` logs each kernel launch (kernel name, grid, cores, chip); ``GRID`` each grid
    point a core runs; ``MEMORY`` every simulated buffer allocation and block copy;
    ``TIMELINE`` each launch's predicted TPU timeline summary (see
    ``palladium.interpret.timeline``); ``SEMAPHORE`` every semaphore signal and wait;
    ``BARRIER`` every barrier a core enters and leaves. jax's own
    ``LoggingMode`` (``BARRIER``, ``SEMAPHORE``, ``SHARED_MEMORY``) is accepted too:
    ``SHARED_MEMORY`` is ``MEMORY`` here (see ``from_jax``).
    """

    LAUNCH = enum.auto()
    GRID = enum.auto()
    MEMORY = enum.auto()
    TIMELINE = enum.auto()
    SEMAPHORE = enum.auto()
    BARRIER = enum.auto()

    @classmethod
    def from_jax(cls, mode: Any) -> LoggingMode:
        """palladium's flag for a value of jax 0.10.2's
        ``jax._src.pallas.mosaic.interpret.params.LoggingMode`` (matched by member
        names, so jax's interpreter module is never imported): ``BARRIER`` and
        ``SEMAPHORE`` as they are, ``SHARED_MEMORY`` as ``MEMORY``."""
        out = cls(0)
        for member in type(mode):
            if member & mode:
                out |= cls[_JAX_LOGGING_NAMES.get(member.name, member.name)]
        return out


# jax's LoggingMode member -> palladium's (the others keep their name).
_JAX_LOGGING_NAMES = {"SHARED_MEMORY": "MEMORY"}


def _is_jax_logging_mode(value: Any) -> bool:
    """Whether ``value`` is a value of jax's interpret-mode ``LoggingMode`` flag."""
    cls = type(value)
    return (isinstance(value, enum.Flag) and cls.__name__ == "LoggingMode"
            and cls.__module__.startswith("jax.")
            and {m.name for m in cls} <= {"BARRIER", "SEMAPHORE", "SHARED_MEMORY"})


# InterpretParams field (jax's names) -> the simulator's option (one vocabulary:
# palladium.shared_memory.options).
_OPTION_OF_FIELD: dict[str, str] = {
    "dma_execution_mode": "dma_execution_mode",
    "out_of_bounds_reads": "out_of_bounds",
    "uninitialized_memory": "uninitialized",
    "buffer_bounds": "bounds",
    "dma_order": "dma_order",
    "uninitialized_reads": "uninitialized_reads",
}

#: ``InterpretParams.progress_interval``'s default: seconds between two progress reports.
PROGRESS_INTERVAL_DEFAULT = 60.0
#: ``InterpretParams.failure_snapshot_bytes``'s default: array bytes a failure snapshot keeps (the failure log keeps one snapshot with contents).
SNAPSHOT_BYTES_DEFAULT = 2 << 20

_BOOLS = ("detect_races", "skip_floating_point_ops", "allow_hbm_allocation_in_run_scoped",
          "check_lowering", "check_memory", "deterministic_dot", "keep_float_data",
          "skip_unused_integer_ops")


@dataclasses.dataclass(frozen=True, kw_only=True)
class InterpretParams:
    """Run a Pallas TPU kernel on CPU with palladium's simulator.

    Pass an instance as ``interpret=`` to ``pl.pallas_call`` or ``pl.core_map``::

        from palladium.interpret import InterpretParams
        out = pl.pallas_call(kernel, out_shape=..., grid=...,
                             interpret=InterpretParams(detect_races=True))(x)

    Attributes:
      detect_races: run the happens-before race detector over every access.
      on_race: what a detected race does: ``"raise"`` (``DataRaceError``), ``"warn"``,
        ``"collect"`` (reports are kept, see ``collected_race_reports()``) or a callable taking
        a ``RaceReport``.
      dma_execution_mode: ``"on_wait"`` (a DMA executes when someone waits on its
        semaphore, the default) or ``"eager"`` (at ``start``).
      out_of_bounds_reads: ``"raise"`` (``OutOfBoundsError``) or ``"uninitialized"``
        (the out-of-range part of a read is the uninitialised fill).
      uninitialized_memory: fill of fresh buffers: ``"nan"`` (NaN for floats, the
        maximum for integers, True for bool) or ``"zero"``.
      skip_floating_point_ops: do not evaluate operations whose results are all
        floating point; their results are ``inf``. For checking index logic fast.
      keep_float_data: False: floating-point buffers (HBM, VMEM, SMEM) hold no data:
        a load reads the fill, a store or DMA only checks its bounds. Block copies,
        DMAs, semaphores, out-of-bounds checks and the timeline are what they would be;
        outputs hold the fill. With ``skip_floating_point_ops`` this is the fastest way
        to walk a kernel whose floating-point values steer nothing
        (``palladium.interpret.predict`` sets both).
      skip_unused_integer_ops: do not evaluate integer and boolean array operations
        whose results steer nothing (no index, DMA, semaphore, branch, loop test or
        SMEM store depends on them: ``eval/steering_values.py``) where equations run one
        by one: their results, and the integer outputs they reach, are then zeros. The
        walk of the kernel (and so its timeline) is unchanged
        (``palladium.interpret.predict`` sets it).
      num_cores_or_threads: TensorCores per device; the parallel sub-grid is split
        across them (megacore). A ``core_map`` over a ``TensorCoreMesh`` uses the
        mesh's core count instead.
      random_seed: seeds the order of grid points along parallel dimensions, the
        scheduling of simulated cores and DMAs, and the kernel PRNG (``None`` = 0).
      grid_point_recorder: called for each grid point, in the order each core runs
        them, with jax 0.10.2's signature when it accepts three positional arguments:
        ``recorder(token, grid_point, core_id)`` (an int32 scalar token, an int32 array
        of the grid coordinates and an int32 scalar core id; the return value, which jax
        requires to be the token, is ignored); otherwise as ``recorder(grid_point,
        core_id)`` (a tuple of ints and an int), the two-argument form jax's docstring
        describes. ``core_id`` is the core within its device.
      allow_hbm_allocation_in_run_scoped: allow ``pl.run_scoped`` to allocate HBM
        (shared by the cores of the device); a real TPU does not.
      buffer_bounds: ``"logical"`` (accesses beyond the array's shape are out of
        bounds) or ``"padded"`` (only beyond the TPU tile-padded shape of the simulated
        ``chip``; the padding reads as uninitialised and writes to it are dropped). SMEM
        is never padded.
      vector_clock_size: accepted for compatibility and ignored (palladium's race
        detector sizes its clocks itself).
      logging_mode: a ``LoggingMode`` flag (palladium's, or jax's own: its
        ``SHARED_MEMORY`` is ``MEMORY``), or None.
      chip: the TPU chip (``"v2"``, ``"v3"``, ``"v4"``, ``"v4i"``, ``"v5e"``, ``"v5p"``,
        ``"v6e"``, ``"v7"``, ``"v7x"``) whose tiling decides the padded shape. None (the
        default): the TPU of the current abstract mesh's abstract device
        (``jax.sharding.use_abstract_mesh``) when the ``pallas_call`` is traced, else the
        default device if it is a TPU, else ``"v5e"``. Generations >= 4 pad alike.
      dma_order: ``"issue"`` (pending DMAs complete in issue order) or ``"random"``
        (any legal order, from ``random_seed``).
      dma_order_trials: with ``dma_order="random"``, run each launch this many extra
        times with other seeds (other legal DMA completion orders) and raise
        ``DmaOrderDependenceError`` if any outputs differ; the error names the outputs,
        the devices and the conflicting accesses (DMAs, source lines). 0 = off.
      rendezvous_timeout: seconds the devices of a multi-device launch (``shard_map``)
        wait for each other before ``RendezvousTimeoutError``, counted from the latest
        device to arrive (devices arriving one by one are progress, not a hang).
      watchdog_timeout: seconds a launch's simulation may run before it fails with
        ``WatchdogError`` listing each core's state and source line (a core looping
        forever, with or without ``pl.delay``, while the others wait or loop). Default
        300 s, the default of pytest-timeout: long beyond any kernel palladium runs in
        a test, short enough to report a stuck one. ``None``: no watchdog.
      check_lowering: when the ``pallas_call`` is first lowered, also lower the kernel
        through jax's Mosaic lowering for ``chip`` and raise ``TpuLoweringError`` if a TPU
        would reject it (see ``palladium.interpret.fidelity.lowering_check``). Skipped on
        jax 0.10.0, which lacks the Mosaic entry point the check uses.
      check_memory: before the kernel runs, count the VMEM and SMEM it certainly holds
        per core and raise ``TpuResourceError`` if that exceeds the ``chip``'s limit
        (``pltpu.CompilerParams(vmem_limit_bytes=...)`` or XLA's default scoped limit;
        see ``palladium.interpret.fidelity.memory_budget``). The numbers are counted
        either way (``LaunchInfo.memory``, ``LoggingMode.LAUNCH``).
      compile_check: who decides whether the kernel compiles and fits on ``chip``
        (``palladium.interpret.fidelity.checks``): ``"auto"`` (default) the TPU compiler
        itself when libtpu is installed (``pip install 'palladium-interpret[compiler]'``)
        and can compile for ``chip``, else palladium's approximation (jax's Mosaic
        lowering and the VMEM/SMEM count above); ``"compiler"`` the TPU compiler or a
        ``ConfigError`` saying how to install it; ``"approximate"`` the approximation
        only; ``"off"`` no check. ``check_lowering=False`` / ``check_memory=False`` turn
        off their half of either checker.
      deterministic_dot: evaluate float ``dot_general`` (``jnp.dot``, ``einsum``, ...) by
        summing the contracted dimension in order, each product and sum rounded to f32 on
        its own, instead of through numpy's BLAS, whose kernel (and so accumulation order,
        and the result's last bits) depends on the host CPU. Then the same inputs give
        the same bits on every host (golden-file tests across CI machines); the order is
        neither BLAS's nor a TPU's, and matmul kernels ran 5-13x slower with it
        (benchmarks/LOG.md, "Deterministic dot"). Integer dots are exact either way.
        Default False.
      uninitialized_reads: what palladium does with memory that holds no initialised
        data (a scratch, a ``run_scoped`` buffer, an SMEM buffer, an output block at a
        new block index nothing wrote yet; with ``"on_use"`` also the padding of a
        partial edge block, which on a TPU holds whatever VMEM held). ``"on_use"`` (the
        default, as MemorySanitizer does for C): values read from it carry a shadow
        through arithmetic, selects, reductions, dots, moves, stores, DMAs and block
        copies, and ``UninitializedUseError`` is raised only where such a value decides
        something (a branch, a loop's condition or bound, an index, a DMA or semaphore
        operand) or reaches an output the launch returns (or where an output region was
        never written); data masked away or overwritten is never reported. The message
        names where the value was read and used, the operand, region, grid point and
        core, and what to fix. ``"raise"`` / ``"warn"``: every read of never-written
        memory itself (``UninitializedReadError`` / ``UninitializedReadWarning``, once
        per operand and line; the padding of a partial edge block counts as written),
        and an output region nothing wrote by the end of the launch. ``"off"``: nothing
        tracked. Compiled segments and compiled launches run where no value carries a
        shadow (a segment whose inputs or refs hold uninitialised data runs equation by
        equation; a kernel whose launch read uninitialised data is not compiled whole).
      progress_interval: a launch still running after this many seconds logs where it
        is (each core's grid point, state and line; the DMAs in flight) to the
        ``palladium.interpret`` logger at WARNING, and again at every interval; None:
        never. Default 60 s (the watchdog's default is 300 s).
      failure_snapshot_bytes: a failed launch's exception carries ``snapshot``, its
        simulated state (each core's grid point and line, semaphores, DMAs in flight,
        buffers); the buffers' contents are copied up to this many bytes in all (the
        largest are left out first). 0: contents of no buffer.
      compile_segments: run a kernel body's runs of pure array code, ``ref[...]`` loads
        and stores and loops of them as one XLA executable each (kept with the kernel
        and on disk), instead of one numpy call per equation; whatever that could change
        beyond XLA's arithmetic bits (out-of-bounds accesses, races, the timeline,
        ``skip_floating_point_ops``, ...) runs equation by equation as before (see
        ``palladium.interpret.eval.segments``). True (the default): runs worth
        compiling for one call are compiled from the first call, smaller ones from the
        kernel's third launch in the process on (compiled by that launch: nothing
        compiles in the background), and a kernel's whole launch as one executable from its third launch
        (``run/execution_plan.WHOLE_LAUNCH``), so a kernel called in a loop runs XLA's
        code; its results from those calls on may then differ in the last place from the
        first's where
        numpy's and XLA's bits differ (transcendentals, dot sums). ``"static"``: only the
        first kind, so that every call gives the same bits. False: none.
    """

    detect_races: bool = False
    on_race: OnRace = "raise"
    dma_execution_mode: DmaExecutionMode = "on_wait"
    out_of_bounds_reads: OutOfBounds = "raise"
    uninitialized_memory: Uninitialized = "nan"
    skip_floating_point_ops: bool = False
    num_cores_or_threads: int = 1
    random_seed: int | None = None
    grid_point_recorder: Callable[..., Any] | None = None
    allow_hbm_allocation_in_run_scoped: bool = False
    buffer_bounds: Bounds = "logical"
    vector_clock_size: int | None = None
    logging_mode: LoggingMode | None = None
    chip: str | None = None
    dma_order: DmaOrder = "issue"
    dma_order_trials: int = 0
    rendezvous_timeout: float = 120.0
    watchdog_timeout: float | None = 300.0
    check_lowering: bool = True
    check_memory: bool = True
    compile_check: CompileCheck = "auto"
    deterministic_dot: bool = False
    uninitialized_reads: UninitializedReads = "on_use"
    progress_interval: float | None = PROGRESS_INTERVAL_DEFAULT
    compile_segments: bool | Literal["static"] = True
    failure_snapshot_bytes: int = SNAPSHOT_BYTES_DEFAULT
    keep_float_data: bool = True
    skip_unused_integer_ops: bool = False

    def __post_init__(self) -> None:
        if _is_jax_logging_mode(self.logging_mode):  # jax's own flag: palladium's equivalent
            object.__setattr__(self, "logging_mode", LoggingMode.from_jax(self.logging_mode))
        for field in _BOOLS:
            self._require(field, isinstance(getattr(self, field), bool), "True or False")
        self._require("compile_segments", isinstance(self.compile_segments, bool)
                      or self.compile_segments == "static", "True, False or 'static'")
        for field, option in _OPTION_OF_FIELD.items():
            check_choice(option, getattr(self, field), name=f"InterpretParams.{field}")
        check_on_race(self.on_race, name="InterpretParams.on_race")
        n = self.num_cores_or_threads
        self._require("num_cores_or_threads", isinstance(n, int) and n >= 1, "an int >= 1")
        self._require("random_seed", self.random_seed is None
                      or isinstance(self.random_seed, int), "an int or None")
        v = self.vector_clock_size
        self._require("vector_clock_size", v is None or isinstance(v, int) and v >= 1,
                      "None or an int >= 1")
        self._require("logging_mode", self.logging_mode is None
                      or isinstance(self.logging_mode, LoggingMode),
                      "None or a LoggingMode flag (palladium.interpret.LoggingMode or jax's "
                      "pltpu interpret LoggingMode)")
        self._require("progress_interval", _seconds_or_none(self.progress_interval),
                      "a number of seconds > 0 (and < 1e9), or None for no progress reports")
        b = self.failure_snapshot_bytes
        self._require("failure_snapshot_bytes",
                      not isinstance(b, bool) and isinstance(b, int) and b >= 0, "an int >= 0")
        t = self.dma_order_trials
        self._require("dma_order_trials", isinstance(t, int) and t >= 0, "an int >= 0")
        if self.dma_order_trials and self.dma_order != "random":
            raise ConfigError(
                "InterpretParams.dma_order_trials needs dma_order='random' (with 'issue' every "
                "trial runs the same order)."
            )
        self._require("watchdog_timeout", _seconds_or_none(self.watchdog_timeout),
                      "a number of seconds > 0 (and < 1e9), or None for no watchdog")
        r = self.rendezvous_timeout
        self._require("rendezvous_timeout", isinstance(r, int | float) and not r <= 0,
                      "a number of seconds > 0")
        self._require("compile_check", self.compile_check in COMPILE_CHECKS,
                      f"one of {COMPILE_CHECKS}")
        self._require("chip", self.chip is None or self.chip in CHIPS, f"one of {CHIPS}")
        self._require("grid_point_recorder", self.grid_point_recorder is None
                      or callable(self.grid_point_recorder),
                      "None or a callable (grid_point, core) -> None")
        validate_values(self)

    def _require(self, field: str, ok: bool, what: str) -> None:
        if not ok:
            raise ConfigError(
                f"InterpretParams.{field} must be {what}, got {getattr(self, field)!r}.")

    def grid_point_recorder_call(self) -> Callable[[tuple[int, ...], int], None] | None:
        """``grid_point_recorder`` as a ``(grid_point, core)`` callable, calling the
        recorder in the form it accepts (see the class docstring); None without one."""
        recorder = self.grid_point_recorder
        if recorder is None:
            return None
        if _takes_token(recorder):
            return lambda point, core: recorder(
                np.int32(0), np.asarray(point, np.int32), np.int32(core)
            )
        return lambda point, core: recorder(tuple(point), core)

    def simulation_options(self, tpu_generation: int) -> SimulationOptions:
        """The simulator's options for a launch on a TPU of ``tpu_generation``."""
        return SimulationOptions(
            seed=self.seed,
            detect_races=self.detect_races,
            on_race=self.on_race,
            dma_execution_mode=self.dma_execution_mode,
            dma_order=self.dma_order,
            out_of_bounds=self.out_of_bounds_reads,
            uninitialized=self.uninitialized_memory,
            bounds=self.buffer_bounds,
            tpu_generation=tpu_generation,
            watchdog=self.watchdog_timeout,
            uninitialized_reads=self.uninitialized_reads,
            keep_float_data=self.keep_float_data,
        )

    def get_vector_clock_size(self, num_devices: int) -> int:
        """jax's method: the vector clock size its race detector would use for
        ``num_devices`` devices (``vector_clock_size``, or twice the cores). palladium's
        detector sizes its clocks itself; this answers as jax does, ``ValueError``
        included, for code that calls it."""
        cores = num_devices * self.num_cores_or_threads
        if self.vector_clock_size is None:
            return 2 * cores
        if cores >= self.vector_clock_size:
            raise ConfigError(
                f"InterpretParams.vector_clock_size ({self.vector_clock_size}) must be "
                f"greater than the total number of cores ({cores})."
            )
        return self.vector_clock_size

    @property
    def num_cores_per_device(self) -> int:
        """Alias of ``num_cores_or_threads`` (the reference's name)."""
        return self.num_cores_or_threads

    @property
    def seed(self) -> int:
        """``random_seed``, with None meaning 0."""
        return self.random_seed or 0


def _seconds_or_none(x: Any) -> bool:
    return x is None or (not isinstance(x, bool) and isinstance(x, int | float) and 0 < x < 1e9)


def _takes_token(recorder: Callable[..., Any]) -> bool:
    """Whether ``recorder`` accepts jax 0.10.2's ``(token, grid_point, core_id)``."""
    try:
        inspect.signature(recorder).bind(0, (), 0)
    except TypeError:
        return False
    except ValueError:  # no signature (some builtins): assume jax's form
        return True
    return True
