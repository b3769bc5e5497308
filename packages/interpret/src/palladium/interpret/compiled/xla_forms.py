"""Pure equations the traced evaluator binds in another form than jax lowers them to:
the same values, in a form XLA's CPU code runs faster.

- ``tile`` (``jnp.tile``, ``pltpu.repeat``): jax lowers it to a broadcast into a new
  dimension and a reshape, and XLA's CPU backend then fuses the tiled value into its
  consumers element by element, without vector instructions: splash attention's
  ``exp(s - tile(m, (1, 2)))`` over (256, 256) f32 took 161 us, against 52 us with the
  tile bound as a concatenation of copies (the exp alone: 28 us), and splash's whole
  launch ~40% less (benchmarks/LOG.md, 2026-12-07). A concatenation of copies holds
  the tiled array's elements exactly (``tests/compiled/test_xla_forms.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jax import lax

__all__ = ["FORMS"]


def _tile(invals: list[Any], params: dict[str, Any]) -> list[Any]:
    x = invals[0]
    for axis, reps in enumerate(params["reps"]):
        if reps == 0:
            x = lax.slice_in_dim(x, 0, 0, axis=axis)
        elif reps != 1:
            x = lax.concatenate([x] * reps, axis)
    return [x]


#: Per primitive, its form: ``form(operands, bind parameters) -> results``.
FORMS: dict[Any, Callable[[list[Any], dict[str, Any]], list[Any]]] = {lax.tile_p: _tile}
