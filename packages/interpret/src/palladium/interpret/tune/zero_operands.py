"""The operands ``predict`` runs a kernel on for its ``jax.ShapeDtypeStruct`` arguments:
zeros that cost nothing to make (issue 40, item 4).

``jnp.zeros`` compiles a fill per shape in a fresh process and writes every byte (paged
attention's two 128 MiB page arrays: ~0.1 s of ``predict``'s CPU). ``np.zeros`` of that
size is memory the system zeroes when it is first touched, and jax's CPU client takes a
numpy array aligned to 64 bytes without a copy (it keeps the array alive). ``predict``
runs with ``keep_float_data=False``, so the interpreter never reads a floating-point
operand (``hook/jax_hook._own_copy``): its pages are never touched. The values are the
same zeros, on the same device (the default one; off the CPU ``jax.device_put`` copies).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["concrete_operand"]

_ALIGN = 64  # the alignment jax's CPU client needs to take a host buffer as it is


def concrete_operand(arg: Any) -> Any:
    """``arg``, or zeros of its shape and dtype where it is a ``jax.ShapeDtypeStruct``."""
    if not isinstance(arg, jax.ShapeDtypeStruct):
        return arg
    try:
        dtype = np.dtype(arg.dtype)
    except TypeError:  # (an extended dtype: a PRNG key's)
        return jnp.zeros(arg.shape, arg.dtype)
    nbytes = math.prod(arg.shape) * dtype.itemsize
    raw = np.zeros(nbytes + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return jax.device_put(raw[start:start + nbytes].view(dtype).reshape(arg.shape))
