"""``predict``: will one configuration of a kernel compile and fit on a TPU, and how fast.

The kernel runs under palladium with ``skip_floating_point_ops=True`` inside a
:func:`palladium.interpret.timeline`: the grid, the block copies, the DMA and semaphore
schedule and the integer work (index maps, scalar prefetch) are walked, no floating-point
arithmetic is done. Abstract operands (``jax.ShapeDtypeStruct``) are given zeros; pass
concrete arrays for operands whose values steer the kernel (scalar prefetch indices).

Before any operand is made, the call is traced and lowered once on the abstract operands
(and that lowering compiled is what then runs): the compile-and-fit check runs in the
lowering, so a configuration that does not fit is rejected without allocating it (a 16
GiB spec ran out of memory before, a 1 GiB one took +947 MiB). What cannot change the
answer is not walked: no uninitialised-value tracking (``PREDICT_DEFAULTS``), and a grid
step whose body touches only floating-point memory is walked once per value of the
``program_id``s it reads (``run/body_memo.py``). Control flow steered by floating-point values (``eval/float_steering``:
a ``while`` on ``jnp.max(v) > 1``, a ``pl.when(x[0, 0] > 0.5)`` around DMAs) cannot be
followed without the float arithmetic: such a loop runs ``WHILE_GUESS`` iterations
instead of until the watchdog, and the prediction lists the decisions in ``float_steered``
(with their source lines) and warns (``UncertainPredictionWarning``).
"""

from __future__ import annotations

import dataclasses
import re
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from palladium.interpret import _jax_compat as jc
from palladium.interpret.chip import DEFAULT_CHIP
from palladium.interpret.errors import (
    ConfigError,
    KernelError,
    TpuCompilerError,
    TpuLoweringError,
    TpuResourceError,
)
from palladium.interpret.eval.float_steering import float_steered
from palladium.interpret.eval.jaxprs import any_equation, nested_jaxprs
from palladium.interpret.eval.segments import WHILE_GUESS
from palladium.interpret.fidelity import tpu_compiler
from palladium.interpret.fidelity.checks import APPROXIMATION, uses_compiler
from palladium.interpret.fidelity.xla_placement import ProgramPlacement, program_placement
from palladium.interpret.hook.jax_hook import errors_as_raised, force_tpu_interpret_mode
from palladium.interpret.params import InterpretParams
from palladium.interpret.perf import LaunchRecord, timeline
from palladium.interpret.tune.cost_estimate import cost_estimate
from palladium.interpret.tune.zero_operands import concrete_operand

__all__ = ["PREDICT_DEFAULTS", "Prediction", "REJECTING_ERRORS", "UncertainPredictionWarning",
           "predict"]

#: The ``InterpretParams`` a prediction runs with unless the caller passes others: no
#: floating-point arithmetic and no floating-point data (the model needs the schedule,
#: the DMAs and the costs, never the values), and no tracking of uninitialised values
#: (a diagnostic of values predict does not compute; it cost a quarter of paged
#: attention's prediction: benchmarks/predict_speed.py).
#: Nor integer arrays that steer nothing (``skip_unused_integer_ops``: an ``int8`` dot
#: accumulated into an output block), unless a launch's results reach another launch's
#: operands (then every launch computes them: ``_chained``).
PREDICT_DEFAULTS: dict[str, Any] = {
    "skip_floating_point_ops": True, "keep_float_data": False, "uninitialized_reads": "off",
    "skip_unused_integer_ops": True,
}


class UncertainPredictionWarning(UserWarning):
    """A prediction whose kernel takes decisions on floating-point values, which
    ``predict`` does not compute (``Prediction.float_steered`` names them)."""

