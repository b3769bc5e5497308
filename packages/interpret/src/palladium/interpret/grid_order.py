"""The order in which a launch visits the coordinates of its parallel grid dimensions.

On a TPU the cores split a parallel dimension and nothing orders one core's grid points
against another's; a kernel correct for one order is not necessarily correct for
another. The interpreter therefore visits each parallel dimension in a shuffled order,
reproducible from ``InterpretParams.random_seed``. It shuffles exactly as jax's TPU
interpreter does for the same seed (a ``jax.random.key(seed)``, split once per parallel
dimension, each subkey permuting that dimension's coordinates), so that a test recording
grid points (``grid_point_recorder``) sees the same order under both.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _orders(seed: Any, sizes: tuple[int, ...]) -> list[Any]:
    key = jax.random.key(seed)
    orders = []
    for n in sizes:
        key, subkey = jax.random.split(key)
        orders.append(jax.random.permutation(subkey, jnp.arange(n, dtype=jnp.int32)))
    return orders


# One compilation per tuple of sizes (the seed is an operand): evaluating the same ops
# eagerly compiles each of them, for every new seed too.
_orders_jit = jax.jit(_orders, static_argnums=(1,))
_INT32 = range(-(2**31), 2**31)


@functools.lru_cache(maxsize=256)
def parallel_orders(sizes: tuple[int, ...], seed: int) -> tuple[np.ndarray, ...]:
    """One permutation of ``range(n)`` per parallel dimension of size ``n`` (in grid
    order) for ``seed``."""
    if not sizes:
        return ()
    # Computed on the host CPU, whatever jax's default device is.
    with jax.default_device(jax.devices("cpu")[0]):
        if seed in _INT32:
            computed = _orders_jit(np.int32(seed), sizes)
        else:  # a seed beyond int32 only as a Python int, as jax.random.key takes it
            computed = _orders(seed, sizes)
        orders = [np.array(o) for o in computed]
    for order in orders:
        order.setflags(write=False)
    return tuple(orders)
