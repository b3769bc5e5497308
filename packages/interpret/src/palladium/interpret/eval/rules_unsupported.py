"""Primitives of jax's Pallas TPU lowering that the interpreter refuses, by name.

Every primitive jax's TPU lowering has a rule for either has an interpreter rule (here,
``numpy_rules`` or another ``rules_*`` module), is evaluated by ``primitive.bind`` on the
CPU backend (``BOUND_ON_CPU``), or is listed in ``UNSUPPORTED`` with the reason; the
tests enumerate jax's lowering table against these, so a primitive a new jax adds is
found by a test. An unsupported primitive raises ``UnsupportedPrimitiveError`` naming
it, what it is and what to do instead.
"""

from __future__ import annotations

from typing import Any

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import UnsupportedPrimitiveError
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.registry import RULES

_PACK = ("pltpu.pack_elementwise / unpack_elementwise (packing narrow values into the "
         "bits of wider words) are not modelled; bitcast and shift explicitly instead")
_KEYS = ("splitting or joining a TPU hardware PRNG key is not modelled; seed the core's "
         "generator with pltpu.prng_seed and draw with pltpu.prng_random_bits")

UNSUPPORTED: dict[str, str] = {
    "pack_elementwise": _PACK,
    "unpack_elementwise": _PACK,
    "stochastic_round": ("pltpu.stochastic_round rounds with the TPU's hardware random "
                         "bits, which palladium does not model; round with "
                         "lax.convert_element_type, or add your own random bits"),
    "prng_split": _KEYS,
    "prng_join": _KEYS,
    "emit_pipeline": ("jax's own emit_pipeline primitive (jax_use_emit_pipeline_primitive) "
                      "is interpreted by the rule palladium-pipeline brings (pip install "
                      "palladium-pipeline), which is not installed; or use "
                      "palladium.pipeline.emit_pipeline, or leave that flag off"),
    "pipeline_body": ("jax's own emit_pipeline primitive (jax_use_emit_pipeline_primitive) "
                      "is not interpreted; use palladium.pipeline.emit_pipeline, or leave "
                      "that flag off"),
    "empty_ref": ("a ref created inside the kernel body (empty_ref) has no TPU memory "
                  "space; allocate it with pl.run_scoped or scratch_shapes"),
}
"""Primitive name -> why the interpreter refuses it and what to write instead. Those
palladium can name without importing their module get a refusing rule below; the others
(jax's pipeline primitives) are refused by name when ``bind`` finds no CPU
implementation."""

BOUND_ON_CPU: frozenset[str] = frozenset({
    "add_any", "atan2", "broadcast_to", "debug_callback", "debug_print",
    "dim_as_value", "erf", "erf_inv", "gather", "iota_2x32_shape", "platform_index",
    "random_bits", "random_fold_in", "random_seed", "random_unwrap", "random_wrap",
    "reshard", "stack", "stage", "stop_gradient", "tan", "threefry2x32", "unstack",
    "einshape_lo",
})
"""Names of the primitives of jax's TPU lowering that have no interpreter rule of their
own: the evaluator binds them on the CPU backend (their XLA CPU implementation)."""


def refusal(name: str, site: Any) -> UnsupportedPrimitiveError:
    """The error for the ``UNSUPPORTED`` primitive ``name`` at ``site``."""
    return UnsupportedPrimitiveError(
        f"primitive '{name}' is not supported by palladium's interpreter: "
        f"{UNSUPPORTED[name]} ({site})"
    )


def _refuse(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    raise refusal(str(eqn.primitive), ev.site(eqn))


for _p in (jc.pack_elementwise_p,
           jc.unpack_elementwise_p, jc.stochastic_round_p, jc.split_key_p, jc.join_key_p,
           jc.empty_ref_p):
    if _p is not None:
        assert str(_p) in UNSUPPORTED, _p
        RULES.register(_p, _refuse)
