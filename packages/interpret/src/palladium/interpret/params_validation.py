"""Construction-time checks of ``InterpretParams`` values that the field-by-field checks
in ``InterpretParams.__post_init__`` let through and that would otherwise fail only at
launch, obscurely: a negative seed (numpy rejects it deep inside the launch) or one past
64 bits (``OverflowError`` in ``jax.random.key``), more cores per device than any chip
has (each a simulated core with its own stack), a
non-finite or huge ``rendezvous_timeout`` (NaN times out at once, ``inf``/``1e300``
overflow the thread wait), booleans where counts are meant, a ``grid_point_recorder``
that accepts neither of the two call forms."""

from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Callable
from typing import Any

from palladium.interpret.errors import ConfigError

__all__ = ["validate_values"]

_COUNTS = ("num_cores_or_threads", "dma_order_trials", "vector_clock_size")

# jax.random.key (the grid order of seeds beyond 32 bits) takes a signed 64-bit seed.
SEED_LIMIT = 2**63
# Cores per device simulated at most: a TPU chip has 1 or 2 TensorCores (megacore); a
# few more keep tests of uneven megacore splits possible, thousands only burn memory.
MAX_CORES_PER_DEVICE = 16


def validate_values(params: Any) -> None:
    """Raise ``ConfigError`` (a ``ValueError``) naming the field, the value and what is accepted."""
    for field in _COUNTS:
        value = getattr(params, field, None)
        if isinstance(value, bool):
            raise ConfigError(f"InterpretParams.{field} must be an int, got the bool {value!r}.")
    seed = params.random_seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ConfigError(
            f"InterpretParams.random_seed must be None or an int >= 0, got {seed!r}."
        )
    if seed is not None and seed >= SEED_LIMIT:
        raise ConfigError(
            f"InterpretParams.random_seed must be None or an int in [0, 2**63) (jax.random.key "
            f"takes a signed 64-bit seed), got {seed!r}. Reduce it modulo 2**63."
        )
    trials = params.dma_order_trials
    if seed is not None and isinstance(trials, int) and seed + trials >= SEED_LIMIT:
        raise ConfigError(
            f"InterpretParams.random_seed + dma_order_trials must stay below 2**63 (the trials "
            f"run seeds random_seed+1 .. random_seed+dma_order_trials), got random_seed={seed} "
            f"and dma_order_trials={trials}."
        )
    check_cores_per_device(params.num_cores_or_threads, "InterpretParams.num_cores_or_threads")
    _check_timeout("rendezvous_timeout", params.rendezvous_timeout)
    recorder = params.grid_point_recorder
    if recorder is not None and callable(recorder) and not _recorder_arity_ok(recorder):
        raise ConfigError(
            "InterpretParams.grid_point_recorder must accept (token, grid_point, core_id) "
            "(jax 0.10.2's form) or (grid_point, core_id), got "
            f"{recorder!r} with signature {inspect.signature(recorder)}."
        )


def check_cores_per_device(cores: int, what: str, kernel: str = "") -> None:
    """``ConfigError`` if ``cores`` (per device) exceeds ``MAX_CORES_PER_DEVICE``."""
    if cores <= MAX_CORES_PER_DEVICE:
        return
    if kernel:
        raise ConfigError(
            f"{kernel}: {what} has {cores} cores per device; palladium simulates at most "
            f"{MAX_CORES_PER_DEVICE} TensorCores per device (a TPU chip has 1 or 2). To "
            f"simulate more chips, run the kernel under shard_map on more devices."
        )
    raise ConfigError(
        f"{what} must be at most {MAX_CORES_PER_DEVICE} TensorCores per device (a TPU chip has "
        f"1 or 2), got {cores}. To simulate more chips, run the kernel under shard_map on "
        f"more devices."
    )


def _check_timeout(field: str, value: Any) -> None:
    ok = (
        isinstance(value, int | float) and not isinstance(value, bool)
        and math.isfinite(value) and 0 < value <= threading.TIMEOUT_MAX
    )
    if not ok:
        raise ConfigError(
            f"InterpretParams.{field} must be a finite number of seconds > 0 and at most "
            f"threading.TIMEOUT_MAX ({threading.TIMEOUT_MAX:g}), got {value!r}."
        )


def _recorder_arity_ok(recorder: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(recorder)
    except (TypeError, ValueError):  # no signature (some builtins): cannot tell
        return True
    for args in ((0, (), 0), ((), 0)):
        try:
            sig.bind(*args)
        except TypeError:
            continue
        return True
    return False
