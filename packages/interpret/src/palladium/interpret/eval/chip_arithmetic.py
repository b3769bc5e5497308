"""Pure equations bound for XLA's CPU backend so that they compute what a TPU computes.

Compiled segments and launches (``compiled/traced_eval.py``) bind a
kernel body's pure equations as they are and let XLA compile them for the CPU. Two of
XLA's CPU rewrites give other results than the chip (measured on a v5e against jax
0.10.2's CPU backend; ``benchmarks/chip/compiled_semantics.py``):

- **NaN in a max/min reduction.** ``jnp.max``/``jnp.min`` over the rows of a (64, 128)
  f32 block with one NaN gives NaN on the chip, as numpy (the simulator) does; XLA's CPU
  reduction (``reduce_max``/``reduce_min``) drops it, whatever
  ``xla_cpu_enable_fast_min_max`` says (measured: the option changes nothing for a
  reduction; elementwise ``max``/``min`` do propagate NaN). A float reduction is
  therefore bound with the NaN put back: ``where(any(x != x), NaN, reduce(x))``.
- **Fused multiply-add.** XLA's CPU compiler lets LLVM contract ``a * x + y`` into an FMA
  (one rounding); the chip rounds the product and the sum separately (f32, 32768 of
  32768 elements equal to separate rounding), and so does numpy; with contraction 24% of
  the elements of a (256, 128) f32 ``a * x + y`` differ by 1-2 ulp. No compile option
  turns contraction off per executable (``xla_cpu_enable_fast_math=false``,
  ``xla_cpu_max_isa`` passed as a compile option, an ``optimization_barrier`` around the
  product: all measured, all still contracted; only ``XLA_FLAGS=--xla_cpu_max_isa=AVX``
  for the whole process stops it). So each float product is bound as
  ``product + z``, where ``z`` is ``-0.0`` handed to the executable as an operand:
  ``p + -0.0`` is ``p`` for every ``p`` (signed zeros and NaN included), but LLVM cannot
  fold an addend it does not know, and contracts the product into ``fma(a, x, -0.0)``,
  which is the product rounded once; the sum after it is a separate rounding.

:func:`chip_function` wraps a traced function so that its executable takes ``z`` first;
:func:`bind` binds one equation while tracing such a function. The remaining
differences between XLA's CPU code and the chip (transcendental functions, division,
subnormals) are listed in ``docs/compiled-semantics.md``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from jax import lax

__all__ = ["NEGATIVE_ZERO", "bind", "chip_function"]

#: The operand every executable made by :func:`chip_function` takes first.
NEGATIVE_ZERO = np.float32(-0.0)

# The ``-0.0`` operand of the function being traced (set by ``chip_function`` while it
# traces; None outside, where products are bound as they are).
_ZERO: contextvars.ContextVar[Any] = contextvars.ContextVar("palladium_negative_zero",
                                                             default=None)
# Primitives whose float result is a product XLA may contract with an add that uses it.
_PRODUCTS = frozenset({lax.mul_p, lax.square_p, lax.integer_pow_p})
_NAN_REDUCTIONS = frozenset({lax.reduce_max_p, lax.reduce_min_p})


@contextlib.contextmanager
def _negative_zero(z: Any) -> Iterator[None]:
    token = _ZERO.set(z)
    try:
        yield
    finally:
        _ZERO.reset(token)


def chip_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``g(z, *args) = fn(*args)``, traced so that :func:`bind` can use ``z``: call the
    executable of ``g`` with ``NEGATIVE_ZERO`` first."""
    def g(z: Any, *args: Any) -> Any:
        with _negative_zero(z):
            return fn(*args)
    return g


def _floating(x: Any) -> bool:
    return np.issubdtype(np.dtype(x.dtype), np.floating)


def bind(prim: Any, invals: list[Any], params: dict[str, Any]) -> list[Any]:
    """``prim.bind(*invals, **params)`` as the chip computes it (the module docstring)."""
    out = prim.bind(*invals, **params)
    if prim in _NAN_REDUCTIONS and _floating(out):
        x = invals[0]
        axes = tuple(params["axes"])
        nan = lax.reduce_or(lax.ne(x, x), axes)
        out = lax.select(nan, lax.full_like(out, np.nan), out)
    elif prim in _PRODUCTS and _floating(out):
        z = _ZERO.get()
        if z is not None:
            out = lax.add(out, lax.convert_element_type(z, out.dtype))
    return list(out) if prim.multiple_results else [out]
