"""The lowering check: does jax's Mosaic lowering (the TPU compiler's front end) accept
the kernel for the simulated chip?

Run once per lowering of a ``pallas_call`` (jax caches lowerings, so once per kernel and
shapes), before the kernel runs. Mosaic's errors become ``TpuLoweringError`` naming the
kernel, its ``pallas_call`` line and the kernel line of the equation Mosaic was lowering,
with Mosaic's message whole. When Mosaic fails for a reason that is not the kernel's
(limits of jax 0.10.x's lowering that a TPU run of the same program would not hit, such
as ``vmap`` of a kernel with ``pl.ANY`` operands), the check warns
(``TpuLoweringWarning``) instead: the check never rejects a kernel a TPU accepts.

The kernel is lowered as ``jax.jit`` lowers it for a TPU (the path ``jax.export(...,
platforms=["tpu"])`` takes on a CPU box, with a current libtpu assumed). What libtpu's
Mosaic passes check later (vector dtypes per operation, layouts, alignment, MXU dtypes,
grid semantics) is approximated by the rules of ``approx_registry``, learned from the
compiler per chip and applied after the lowering. ``core_map`` kernels are not checked
(they lower through jax's ``mpmd_map`` rule).

On by default (``InterpretParams(check_lowering=True)``), in line, so that its error
comes before anything the interpretation finds. Measured on
``benchmarks/interpret_vs_jax.py``'s kernels (``benchmarks/fidelity_checks.py``; a
shared 2-core machine, four runs at load 2-19): 0.03-0.14 s of matmul's and
0.06-0.41 s of flash attention's first call, 2-11% of it (a fresh MLIR context takes
~0.02 s of that). That share comes off the first-call ratio against jax's interpreter,
which for flash attention sits near its 10x target. A kernel Mosaic lowered without a
failure is remembered (``MOSAIC_LOWERED``, by ``call_key``, in memory and under the cache
root): lowered again, in this process or a later one, it is not handed to Mosaic again
(the approximation's rules and the VMEM/SMEM count still run). A failure is never
remembered: it is reported from a fresh lowering every time.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import jax

from palladium.interpret import _jax_compat as jc
from palladium.interpret.chip import device_kind
from palladium.interpret.errors import TpuLoweringError, TpuLoweringWarning
from palladium.interpret.eval.registry import RULES
from palladium.interpret.fidelity import approx_access, approx_rules, tpu_compiler  # noqa: F401  (rules)
from palladium.interpret.fidelity.approx_registry import Violation, first_violation
from palladium.interpret.fidelity.call_key import KeySet, call_key
from palladium.interpret.kernel.prepared_kernel import PreparedKernel
from palladium.interpret.state.environment import environment_digest
from palladium.interpret.state.process_state import STATE

#: Said under every verdict of the approximation: which checker spoke.
APPROXIMATION_NOTE = (
    "(Checked by palladium's approximation; where libtpu is installed, the TPU compiler "
    "itself decides: pip install 'palladium-interpret[compiler]'.)")



def approximation_note(chip: str) -> str:
    """Said under a verdict of the approximation on ``chip``: which checker spoke, and
    why the compiler did not (not installed, or the installed libtpu cannot compile for
    ``chip``: v4i, v7, TPU8i with jax 0.10.x's libtpu)."""
    version = tpu_compiler.compiler_version()
    if version is None or tpu_compiler.can_compile_for(chip):
        return APPROXIMATION_NOTE
    return (f"(Checked by palladium's approximation: the installed libtpu {version} cannot "
            f"compile for TPU {chip}, so this verdict approximates the TPU compiler's.)")


__all__ = ["APPROXIMATION_NOTE", "approximation_note", "check_lowering", "device_kind", "equation_line",
           "kernel_line", "not_the_kernels_fault", "unknown_everywhere"]

# Mosaic's own block-shape checks run before any equation is lowered; a failure there is
# the kernel's (its BlockSpecs), although no kernel equation is on the stack.
_BLOCK_CHECKS = ("The Pallas TPU lowering currently", "Non-trivial windowing is not supported")

# Failures that are limits of jax 0.10.x's Mosaic lowering (newer jax lowers these
# kernels): the start of Mosaic's message -> what to say.
_JAX_LIMITS = {
    "Only single (1) and double (2) buffering are supported":
        "jax 0.10.x's Mosaic lowering buffers a BlockSpec operand at most twice",
}


def check_lowering(kernel: PreparedKernel, ctx: Any, *, chip: str, num_cores: int,
                   mosaic: bool = True) -> None:
    """Lower ``kernel`` through Mosaic for ``chip`` (when ``mosaic``); raise
    ``TpuLoweringError`` if Mosaic rejects it, warn ``TpuLoweringWarning`` if it fails for
    a reason not the kernel's. Then apply the approximation's rules of what the TPU
    compiler rejects beyond Mosaic's lowering (``approx_rules``).

    ``ctx`` is the CPU lowering context of the ``pallas_call`` equation.
    """
    if kernel.is_core_map:
        return  # core_map lowers through jax's mpmd_map rule: not checked (see module docs)
    if mosaic:
        key = _lowering_key(kernel, ctx, chip, num_cores)
        if key is None or not MOSAIC_LOWERED.knows(key):
            try:
                jc.mosaic_lower(ctx, kernel.grid_mapping, kernel.jaxpr, kernel.compiler_params,
                                device_kind=device_kind(chip), num_cores=num_cores)
            except Exception as exc:  # noqa: BLE001  (every Mosaic failure is reported)
                _report(kernel, chip, exc)
            else:
                if key is not None:
                    MOSAIC_LOWERED.add(key)
    violation = first_violation(kernel, chip)
    if violation is not None:
        _report_rule(kernel, chip, violation)


def _lowering_key(kernel: PreparedKernel, ctx: Any, chip: str, num_cores: int) -> str | None:
    """What Mosaic's lowering of ``kernel`` is a function of (``call_key``), or None."""
    return call_key(
        {"grid_mapping": kernel.grid_mapping, "jaxpr": kernel.jaxpr,
         "compiler_params": kernel.compiler_params}, ctx.avals_in,
        "mosaic-lowers", environment_digest(), device_kind(chip), num_cores,
        jc.mosaic_context(ctx), sorted(jax.config.values.items()))


#: The kernels (by ``_lowering_key``) jax's Mosaic lowering lowered without a failure,
#: in memory and on disk: lowered again, such a kernel is not handed to Mosaic again. A
#: failure is never kept: it is reported from a fresh lowering every time.
MOSAIC_LOWERED: KeySet = STATE.keep(
    "mosaic_lowered", KeySet("mosaic-lowered"), owner=__name__,
    holds="the kernels jax's Mosaic lowering lowered clean (also on disk)",
    clear=lambda: MOSAIC_LOWERED.clear())


def _report_rule(kernel: PreparedKernel, chip: str, violation: Violation) -> None:
    eqn = violation.eqn
    line = equation_line(kernel, eqn) if eqn is not None else None
    at = f" at {line} ({eqn.primitive.name})" if eqn is not None and line else ""
    raise TpuLoweringError(
        f"{kernel.named('pallas_call at ')} does not compile for TPU {chip}{at}: palladium's "
        f"approximation of the TPU compiler says: {violation.message}\n"
        "A TPU rejects this kernel at compile time (InterpretParams(compile_check="
        "'compiler') asks the compiler itself when libtpu is installed); "
        "InterpretParams(check_lowering=False) skips this check.\n"
        + approximation_note(chip))


def _report(kernel: PreparedKernel, chip: str, exc: Exception) -> None:
    message = _mosaic_message(exc)
    where = kernel.named("pallas_call at ")
    if unknown_everywhere(exc):
        return  # the interpreter's UnsupportedPrimitiveError says it better
    line, primitive = kernel_line(kernel, exc)
    not_ours = not_the_kernels_fault(kernel, exc)
    # A failed MLIR verification of the lowered kernel names no equation, but the
    # compiler, which lowers the same way, fails there too.
    verification = type(exc).__name__ == "VerificationError"
    if not_ours is None and (line is not None or verification
                             or str(exc).startswith(_BLOCK_CHECKS)):
        at = f" at {line} ({primitive})" if line else _operand(kernel, message)
        error = TpuLoweringError(
            f"{where} does not lower for TPU {chip}{at}: jax's Mosaic lowering says:\n"
            f"{message}\n"
            "A TPU rejects this kernel at compile time. Change the kernel as Mosaic asks "
            "(blocks whose last two dimensions are divisible by 8 and 128 or equal to the "
            "array's, operations Mosaic lowers, supported dtypes); "
            "InterpretParams(check_lowering=False) skips this check."
            + print_hint(primitive) + "\n" + approximation_note(chip)
        )
        # Mosaic's message is in the text; its exception (with ~25 frames of jax's
        # lowering) stays readable as .mosaic_error instead of printed as the cause.
        error.mosaic_error = exc  # type: ignore[attr-defined]
        raise error from None
    reason = not_ours or "the failure is outside the kernel's equations and block specs"
    warnings.warn(
        f"{where}: the TPU lowering check for TPU {chip} could not decide ({reason}); "
        f"the kernel runs unchecked. jax's Mosaic lowering said:\n{message}",
        TpuLoweringWarning, stacklevel=2,
    )


def print_hint(primitive: object) -> str:
    """For a print the TPU rejects (``pl.debug_print`` / ``jax.debug.print`` of a float
    or an array with a placeholder): how to print while debugging on the CPU."""
    if primitive != "debug_print":
        return ""
    return (
        "\nTo print while debugging on the CPU, pass InterpretParams(check_lowering=False): "
        "palladium then prints any value, as jax.debug.print does (on a TPU, Mosaic prints "
        "only 32-bit integer scalars through placeholders, or a plain message followed by "
        "one array). Remove the print, or keep it off the TPU, before compiling for it."
    )


def _operand(kernel: PreparedKernel, message: str) -> str:
    """", operand 'x_ref'" when Mosaic's block-spec message names one of the operands."""
    names = [b.name for b in (*kernel.inputs, *kernel.outputs)]
    for bm, name in zip(kernel.grid_mapping.block_mappings, names):
        if f"Block spec for {bm.origin} " in message:
            return f", operand '{name}'"
    return ""


def _mosaic_message(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    # jax_pallas_verbose_errors wraps the rule's error in a LoweringException whose text
    # already holds the cause's; keep the text whole either way. (jax chains a
    # JaxStackTraceBeforeTransformation marker as the cause of errors raised while
    # lowering: it only carries the user's traceback, which we name as a line.)
    if (cause is not None and type(cause).__name__ != "JaxStackTraceBeforeTransformation"
            and str(cause) not in text):
        text += f"\n(caused by {type(cause).__name__}: {cause})"
    return text


def kernel_line(kernel: PreparedKernel, exc: BaseException) -> tuple[str | None, str | None]:
    """``file.py:line`` of the innermost kernel equation Mosaic was lowering that has a
    user source line, and the primitive Mosaic failed on (the innermost equation's: the
    line may belong to an enclosing one, e.g. the ``jit`` of ``jnp.cumsum``)."""
    eqns = jc.mosaic_failing_equations(exc)
    for eqn in reversed(eqns):
        line = equation_line(kernel, eqn)
        if line is not None:
            return line, eqns[-1].primitive.name
    return None, None


def equation_line(kernel: PreparedKernel, eqn: Any) -> str | None:
    """``file.py:line`` of ``eqn``'s user source line (or its enclosing equation's)."""
    frame = jc.user_frame(kernel.inherited_sources.get(id(eqn), eqn.source_info))
    return f"{os.path.basename(frame[0])}:{frame[1]}" if frame is not None else None


def unknown_everywhere(exc: BaseException) -> bool:
    """Mosaic failed on a primitive neither palladium nor jax can evaluate on CPU (nor
    Mosaic lower)."""
    eqns = jc.mosaic_failing_equations(exc)
    if not eqns:
        return False
    primitive = eqns[-1].primitive
    return (primitive not in RULES and RULES.compiler(primitive) is None
            and not jc.has_cpu_lowering(primitive))


def not_the_kernels_fault(kernel: PreparedKernel, exc: BaseException) -> str | None:
    """Why a Mosaic failure is a limit of jax's lowering rather than the kernel's, or None."""
    for start, reason in _JAX_LIMITS.items():
        if str(exc).startswith(start):
            return reason
    eqns = jc.mosaic_failing_equations(exc)
    if eqns and eqns[-1].primitive in RULES.external:
        return (f"primitive '{eqns[-1].primitive.name}' has a palladium rule "
                "(register_interpret_rule) but no Mosaic lowering rule in this process")
    if kernel.grid_mapping.vmapped_dims and any(
        b.in_hbm for b in (*kernel.inputs, *kernel.outputs)
    ):
        return "jax 0.10.x cannot lower a vmapped kernel with pl.ANY / HBM operands"
    return None
