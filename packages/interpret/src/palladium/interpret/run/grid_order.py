"""The order in which a launch visits the coordinates of its parallel grid dimensions.

On a TPU the cores split a parallel dimension and nothing orders one core's grid points
against another's; a kernel correct for one order is not necessarily correct for
another. The interpreter therefore visits each parallel dimension in a shuffled order,
reproducible from ``InterpretParams.random_seed``. It shuffles exactly as jax's TPU
interpreter does for the same seed (a ``jax.random.key(seed)``, split once per parallel
dimension, each subkey permuting that dimension's coordinates), so that a test recording
grid points (``grid_point_recorder``) sees the same order under both.

The permutations are computed here with numpy, not with ``jax.random``: jax would
compile an XLA computation for every new tuple of dimension sizes, 0.2-0.8 s of a
kernel's first call. jax's default PRNG is Threefry-2x32 (20 rounds, Salmon et al.,
"Parallel random numbers: as easy as 1, 2, 3", SC 2011) in its "partitionable" layout:
a key is two uint32 words; ``key(seed)`` of a 32-bit seed is ``(0, seed)``; ``split``
hashes the counters ``(0, i)`` for ``i`` in ``range(2)``; a permutation of ``n`` sorts
``range(n)`` (stably) by 32-bit keys ``hi ^ lo`` of the hashes of ``(0, i)`` under a
subkey, in ``ceil(3 ln n / ln(2^32 - 1))`` rounds, splitting the key before each. The
test compares every result with ``jax.random`` (``test_grid_order.py``).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from palladium.interpret import _jax_compat as jc

_U32 = np.uint32
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = _U32(0x1BD11BDA)  # Threefry's key-schedule constant
_INT32 = range(-(2**31), 2**31)

Key = tuple[np.ndarray, np.ndarray]  # two uint32 words (0-d arrays)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U32(r)) | (x >> _U32(32 - r))


def threefry2x32(key: Key, hi: np.ndarray, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Threefry-2x32 hash (20 rounds) of the counter pairs ``(hi, lo)`` (uint32
    arrays of one shape) under ``key``; returns the two output words."""
    ks = (key[0], key[1], key[0] ^ key[1] ^ _PARITY)
    x0 = hi + ks[0]
    x1 = lo + ks[1]
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = _rotl(x1, r) ^ x0
        x0 = x0 + ks[(block + 1) % 3]
        x1 = x1 + ks[(block + 2) % 3] + _U32(block + 1)
    return x0, x1


def _hash_range(key: Key, n: int) -> tuple[np.ndarray, np.ndarray]:
    return threefry2x32(key, np.zeros(n, _U32), np.arange(n, dtype=_U32))


def key_of_seed(seed: int) -> Key:
    """``jax.random.key(seed)`` of a 32-bit seed: the words ``(0, seed mod 2^32)``."""
    return np.zeros((), _U32), np.array(seed % 2**32, dtype=_U32)


def split(key: Key) -> tuple[Key, Key]:
    """``jax.random.split(key)``: two new keys."""
    hi, lo = _hash_range(key, 2)
    return (hi[0], lo[0]), (hi[1], lo[1])


def permutation(key: Key, n: int) -> np.ndarray:
    """``jax.random.permutation(key, jnp.arange(n, dtype=jnp.int32))``."""
    x = np.arange(n, dtype=np.int32)
    rounds = math.ceil(3 * math.log(max(1, n)) / math.log(2**32 - 1))
    for _ in range(rounds):
        key, subkey = split(key)
        hi, lo = _hash_range(subkey, n)
        x = x[np.argsort(hi ^ lo, kind="stable")]
    return x


def _orders_with_jax(seed: int, sizes: tuple[int, ...]) -> list[np.ndarray]:
    """The same through ``jax.random``: for a seed beyond 32 bits (as jax takes it), or
    when the program chose another PRNG for jax."""
    import jax  # noqa: PLC0415  (only for seeds numpy's path does not model)
    import jax.numpy as jnp  # noqa: PLC0415

    with jax.default_device(jax.devices("cpu")[0]):
        key = jax.random.key(seed)
        orders = []
        for n in sizes:
            key, subkey = jax.random.split(key)
            orders.append(np.array(jax.random.permutation(subkey, jnp.arange(n, dtype=jnp.int32))))
    return orders


def _numpy_models_jax() -> bool:
    """Whether jax's default PRNG is the one modelled here (a program may choose
    another with ``jax_default_prng_impl`` or ``jax_threefry_partitionable``)."""
    return jc.default_prng_is_partitionable_threefry()


def parallel_orders(sizes: tuple[int, ...], seed: int) -> tuple[np.ndarray, ...]:
    """One permutation of ``range(n)`` per parallel dimension of size ``n`` (in grid
    order) for ``seed``."""
    return _parallel_orders(sizes, seed, _numpy_models_jax())


@functools.lru_cache(maxsize=256)
def _parallel_orders(sizes: tuple[int, ...], seed: int,
                     numpy_models_jax: bool) -> tuple[np.ndarray, ...]:
    if not sizes:
        return ()
    if seed in _INT32 and numpy_models_jax:
        key = key_of_seed(seed)
        orders = []
        for n in sizes:
            key, subkey = split(key)
            orders.append(permutation(subkey, n))
    else:
        orders = _orders_with_jax(seed, sizes)
    for order in orders:
        order.setflags(write=False)
    return tuple(orders)
