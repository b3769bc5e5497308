"""A prepared kernel: its static description (``kernel_spec.KernelSpec``, frozen) and
what its launches keep across launches in the process (compiled programs, block copies'
plans, the race memo, what an uninitialised read taught). Built once per lowering and
reused by every launch; a launch's own state lives in its ``Launch``."""

from __future__ import annotations

import dataclasses
from typing import Any

from palladium.interpret.eval.access_path import PlanCache
from palladium.interpret.eval.evaluator import ProgramCache
from palladium.interpret.eval.segments import uses_async
from palladium.interpret.kernel.kernel_spec import KernelSpec, static_grid_points
from palladium.interpret.kernel.launches import KernelLaunches
from palladium.race_detect import RaceMemo

__all__ = ["COPY_PLAN_LIMIT", "PreparedKernel"]

#: Block copies' plans a kernel keeps (an operand's blocks times two sides).
COPY_PLAN_LIMIT = 1 << 16


@dataclasses.dataclass(eq=False, slots=True, weakref_slot=True)
class PreparedKernel:
    """A kernel's static facts (``spec``; read through, ``kernel.jaxpr`` is
    ``kernel.spec.jaxpr``) and the state its launches keep (slots: a static fact
    cannot be set here by mistake)."""

    spec: KernelSpec
    #: The compiled programs of its jaxprs.
    programs: ProgramCache
    # (operand, block index) -> the simulator's plans of a block copy (grid_loop.py),
    # kept across launches: a plan serves every buffer of the same shapes and bounds
    # (another buffer's plan is resolved again by the simulator).
    copy_plans: PlanCache[Any] = dataclasses.field(
        default_factory=lambda: PlanCache(limit=COPY_PLAN_LIMIT))
    # The VMEM/SMEM it holds per core on the simulated chip
    # (``fidelity.memory_budget.MemoryUse``), counted when the call is lowered.
    memory_use: Any = None
    #: The race detector's memo of the kernel's last race-free launch (its call log):
    #: a launch that makes the same calls needs no detection (``race_detect.memo``).
    race_memo: RaceMemo = dataclasses.field(default_factory=RaceMemo)
    #: ``uninitialized_reads="on_use"``: whether a launch of this kernel read memory
    #: that held no initialised data, or left an output region unwritten: its later
    #: launches then stay simulated (where values carry shadows), except those whose
    #: scalar operands (``scalar_key``) a simulated launch that read uninitialised
    #: memory and reported nothing had (``clean_scalar_keys``): megablox gmm's masked
    #: merge of output rows, decided by its group offsets.
    reads_uninitialized: bool = False
    clean_scalar_keys: set[bytes] = dataclasses.field(default_factory=set)
    #: Its launches in the process: their numbers, the latest plan, compiled launches.
    launches: KernelLaunches = dataclasses.field(default_factory=KernelLaunches)

    @classmethod
    def of(cls, spec: KernelSpec) -> PreparedKernel:
        """A kernel of ``spec`` that no launch has run yet."""
        jaxpr = spec.jaxpr
        return cls(spec, ProgramCache(races_ok=not uses_async(jaxpr),
                                      body=getattr(jaxpr, "jaxpr", jaxpr),
                                      grid_points=static_grid_points(spec.grid_mapping)))

    @classmethod
    def from_params(cls, **params: Any) -> PreparedKernel:
        """``KernelSpec.from_params(**params)``, prepared (see ``KernelSpec``)."""
        return cls.of(KernelSpec.from_params(**params))

    def __getattr__(self, name: str) -> Any:
        # The static facts are the spec's (only reached for names not found here).
        if name.startswith("__") or name == "spec":
            raise AttributeError(name)
        return getattr(self.spec, name)
