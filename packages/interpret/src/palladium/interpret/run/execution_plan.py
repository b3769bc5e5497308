"""Which tier runs a launch, and why: one plan, decided once per launch.

The tiers, fastest first: ``"compiled"`` (the whole launch one XLA executable,
``compiled/compiled_launch.py``, from launch ``WHOLE_LAUNCH``), ``"segments"`` (the
simulator with compiled segments, ``eval/segments.py``: the hot ones from launch
``HOT_LAUNCH``) and ``"simulated"`` (every equation one by one: the oracle). How
:func:`plan_launch` decides (never from timing), how a launch's number is counted, and
how the plan falls back once, visibly (:meth:`ExecutionPlan.fall_back`), is
docs/architecture.md's "The execution plan"; each condition here says its reason.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from palladium.interpret.eval.segments import HOT_LAUNCH

__all__ = ["COMPILED", "SEGMENTS", "SIMULATED", "WHOLE_LAUNCH", "ExecutionPlan", "plan_launch"]

COMPILED, SEGMENTS, SIMULATED = "compiled", "segments", "simulated"
#: The first launch of a kernel that runs compiled whole (its whole launch compiled, or
#: loaded from the disk cache, at the start of that launch: nothing is compiled in the
#: background). 3, not 2 (issue 43 item 4, ``benchmarks/call_by_call.py``; the numbers in
#: benchmarks/LOG.md, "Each call against HLO's same call"): with 2 a second call with a
#: cold cache waits for the compile (58x of jax's HLO interpreter's, against 9x), and an
#: edited kernel's test is always cold. Compiled in the background during launch 2
#: instead (until 2026-12-07), the compile's tracing held the GIL beside the launch: the
#: second call took 9.0-9.2x of HLO's in geomean, 2.3-2.6x without it, calls 1-3 no faster.
WHOLE_LAUNCH = 3


@dataclasses.dataclass(frozen=True, slots=True)
class ExecutionPlan:
    """How one launch runs: its ``tier`` and the ``reason``, its ``number`` among its
    kernel's launches in the process (1 for the first), ``hot`` (hot segments run
    compiled), ``replay_races`` (a compiled segment in a kernel with DMAs replays its
    accesses to the race detector) and ``trial`` (a DMA-order trial or race-report
    rerun of launch ``number``)."""

    number: int
    tier: str
    reason: str
    hot: bool = False
    replay_races: bool = False
    trial: bool = False

    @property
    def segments(self) -> bool:
        """Whether compiled segments may run (a simulated launch with segments)."""
        return self.tier == SEGMENTS

    def fall_back(self, reason: str, tier: str = SEGMENTS) -> ExecutionPlan:
        """This plan, run in ``tier`` instead (never a faster one) because of ``reason``."""
        if self.tier == SIMULATED or tier == self.tier == SEGMENTS:
            return self
        return dataclasses.replace(self, tier=tier, reason=reason)

    def as_trial(self, params: Any) -> ExecutionPlan:
        """The plan of a rerun of this launch with ``params`` (a DMA-order trial, a
        race-report rerun): simulated, under the same number, counted by nothing."""
        tier = SEGMENTS if self.tier == COMPILED else self.tier
        return dataclasses.replace(self, tier=tier, trial=True,
                                   replay_races=bool(params.detect_races))

    def __str__(self) -> str:
        what = "trial of launch" if self.trial else "launch"
        return f"{what} {self.number} ran {self.tier}, because {self.reason}"


def _simulated_because(params: Any) -> str | None:
    """Why ``params`` have every equation run one by one, or None."""
    if not params.compile_segments:
        return "compile_segments=False"
    if params.skip_floating_point_ops:
        return "skip_floating_point_ops=True (each equation is seen)"
    if params.deterministic_dot:
        return "deterministic_dot=True (each dot runs palladium's ordered sum)"
    if params.uninitialized_reads not in ("off", "on_use"):
        return f"uninitialized_reads={params.uninitialized_reads!r} (each read is checked)"
    if not params.keep_float_data:
        return "keep_float_data=False"
    return None


def _not_whole_because(params: Any) -> str | None:
    """Why ``params`` keep a launch from being compiled whole, or None."""
    if params.compile_segments == "static":
        return "compile_segments='static' (no code compiled for hot kernels)"
    for name, value, whole in (
            ("num_cores_or_threads", params.num_cores_or_threads, 1),
            ("grid_point_recorder", params.grid_point_recorder, None),
            ("buffer_bounds", params.buffer_bounds, "logical"),
            ("out_of_bounds_reads", params.out_of_bounds_reads, "raise"),
            ("dma_order", params.dma_order, "issue"),
            ("dma_execution_mode", params.dma_execution_mode, "on_wait")):
        if value != whole:
            return f"{name}={value!r} (a compiled launch models {whole!r} only)"
    if params.dma_order_trials:
        return "dma_order_trials (each trial reruns the launch simulated)"
    return None


def plan_launch(kernel: Any, params: Any, number: int, *, num_devices: int = 1,
                observed: bool = False, scalars: list[Any] | None = None) -> ExecutionPlan:
    """The plan of launch ``number`` of ``kernel`` (a ``PreparedKernel``) with ``params``
    on ``num_devices`` devices; ``observed``: a launch observer may watch it
    (``may_observe``); ``scalars``: the one device's operands (its scalar prefetch
    operands tell a launch like one that read uninitialised memory and reported
    nothing, see ``PreparedKernel.clean_scalar_keys``)."""
    hot = number >= HOT_LAUNCH and params.compile_segments is True
    replay = bool(params.detect_races)
    why = _simulated_because(params)
    if why is not None:
        return ExecutionPlan(number, SIMULATED, why, replay_races=replay)

    def segments(reason: str) -> ExecutionPlan:
        return ExecutionPlan(number, SEGMENTS, reason, hot=hot, replay_races=replay)

    why = _not_whole_because(params)
    if why is not None:
        return segments(why)
    if observed:
        return segments("a launch observer watches it (logging_mode, a timeline, a "
                        "registered factory): observed launches are simulated")
    if num_devices > 1:
        return segments(f"it runs on {num_devices} devices (a compiled launch runs one)")
    if kernel.is_core_map:
        return segments("it is a core_map (a compiled launch runs a pallas_call's grid)")
    if (kernel.reads_uninitialized and params.uninitialized_reads == "on_use"
            and (scalars is None or kernel.scalar_key(scalars) not in kernel.clean_scalar_keys)):
        return segments("an earlier launch read uninitialised memory (values carry shadows "
                        "in the simulator)")
    if number < WHOLE_LAUNCH:
        return segments(f"launch {number} < {WHOLE_LAUNCH}: the kernel is not hot yet")
    return ExecutionPlan(number, COMPILED, f"the kernel is hot (launch {number} >= "
                         f"{WHOLE_LAUNCH}) and nothing asks for the simulator", hot=hot,
                         replay_races=replay)
