"""The typed seams of the evaluator: what a rule sees, and what the evaluator asks of a launch.

A rule (``rule(ctx, eqn, invals) -> outvals``) sees only a :class:`KernelContext`: the
core it runs on, the grid point, the simulator, the params, and a few questions about the
launch (program ids, axis indices, remote cores, scoped allocations). It cannot reach the
``Launch`` itself, so it cannot grow a dependency on everything else (jax's interpreter
hands its rules an explicit ``InterpretContext`` for the same reason). The evaluator
(``evaluator.CoreEvaluator``) implements it on top of :class:`LaunchServices`, the face a
launch shows the evaluator; ``Launch`` methods take a core and a grid point, never an
evaluator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np

from palladium.interpret.eval.refs import MemRef, SemaphoreRef
from palladium.interpret.eval.site import Site
from palladium.interpret.params import InterpretParams
from palladium.shared_memory import BufferRef, Simulation

if TYPE_CHECKING:  # program.py resolves rules, which take a KernelContext
    from palladium.interpret.eval.program import ProgramCache

__all__ = ["CoreId", "CoreMemory", "CoreState", "Equation", "KernelContext", "LaunchQuestions",
           "LaunchServices", "Value", "Where"]

CoreId: TypeAlias = tuple[int, int]



class Equation(Protocol):
    """One equation of a kernel jaxpr, as rules read it (jax's ``JaxprEqn`` is one)."""

    @property
    def primitive(self) -> Any: ...

    @property
    def params(self) -> dict[str, Any]: ...

    @property
    def invars(self) -> list[Any]: ...

    @property
    def outvars(self) -> list[Any]: ...

    @property
    def source_info(self) -> Any: ...


Value: TypeAlias = Any
"""An operand or result of a rule: a numpy array or scalar (ml_dtypes for bf16), or a
ref (``MemRef``, ``SemaphoreRef``, a transformed ref). Left open on purpose: a rule
checks the kind it needs."""

Where: TypeAlias = Callable[[], object]
"""Describes the equation an error is about (evaluated only when raising)."""


class CoreMemory(Protocol):
    """The launch's memory as rules use it (``run.memory_map.MemoryMap``): asked directly,
    with the asking core, never through the evaluator or the launch."""

    def fill_value(self, dtype: Any) -> Any: ...

    def peer_buffer(self, buf: BufferRef, target: CoreId) -> BufferRef: ...

    def allocate_scoped(self, core: CoreId, aval: Any, name: str, where: Where,
                        var: Any = None) -> MemRef | SemaphoreRef: ...

    def free_scoped(self, core: CoreId, alloc: MemRef | SemaphoreRef, where: Where) -> None: ...


@dataclasses.dataclass(eq=False, slots=True)
class CoreState:
    """What one core carries from a grid point to the next (the rest of its context is
    fixed per grid point): its PRNG and its MXU state."""

    #: ``pltpu.prng_seed``'s generator (None before the first seed).
    prng: np.random.Generator | None = None
    #: The explicit MXU operations' state (``rules_mxu.MxuState``), None until the first.
    mxu: Any = None


class LaunchQuestions(Protocol):
    """The questions about its launch that the evaluator asks of the launch
    (``LaunchServices``) and a rule asks of its context (``KernelContext``), declared
    once. The others differ only by whom they are about: the launch answers
    ``program_ids``, ``axis_index`` and ``remote_core`` for a core and grid point it is
    told, a context for its own; its ``launch_number`` is the launch's ``number``."""

    @property
    def sim(self) -> Simulation: ...

    @property
    def params(self) -> InterpretParams: ...

    @property
    def collective_id(self) -> int | None:
        """The kernel's ``CompilerParams(collective_id=...)`` (None without one)."""
        ...

    @property
    def debug_checks(self) -> bool:
        """Whether ``pl.debug_check`` checks: ``pl.enable_debug_checks`` was on when the
        kernel was lowered (as jax's Mosaic lowering decides)."""
        ...

    def program_counts(self) -> tuple[int, ...]: ...


class LaunchServices(LaunchQuestions, Protocol):
    """What the evaluator may ask of the launch it runs in (``launch.Launch``)."""

    kernel_name: str

    @property
    def memory(self) -> CoreMemory: ...

    @property
    def programs(self) -> ProgramCache: ...

    @property
    def number(self) -> int:
        """Which launch of the kernel in the process this is (1 for the first)."""
        ...

    @property
    def plan(self) -> Any:
        """How the launch runs (``run.execution_plan.ExecutionPlan``)."""
        ...

    @property
    def inherited_sources(self) -> dict[int, Any]: ...

    def program_ids(self, grid_point: tuple[int, ...] | None) -> tuple[int, ...]: ...

    def axis_index(self, core: CoreId, grid_point: tuple[int, ...] | None, name: Any,
                   where: Where) -> tuple[int, int]: ...

    def remote_core(self, core: CoreId, device_id: Any, core_index: Any, id_type: Any,
                    where: Where) -> CoreId | None: ...



class KernelContext(LaunchQuestions, Protocol):
    """The only face of a launch a rule may use (see the module docstring)."""

    core: CoreId
    #: Fixed for the context's life: the grid loop hands each grid point a context of
    #: its own (``CoreEvaluator.at``).
    grid_point: tuple[int, ...] | None
    #: What the core carries across grid points (PRNG, MXU state).
    state: CoreState
    #: The launch's memory (scoped allocations, peer buffers, fill values).
    memory: CoreMemory
    skip_floating_point_ops: bool
    #: ``skip_unused_integer_ops``: the kernel body's results of pure equations that
    #: steer nothing (``steering_values.unused_values``), not computed; else None.
    unused_values: frozenset[Any] | None
    deterministic_dot: bool
    #: ``uninitialized_reads="on_use"``: values carry shadows (``value_shadows.py``);
    #: a read notes the shadow of what it returns in ``read_shadow`` ((shadow, origin)
    #: or None), a store finds the shadow of what it writes in ``store_shadow``
    #: ((shadow or None, origin or None, whether to add the old contents' shadow)).
    tracks_values: bool
    read_shadow: Any
    store_shadow: Any

    @property
    def launch_number(self) -> int:
        """Which launch of this kernel in the process this is (1 for the first)."""
        ...

    @property
    def plan(self) -> Any:
        """How the launch runs (``run.execution_plan.ExecutionPlan``: its tier, whether
        hot segments run compiled), decided once for the launch."""
        ...

    def site(self, eqn: Equation | None = None, what: str | None = None) -> Site: ...

    def eval_jaxpr(self, jaxpr: Any, consts: list[Value], args: list[Value]) -> list[Value]: ...

    def eval_closed(self, closed: Any, args: list[Value]) -> list[Value]: ...

    def eval_with_ref_views(self, closed: Any, args: list[Value],
                            grid: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
                            ) -> list[Value]:
        """Evaluate a ClosedJaxpr whose arguments may be refs with transforms (and whose
        program ids are ``grid``'s, when given)."""
        ...

    def run_program(self, prog: Any, args: list[Value]) -> list[Value]:
        """Run a ``program.Program`` compiled apart from the kernel's cache."""
        ...

    def program_ids(self) -> tuple[int, ...]: ...

    def axis_index(self, name: Any, eqn: Equation) -> tuple[int, int]: ...

    def remote_core(self, device_id: Any, core_index: Any, id_type: Any,
                    eqn: Equation) -> CoreId | None: ...


