"""jax's Python-level seams around a ``pallas_call``'s caller and the user's code: the
``pl.pallas_call`` function itself, jax's traceback filtering, its exit barriers, where
a function a jaxpr was traced from lives."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def wrap_pallas_call(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Make ``jax.experimental.pallas.pallas_call`` (``pl.pallas_call``, looked up when
    called) ``wrap(jax's pallas_call)``, once: whether this call wrapped it."""
    import jax.experimental.pallas as pl_module

    if getattr(pl_module.pallas_call, "_palladium_wrapped", False):
        return False
    wrapped = wrap(pl_module.pallas_call)
    wrapped._palladium_wrapped = True  # type: ignore[attr-defined]
    pl_module.pallas_call = wrapped  # type: ignore[assignment]
    return True


def api_boundary(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as one of jax's API boundaries: an exception leaving it has the frames of
    jax's files and of the files passed to ``hide_frames_of`` dropped from its traceback
    (``JAX_TRACEBACK_FILTERING=off`` keeps them)."""
    from jax._src import traceback_util

    return traceback_util.api_boundary(fn)


def hide_frames_of(path: str) -> None:
    """Treat the files under ``path`` as jax treats its own: left out of the tracebacks
    jax filters and never taken for the user's frame of an equation."""
    from jax._src import traceback_util

    if path not in traceback_util._exclude_paths:
        traceback_util.register_exclusion(path)


def forget_failed_runtime_tokens(reported: Callable[[str], bool]) -> None:
    """Drop the runtime tokens jax keeps per device (the last computation with host
    callbacks) whose computation failed with an error ``reported(text)`` says the caller
    was already given: jax's exit barriers would raise each of them again (twice: its
    ``clean_up`` and ``wait_for_tokens``). Other tokens are left for them."""
    from jax._src import dispatch

    tokens = dispatch.runtime_tokens.output_runtime_tokens
    for device, token in list(tokens.items()):
        try:
            token.block_until_ready()
        except Exception as error:  # noqa: BLE001 - any failure of that computation
            if reported(str(error)):
                tokens.pop(device, None)


def wait_for_cpu_computations(deadline: float) -> None:
    """Until the computations that produce the live CPU arrays are done, failed ones
    too, or ``time.monotonic()`` passes ``deadline``."""
    import time

    import jax

    def running(array: Any) -> bool:
        try:
            return not array.is_ready()
        except Exception:  # noqa: BLE001 - deleted, or failed: not running
            return False

    pending = [a for a in jax.live_arrays("cpu") if running(a)]
    while pending and time.monotonic() < deadline:
        time.sleep(0.005)
        pending = [a for a in pending if running(a)]


def function_location(closed_jaxpr: Any) -> str | None:
    """"name at file.py:line" of the Python function a jaxpr was traced from (an index
    map's), or None where jax did not record it."""
    info = getattr(getattr(closed_jaxpr, "jaxpr", None), "debug_info", None)
    text = getattr(info, "func_src_info", None)
    if not text or " at " not in text:
        return None
    name, _, where = text.rpartition(" at ")
    return f"{name} at {os.path.basename(where)}"