#: What a configuration that does not compile or fit raises: ``predict`` reports these
#: as a rejection (``compiles=False``) instead of raising.
REJECTING_ERRORS: tuple[type[BaseException], ...] = (
    TpuResourceError,
    TpuLoweringError,
    TpuCompilerError,
)


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The answer for one configuration on one chip.

    ``compiles``: the compile-and-fit verdict of ``checker`` (the TPU compiler, named
    with its version, or palladium's approximation); when False, ``reason`` says why (the
    first line of the compiler's or the approximation's error, ``error`` its type) and the
    timing fields are None. Times are seconds on the simulated chip, summed over the
    launches the call made (``launches`` holds their :class:`LaunchRecord`).
    ``uncertain``: why the verdict may not be the TPU compiler's (the approximation's
    VMEM count near the limit, or values it cannot size: ``fidelity.confidence``), with
    the one line that gets the compiler's; None for a sure verdict.
    """

    chip: str
    compiles: bool
    checker: str
    reason: str | None = None
    error: str | None = None
    message: str | None = dataclasses.field(default=None, repr=False)  # the error's whole
    predicted_seconds: float | None = None
    bound: str | None = None
    exposed_dma_seconds: float | None = None
    compute_seconds: float | None = None
    #: The TensorCore unit with the most busy time: "MXU", "vector ALU", "EUP"
    #: (transcendentals) or "vector load/store" (what "compute" means in ``bound``).
    compute_unit: str | None = None
    overhead_seconds: float | None = None
    flops: float | None = None
    dma_bytes: int | None = None
    vmem_bytes: int | None = None
    vmem_limit_bytes: int | None = None
    smem_bytes: int | None = None
    smem_limit_bytes: int | None = None
    compiler_vmem_bytes: int | None = None
    grid_steps: int | None = None
    uncertain: str | None = None
    #: The kernel's decisions that depend on floating-point values (which ``predict``
    #: does not compute), as "what (file.py:line)": the walked schedule may not be the
    #: kernel's (a loop ran ``WHILE_GUESS`` iterations, a branch took either side).
    float_steered: tuple[str, ...] = ()
    #: Where the launches' operands were taken to be: XLA's placement of the whole
    #: program (``fidelity.xla_placement``: operands XLA put in VMEM are copied VMEM ->
    #: VMEM), or every operand in HBM and why.
    placement: str | None = None
    wall_seconds: float = 0.0  # what the prediction cost on this CPU
    launches: tuple[LaunchRecord, ...] = dataclasses.field(default=(), repr=False, compare=False)

    def cost_estimate(self, bytes_accessed: str = "traffic") -> Any:
        """The launches' ``pl.CostEstimate`` (see
        :func:`palladium.interpret.tune.cost_estimate`)."""
        if not self.launches:
            raise ConfigError(
                f"no launch to estimate: the configuration was rejected ({self.reason})."
            )
        return cost_estimate(list(self.launches), bytes_accessed=bytes_accessed)

    def summary(self) -> str:
        """One paragraph: the verdict, then time, bound and memory."""
        doubt = "" if self.uncertain is None else f"\n  {self.uncertain}"
        if not self.compiles:
            return f"TPU {self.chip}: does not compile ({self.checker}): {self.reason}{doubt}"
        lines = [
            f"TPU {self.chip}: compiles ({self.checker})" + doubt,
            f"  predicted time   {self.predicted_seconds * 1e6:,.2f} us  "  # type: ignore[operator]
            f"(bound: {self.bound}, busiest unit {self.compute_unit}, exposed DMA {self.exposed_dma_seconds * 1e6:,.2f} us)",  # type: ignore[operator]
            f"  VMEM             {_mib(self.vmem_bytes)} of {_mib(self.vmem_limit_bytes)}",
            f"  SMEM             {_mib(self.smem_bytes)} of {_mib(self.smem_limit_bytes)}",
        ]
        if self.float_steered:
            lines.append(f"  float-steered    decisions on floating-point values: "
                         f"{'; '.join(self.float_steered)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain values (no launch records)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("launches", "message")
        }


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:,.2f} MiB"


_SCOPED_OOM = re.compile(
    r"Scoped allocation with size \S+ and limit \S+ exceeded scoped "
    r"vmem limit by [0-9.]+[KMGB]*\."
)


def short_reason(error: BaseException) -> str:
    """One line saying why a configuration was rejected: the error's first line (the
    line after it too when the first ends in a colon), and the TPU compiler's own
    "Scoped allocation with size ... exceeded ..." sentence when it said one."""
    lines = [ln.strip() for ln in str(error).strip().splitlines() if ln.strip()]
    if not lines:
        return type(error).__name__
    text = lines[0]
    if text.endswith(":") and len(lines) > 1:
        text = f"{text} {lines[1]}"
    oom = _SCOPED_OOM.search(str(error))
    if oom is not None and oom.group(0) not in text:
        text = f"{text} {oom.group(0)}"
    return text


def checker_label(params: InterpretParams) -> str:
    """Who decides whether the kernel compiles under ``params`` (``chip`` set)."""
    if params.compile_check == "off":
        return "not checked"
    if uses_compiler(params):
        return f"TPU compiler ({tpu_compiler.checker_name()})"
    return APPROXIMATION


def predict(
    kernel_fn: Callable[..., Any],
    *args: Any,
    chip: str = DEFAULT_CHIP,
    compile_check: str = "auto",
    placement: str = "auto",
    **params: Any,
) -> Prediction:
    """Check and predict one configuration: ``kernel_fn(*args)`` (a function calling
    ``pl.pallas_call`` or ``pl.core_map``; their own ``interpret=`` is overridden) on TPU
    ``chip``. ``kernel_fn`` must construct the ``pallas_call`` when it is called (``pl.pallas_call``
    reads the interpret mode, which ``predict`` sets, when it is built): pass
    ``lambda x: pl.pallas_call(kernel, ...)(x)``, not a call built beforehand.

    ``args`` may be ``jax.ShapeDtypeStruct`` (zeros are passed: only shapes matter to
    the model) or arrays (scalar-prefetch indices that steer the grid must be real).
    ``compile_check``: ``"auto"`` (the TPU compiler when libtpu can compile for
    ``chip``, else palladium's approximation), ``"compiler"``, ``"approximate"`` or
    ``"off"``. Other keyword arguments are ``InterpretParams`` fields (for example
    ``num_cores_or_threads=2`` for a megacore chip).

    ``placement``: where the kernels' operands live. ``"auto"``: where XLA puts them in
    the whole program (a kernel inside ``jax.grad`` or after other ops may read and
    write VMEM: its block copies are then VMEM -> VMEM), found by compiling the
    program with libtpu when it is installed (else every operand in HBM);
    ``"hbm"``: every operand in HBM. ``Prediction.placement`` says which was used.

    A configuration that does not compile or fit is not an error: the result has
    ``compiles=False`` and the ``reason``. Any other failure of the kernel (an
    out-of-bounds block, a deadlock, a bad argument) raises its palladium exception.

    >>> import jax, jax.numpy as jnp
    >>> from jax.experimental import pallas as pl
    >>> def double(x):
    ...     return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
    ...         out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(8,),
    ...         in_specs=[pl.BlockSpec((128, 1024), lambda i: (i, 0))],
    ...         out_specs=pl.BlockSpec((128, 1024), lambda i: (i, 0)))(x)
    >>> p = predict(double, jax.ShapeDtypeStruct((1024, 1024), jnp.float32),
    ...             compile_check="approximate")
    >>> p.compiles, p.bound, round(p.predicted_seconds * 1e6)
    (True, 'HBM', 13)
    """
    if placement not in ("auto", "hbm"):
        raise ConfigError(f"predict(placement=...) must be 'auto' or 'hbm', got "
                          f"{placement!r}.")
    ip = InterpretParams(**{**PREDICT_DEFAULTS, **params, "chip": chip,
                            "compile_check": compile_check})
    checker = checker_label(ip)
    t0 = time.perf_counter()
    try:
        with errors_as_raised():
            # (abstract: the compile-and-fit check runs in the lowering, before any
            # operand exists; also the kernels' jaxprs, for their float-steered decisions)
            with force_tpu_interpret_mode(ip):
                steered, run, chained, jaxpr = _lowered(kernel_fn, args)
            if chained and ip.skip_unused_integer_ops:  # (lowered again, computing them)
                ip = dataclasses.replace(ip, skip_unused_integer_ops=False)
                with force_tpu_interpret_mode(ip):
                    steered, run, _, jaxpr = _lowered(kernel_fn, args)
            placed = _placement(placement, jaxpr, chip)
            with force_tpu_interpret_mode(ip), timeline(chip, placement=placed) as tl:
                concrete = [concrete_operand(a) for a in args]
                jax.block_until_ready(run(*concrete))
    except ValueError as e:
        if "Only interpret mode is supported" not in str(e):
            raise
        raise ConfigError(
            f"predict: the pallas_call that {getattr(kernel_fn, '__name__', 'kernel_fn')!r} "
            f"calls was built before predict ran (pl.pallas_call reads the interpret mode "
            f"when it is constructed), so it cannot be run on this CPU. Pass a function "
            f"that calls pl.pallas_call(...) itself, e.g. lambda x: pl.pallas_call(kernel, "
            f"...)(x)."
        ) from e
    except REJECTING_ERRORS as e:
        return Prediction(
            chip=chip,
            compiles=False,
            checker=checker,
            reason=short_reason(e),
            error=type(e).__name__,
            message=str(e),
            uncertain=getattr(e, "uncertain", None),
            wall_seconds=time.perf_counter() - t0,
        )
    wall = time.perf_counter() - t0
    records = tuple(tl.launches)
    if not records:
        raise KernelError(
            f"predict: {getattr(kernel_fn, '__name__', kernel_fn)!r} made no "
            f"pallas_call or core_map launch; pass a function that calls one."
        )
    if steered:
        warnings.warn(UncertainPredictionWarning(
            f"predict: the kernel decides on floating-point values, which predict does not "
            f"compute (skip_floating_point_ops): {'; '.join(steered)}. The walked schedule "
            f"may not be the kernel's (a loop ran {WHILE_GUESS} iterations, a branch took "
            f"either side): pass real arrays for the operands that steer it and call the "
            f"kernel under palladium.interpret.timeline() for a measured schedule."),
            stacklevel=2)
    return dataclasses.replace(_from_records(chip, checker, records, wall),
                               float_steered=steered, placement=(
                                   placed.describe() if placed is not None
                                   else "every operand in HBM (placement='hbm')"))


def _placement(placement: str, jaxpr: Any, chip: str) -> ProgramPlacement | None:
    """XLA's placement of the program's operands (``placement="auto"``), else None."""
    if placement == "hbm":
        return None
    if jaxpr is None:
        return ProgramPlacement(reason="not known: the function was not traced on abstract "
                                       "operands")
    return program_placement(jaxpr, chip)


def _lowered(kernel_fn: Callable[..., Any], args: tuple[Any, ...],
             ) -> tuple[tuple[str, ...], Callable[..., Any], bool, Any]:
    """Trace and lower ``kernel_fn`` once on abstract operands (a configuration that
    does not fit raises its rejection here): its kernels' float-steered decisions, what
    runs it on concrete operands (the compiled lowering: the kernel is not traced and
    lowered again; ``kernel_fn`` itself where it cannot be traced abstractly), and
    whether a launch's results may reach another launch (``_chained``; True when not
    known), and the traced program (a ``ClosedJaxpr``; None when not traced)."""
    abstract = [jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in args]
    try:
        traced = jax.jit(kernel_fn).trace(*abstract)
        compiled = traced.lower().compile()
    except REJECTING_ERRORS:
        raise
    except Exception:  # noqa: BLE001 - a kernel_fn that needs concrete values: run it
        return (), kernel_fn, True, None
    found: list[str] = []
    for eqn in traced.jaxpr.jaxpr.eqns:
        for jaxpr in _kernel_jaxprs(eqn):
            found.extend(f"{what} ({line})" for what, line in float_steered(jaxpr))

    def run(*concrete: Any) -> Any:
        # (the operands as the lowering saw them: same dtypes, not weakly typed)
        return compiled(*[jnp.asarray(c, s.dtype) for c, s in zip(concrete, abstract)])

    return tuple(dict.fromkeys(found)), run, _chained(traced.jaxpr.jaxpr), traced.jaxpr


_LAUNCHES = ("pallas_call", "core_map")


def _chained(jaxpr: Any) -> bool:
    """Whether a launch's results in ``jaxpr`` may reach another launch's operands (a
    kernel computing the indices another one prefetches: its integers must then be
    computed). Conservative: a loop or other container around a launch counts."""

    def walk(j: Any, tainted: list[bool]) -> list[bool] | None:
        j = getattr(j, "jaxpr", j)
        env = {v for v, t in zip(j.invars, tainted) if t}
        for eqn in j.eqns:
            ins = [not isinstance(a, jc.Literal) and a in env for a in eqn.invars]
            inner = nested_jaxprs(eqn)
            if eqn.primitive.name in _LAUNCHES:
                if any(ins):
                    return None
                outs = [True] * len(eqn.outvars)
            elif inner and any(any_equation(i, _is_launch) for i in inner):
                if len(inner) != 1 or len(inner[0].invars) != len(eqn.invars):
                    return None
                got = walk(inner[0], ins)
                if got is None:
                    return None
                outs = got
            else:
                outs = [any(ins)] * len(eqn.outvars)
            env.update(v for v, t in zip(eqn.outvars, outs) if t)
        return [not isinstance(a, jc.Literal) and a in env for a in j.outvars]

    return walk(jaxpr, [False] * len(jaxpr.invars)) is None


def _is_launch(eqn: Any) -> bool:
    return eqn.primitive.name in _LAUNCHES


def _kernel_jaxprs(eqn: Any) -> list[Any]:
    """The kernel bodies of the ``pallas_call``s in ``eqn`` (at any depth)."""
    if eqn.primitive.name == "pallas_call":
        return [eqn.params["jaxpr"]]
    return [k for j in nested_jaxprs(eqn) for e in getattr(j, "jaxpr", j).eqns
            for k in _kernel_jaxprs(e)]


_UNITS = {"mxu": "MXU", "vpu": "vector ALU", "eup": "EUP", "vmem": "vector load/store"}


def _busiest_unit(records: tuple[LaunchRecord, ...]) -> str | None:
    busy: dict[str, float] = {}
    for r in records:
        for unit, seconds in r.by_unit.items():
            busy[unit] = busy.get(unit, 0.0) + seconds
    if not busy:
        return None
    return _UNITS.get(max(sorted(busy), key=lambda u: busy[u]))


def _from_records(
    chip: str, checker: str, records: tuple[LaunchRecord, ...], wall: float
) -> Prediction:
    slowest = max(records, key=lambda r: r.predicted_seconds)
    memory = [r.info.memory for r in records if r.info.memory is not None]
    vmem = max((m.vmem.peak_bytes for m in memory), default=None)
    if vmem is None:
        vmem = max(r.vmem_peak_bytes for r in records)
    compiler_vmem = [m.compiler_vmem_bytes for m in memory if m.compiler_vmem_bytes is not None]
    steps = sum(st.steps for r in records for st in r.core_stats.values())
    return Prediction(
        chip=chip,
        compiles=True,
        checker=checker,
        predicted_seconds=sum(r.predicted_seconds for r in records),
        bound=slowest.bound,
        compute_unit=_busiest_unit(records),
        exposed_dma_seconds=sum(r.exposed_dma_seconds for r in records),
        compute_seconds=sum(r.compute_seconds for r in records),
        overhead_seconds=sum(r.overhead_seconds for r in records),
        flops=sum(r.flops for r in records),
        dma_bytes=sum(r.dma_bytes for r in records),
        vmem_bytes=vmem,
        vmem_limit_bytes=(memory[0].vmem.limit_bytes if memory else records[0].vmem_limit_bytes),
        smem_bytes=max((m.smem.peak_bytes for m in memory), default=None),
        smem_limit_bytes=memory[0].smem.limit_bytes if memory else None,
        compiler_vmem_bytes=max(compiler_vmem) if compiler_vmem else None,
        grid_steps=steps,
        uncertain=next((m.uncertain for m in memory if m.uncertain is not None), None),
        wall_seconds=wall,
        launches=records,
    )
