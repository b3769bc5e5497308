"""The eager jaxpr evaluator one simulated core runs.

It runs programs compiled by ``program.py`` (each equation's rule resolved once) and is
the :class:`~palladium.interpret.eval.context.KernelContext` every rule sees: the core,
its grid point, the simulator, and the few questions a rule may ask of the launch
(through the typed ``LaunchServices``). Values are numpy arrays (ml_dtypes for bf16),
numpy scalars, and the ref objects of ``refs.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.context import (
    CoreId,
    CoreMemory,
    CoreState,
    Equation,
    LaunchServices,
    Value,
)
from palladium.interpret.eval.program import Program, ProgramCache, Step, compile_jaxpr
from palladium.interpret.eval.shadow_rules import run_shadowed
from palladium.interpret.eval.site import Site
from palladium.interpret.eval.skipped_steps import skipping
from palladium.interpret.numpy_rules.common import (
    ERRORS_IGNORED,
    HARDWARE_FLUSHES,
    hardware_flushes,
)
from palladium.interpret.params import InterpretParams
from palladium.shared_memory import Simulation

__all__ = ["CoreEvaluator", "Program", "ProgramCache", "Step", "compile_jaxpr"]

_new_site = tuple.__new__
_new_evaluator = object.__new__


@dataclasses.dataclass(eq=False)
class CoreEvaluator:
    """Evaluates jaxprs as one simulated core: its id, grid point and PRNG state."""

    launch: LaunchServices
    core: CoreId
    state: CoreState = dataclasses.field(default_factory=CoreState)
    grid_point: tuple[int, ...] | None = None
    memory: CoreMemory = dataclasses.field(init=False, repr=False)
    #: The launch's simulator (its ``sim``, read once: every load, DMA and wait asks)
    sim: Simulation = dataclasses.field(init=False, repr=False)
    skip_floating_point_ops: bool = dataclasses.field(init=False, default=False)
    unused_values: frozenset[Any] | None = dataclasses.field(init=False, default=None,
                                                             repr=False)
    deterministic_dot: bool = dataclasses.field(init=False, default=False)
    tracks_values: bool = dataclasses.field(init=False, default=False)
    read_shadow: Any = dataclasses.field(init=False, default=None, repr=False)
    store_shadow: Any = dataclasses.field(init=False, default=None, repr=False)
    _quiet: bool = dataclasses.field(init=False, default=False, repr=False)
    # Inside a plugin's evaluation: refs may come with transforms, and the program ids
    # may be the evaluation's own ((ids, counts), see ``eval_with_ref_views``).
    _views: bool = dataclasses.field(init=False, default=False, repr=False)
    _grid: Any = dataclasses.field(init=False, default=None, repr=False)
    #: Whether the FP environment of the thread that runs this core flushes subnormals
    #: as XLA's does (``HARDWARE_FLUSHES``), probed once for the core's whole run by
    #: ``probe_environment`` (None: probed at each outermost evaluation).
    flushes: bool | None = dataclasses.field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        params = getattr(self.launch, "params", None)
        self.memory = self.launch.memory
        self.sim = getattr(self.launch, "sim", None)  # type: ignore[assignment]
        self.skip_floating_point_ops = bool(getattr(params, "skip_floating_point_ops", False))
        self.deterministic_dot = bool(getattr(params, "deterministic_dot", False))
        self.unused_values = getattr(self.launch, "unused_values", None)
        self.tracks_values = getattr(params, "uninitialized_reads", "off") == "on_use"
        # the settings under which programs run without the steps they skip
        # (``skipped_steps``; None: every step runs)
        self._skip: tuple[bool, Any] | None = (
            (self.skip_floating_point_ops, self.unused_values)
            if (self.skip_floating_point_ops or self.unused_values is not None)
            and not self.tracks_values else None)
        self._inherited: dict[int, Any] = getattr(self.launch, "inherited_sources", {})
        # per equation (by id; the launch's programs hold it): its site at this grid point
        self._sites: dict[int, Site] = {}
        # The launch's observers, told of every equation (None: the plain loop below).
        obs = getattr(getattr(self.launch, "sim", None), "observers", None)
        self._observers: Any = obs if obs is not None and obs.wants("compute") else None

    def at(self, grid_point: tuple[int, ...] | None) -> CoreEvaluator:
        """This core's context at ``grid_point`` (the same core state and launch)."""
        ev = _new_evaluator(type(self))  # copy.copy's __reduce_ex__ costs ~2 us more
        ev.__dict__.update(self.__dict__)
        ev.grid_point = grid_point
        ev._quiet = False
        ev._sites = {}
        return ev

    def eval_jaxpr(self, jaxpr: Any, consts: list[Value], args: list[Value]) -> list[Value]:
        if self._quiet:
            return self._eval(jaxpr, consts, args)
        # The numpy rules' floating-point warnings (overflow in a cast, invalid value) are
        # not the user's: XLA computes the same values silently. One errstate per
        # outermost evaluation (nested control-flow bodies run inside it).
        self._quiet = True
        token = ERRORS_IGNORED.set(True)  # the rules need not set errstate themselves
        # (whether IEEE arithmetic flushes subnormals here, as XLA's does: see the flag)
        known = self.flushes
        flushes = HARDWARE_FLUSHES.set(hardware_flushes() if known is None else known)
        try:
            with np.errstate(all="ignore"):
                return self._eval(jaxpr, consts, args)
        finally:
            HARDWARE_FLUSHES.reset(flushes)
            ERRORS_IGNORED.reset(token)
            self._quiet = False

    def probe_environment(self) -> None:
        """Probe the FP environment once, for every evaluation this core makes from the
        calling thread on (a core's grid runs on one thread, inside one host callback of
        XLA's, whose environment does not change while it runs)."""
        self.flushes = hardware_flushes()

    def run_program(self, prog: Program, args: list[Value]) -> list[Value]:
        """Run a program compiled apart from the kernel's cache (a compiled segment's
        equations, one by one)."""
        obs = self._observers
        if obs is not None and prog.flat and not self.tracks_values:
            # (the timeline's recorder, the one listener: told the run at once)
            tell = getattr(getattr(obs.compute, "__self__", None), "compute_run", None)
            if tell is not None:
                return self._run_told_after(prog, args, tell)
        return self._run(prog, [], args)

    def _run_told_after(self, prog: Program, args: list[Value], tell: Any) -> list[Value]:
        """``_run`` of a flat program (``Program.flat``: its equations start no DMA and
        touch no semaphore, so no other event can come between them) whose one observer
        of equations takes a run: its equations told after they ran, as one run (if
        one raises, those up to it, as ``_run`` would have told them)."""
        variant = None if self._skip is None else skipping(prog, *self._skip)
        env = list(prog.template if variant is None else variant.template)
        for s, x in zip(prog.in_slots, args):
            env[s] = x
        i = 0
        try:
            for rule, eqn, operands, one, out, outs in (
                    prog.fast if variant is None else variant.fast):
                results = rule(self, eqn, [env[one]] if one is not None else list(operands(env)))
                if out is not None:
                    env[out] = results[0]
                else:
                    for s, o in zip(outs, results):
                        env[s] = o
                i += 1
        except BaseException:
            tell(self.core, prog.eqns[:(i if variant is None else variant.positions[i]) + 1])
            raise
        tell(self.core, prog.eqns)
        return [env[i] for i in prog.out_slots]

    def _eval(self, jaxpr: Any, consts: list[Value], args: list[Value]) -> list[Value]:
        if isinstance(jaxpr, jc.ClosedJaxpr):
            consts = [*jaxpr.consts, *consts]
            jaxpr = jaxpr.jaxpr
        return self._run(self.launch.programs.get(jaxpr, self._views), consts, args)

    def _run(self, prog: Program, consts: list[Value], args: list[Value]) -> list[Value]:
        variant = None if self._skip is None else skipping(prog, *self._skip)
        env = list(prog.template if variant is None else variant.template)
        for s, x in zip(prog.const_slots, consts):
            env[s] = x
        for s, x in zip(prog.in_slots, args):
            env[s] = x
        obs = self._observers
        if self.tracks_values:
            return run_shadowed(self, prog, env, obs)
        if obs is None:
            for rule, eqn, operands, one, out, outs in (
                    prog.fast if variant is None else variant.fast):
                results = rule(self, eqn, [env[one]] if one is not None else list(operands(env)))
                if out is not None:
                    env[out] = results[0]
                else:
                    for s, o in zip(outs, results):
                        env[s] = o
            return [env[i] for i in prog.out_slots]
        core, compute = self.core, obs.compute
        for rule, eqn, operands, one, out, outs, told in (
                prog.observed if variant is None else variant.observed):
            if told:  # (a segment runs its equations one by one here)
                compute(core, eqn)
                if rule is None:  # skipped: its results are in the template
                    continue
            results = rule(self, eqn, [env[one]] if one is not None else list(operands(env)))
            if out is not None:
                env[out] = results[0]
            else:
                for s, o in zip(outs, results):
                    env[s] = o
        return [env[i] for i in prog.out_slots]

    def eval_closed(self, closed: Any, args: list[Value]) -> list[Value]:
        """Evaluate a ClosedJaxpr (consts bound) on ``args``."""
        return self.eval_jaxpr(closed, [], args)

    def eval_with_ref_views(self, closed: Any, args: list[Value],
                            grid: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
                            ) -> list[Value]:
        """Evaluate a ClosedJaxpr on ``args``, some of which may be refs with transforms
        (a plugin's evaluation, ``traced_rule.evaluation_rule``): it and every jaxpr it
        runs (branches, loop bodies, calls) run as programs compiled for such refs.
        ``grid``: (program ids, program counts) ``pl.program_id`` and
        ``pl.num_programs`` answer within it (a pipeline's own grid)."""
        views, outer = self._views, self._grid
        self._views = True
        if grid is not None:
            self._grid = grid
        try:
            return self.eval_jaxpr(closed, [], args)
        finally:
            self._views, self._grid = views, outer

    def site(self, eqn: Equation | None = None, what: str | None = None) -> Site:
        # Every load, DMA start and wait asks for one: an equation's is made once per grid
        # point (a page loop's asks again each page), the tuple built directly (Site's
        # fields in order), not through the named tuple's keyword-parsing __new__.
        if what is None and eqn is not None:
            known = self._sites.get(id(eqn))
            if known is None:
                known = self._sites[id(eqn)] = self._site(eqn, None)
            return known
        return self._site(eqn, what)

    def _site(self, eqn: Equation | None, what: str | None) -> Site:
        return _new_site(Site, (
            self.launch.kernel_name,
            self.core,
            self.grid_point,
            None if eqn is None else self._inherited.get(id(eqn), eqn.source_info),
            what,
            None,  # out_of_bounds_headline
            None,  # out_of_bounds_hint
        ))

    # -- the KernelContext a rule sees (its questions go to the launch) -------------------
    @property
    def launch_number(self) -> int:
        return self.launch.number

    @property
    def params(self) -> InterpretParams:
        return self.launch.params

    @property
    def plan(self) -> Any:
        return self.launch.plan

    @property
    def collective_id(self) -> int | None:
        return self.launch.collective_id

    @property
    def debug_checks(self) -> bool:
        return self.launch.debug_checks

    def program_ids(self) -> tuple[int, ...]:
        if self._grid is not None:
            return self._grid[0]  # type: ignore[no-any-return]
        return self.launch.program_ids(self.grid_point)

    def program_counts(self) -> tuple[int, ...]:
        if self._grid is not None:
            return self._grid[1]  # type: ignore[no-any-return]
        return self.launch.program_counts()

    def axis_index(self, name: Any, eqn: Equation) -> tuple[int, int]:
        return self.launch.axis_index(self.core, self.grid_point, name, lambda: self.site(eqn))

    def remote_core(self, device_id: Any, core_index: Any, id_type: Any,
                    eqn: Equation) -> CoreId | None:
        if device_id is None and core_index is None:
            return None
        return self.launch.remote_core(self.core, device_id, core_index, id_type,
                                       lambda: self.site(eqn))


