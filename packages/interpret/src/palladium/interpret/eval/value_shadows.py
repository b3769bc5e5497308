"""Uninitialised memory reported on use, as MemorySanitizer does for C
(``InterpretParams(uninitialized_reads="on_use")``, the default).

A value read from memory that holds no initialised data (a scratch nothing wrote, an
output block at a new block index, the padding of a partial edge block) carries a
*shadow*: a bool mask, True where its element derives from uninitialised data, and the
``UninitializedOrigin`` of that data. Values read from initialised memory carry nothing
(a plain array): they cost one type check per operand. Every equation propagates the
shadow to its results (elementwise: any operand's; ``select_n``: the chosen case's and
the predicate's; reductions and dots: any contributing element's; moves: the moved
elements'), stores keep it in the buffer (``Simulation.set_initialized``), DMAs and
block copies carry it (the simulator). A shadowed value is reported
(``UninitializedUseError``) only where it decides something: a branch, a loop, an index
or a DMA or semaphore operand. What reaches an output is reported when the launch ends
(``run/launch.py``); data masked away or overwritten is never reported.

This module holds the values and their origins and messages; the evaluator's loop and
the rules with something to decide are ``shadow_rules.py``, the shadow of each pure
computation ``shadow_propagation.py``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from palladium.interpret.errors import UninitializedUseError
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.shared_memory import UninitializedOrigin
from palladium.shared_memory.errors import at_site, core_name

__all__ = ["Tainted", "describe_origin", "first_tainted", "fix_hint", "full_shadow", "plain",
           "read_origin", "region_shadow", "report_use", "root", "shadow_of", "stored_origin",
           "tainted", "view_shadow"]


class Tainted:
    """A value derived (in part) from uninitialised memory: the value as computed,
    ``shadow`` (a bool array broadcastable to it: True where the element derives from
    uninitialised data) and the ``origin`` of that data. Only the evaluator's loop and
    the rules below see one; anything else that asks for its truth or an index from it
    reports the use."""

    __slots__ = ("origin", "shadow", "value")

    def __init__(self, value: Any, shadow: np.ndarray, origin: UninitializedOrigin) -> None:
        self.value = value
        self.shadow = shadow
        self.origin = origin

    def _used(self, what: str) -> UninitializedUseError:
        return UninitializedUseError(
            f"{what} is derived from uninitialised memory: {describe_origin(self.origin)}. "
            f"{fix_hint(self.origin)}")

    def __bool__(self) -> bool:
        raise self._used("a condition")

    def __index__(self) -> int:
        raise self._used("an index")

    __int__ = __index__

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.value, dtype=dtype)


def plain(x: Any) -> Any:
    """``x`` without its shadow."""
    return x.value if x.__class__ is Tainted else x


def describe_origin(origin: UninitializedOrigin) -> str:
    """Where uninitialised data came from, as a message says it."""
    if origin.kind == "stored" and origin.source is not None:
        return (f"stored into {origin.what}{at_site(origin.site)}, derived from "
                + describe_origin(origin.source))
    text = f"{origin.what} read{at_site(origin.site)}"
    if origin.kind == "padding":
        return text + " (the padding of a partial edge block: on a TPU, whatever VMEM held)"
    return text + " before anything wrote it (on a TPU: whatever an earlier kernel left there)"


def root(origin: UninitializedOrigin) -> UninitializedOrigin:
    """The read an origin goes back to (a store's record names the read it stored)."""
    while origin.kind == "stored" and origin.source is not None:
        origin = origin.source
    return origin


def fix_hint(origin: UninitializedOrigin) -> str:
    """What to change in the kernel, by where the data came from."""
    if root(origin).kind == "padding":
        return ("Mask the elements past the array's end before they reach a result (e.g. "
                "jnp.where(row < n, x, 0) with row from pl.program_id and "
                "lax.broadcasted_iota), or use a block shape that divides the array.")
    return ("Write it before it is read: e.g. zero an accumulator (or initialise a running "
            "max or sum) at the first step of the reduction axis, "
            "@pl.when(pl.program_id(k) == 0), and write every output block the grid visits.")


_OFF = " If the kernel means it, pass InterpretParams(uninitialized_reads='off')."


def report_use(ev: KernelContext, eqn: Equation, value: Tainted, what: str) -> UninitializedUseError:
    """The error for ``value`` deciding ``what`` at ``eqn``."""
    return UninitializedUseError(
        f"{core_name(ev.core)}: {what}{at_site(ev.site(eqn))} is decided by a value derived "
        f"from uninitialised memory: {describe_origin(value.origin)}. "
        f"{fix_hint(value.origin)}{_OFF}")


def read_origin(what: str, site: object, held: Any) -> UninitializedOrigin:
    """The origin of a read of uninitialised elements: ``what`` (operand and region)
    read at ``site``; ``held``: the buffer's own record of where its uninitialised data
    came from (a padding copy, a store of derived data), or None (never written)."""
    if held is None:
        return UninitializedOrigin(what, site)
    if held.kind == "padding":
        return UninitializedOrigin(what, site, "padding")
    return root(held)


def stored_origin(what: str, site: object, origin: UninitializedOrigin) -> UninitializedOrigin:
    """A buffer's record of a store of data derived from ``origin`` into ``what``."""
    return UninitializedOrigin(what, site, "stored", root(origin))


def first_tainted(ops: list[Value]) -> Tainted | None:
    """The first operand that carries a shadow, or None."""
    for x in ops:
        if x.__class__ is Tainted:
            return x  # type: ignore[no-any-return]
    return None


def shadow_of(x: Any) -> np.ndarray | None:
    """``x``'s shadow (None: a plain value)."""
    return x.shadow if x.__class__ is Tainted else None


def full_shadow(x: Any) -> np.ndarray:
    """The shadow of ``x`` at its value's shape (False: initialised)."""
    shape = np.shape(plain(x))
    s = shadow_of(x)
    if s is None:
        return np.zeros(shape, bool)
    return np.broadcast_to(s, shape)


def tainted(value: Any, shadow: Any, origin: UninitializedOrigin) -> Any:
    """``value`` with ``shadow`` (a plain value where nothing is shadowed)."""
    if shadow is None:
        return value
    shadow = np.asarray(shadow, dtype=bool)
    if not shadow.any():
        return value
    return Tainted(value, shadow, origin)


def view_shadow(acc: Any, missing: np.ndarray) -> np.ndarray:
    """The shadow of a read's value from the region's uninitialised elements
    (``missing``, of the region's shape) through the access's numpy ops; through a
    bitcast, all or nothing."""
    from palladium.interpret.eval.refs import Bitcast
    if not acc.post:
        return missing
    if any(isinstance(op, Bitcast) for op in acc.post):
        shape = np.shape(acc.apply(np.zeros(acc.region_shape, np.uint8)))
        return np.full(shape, bool(missing.any()))
    return np.asarray(acc.apply(missing), bool)


def region_shadow(acc: Any, shadow: Any, value_shape: tuple[int, ...]) -> np.ndarray:
    """The region-shaped shadow of a store's value (of the view's shape)."""
    from palladium.interpret.eval.refs import Bitcast
    if not acc.post:
        return np.broadcast_to(np.asarray(shadow, bool), acc.region_shape)
    if any(isinstance(op, Bitcast) for op in acc.post):
        return np.full(acc.region_shape, bool(np.any(shadow)))
    positions = acc.positions()
    full = np.zeros(math.prod(acc.region_shape), bool)
    full[positions.ravel()] = np.broadcast_to(np.asarray(shadow, bool), positions.shape).ravel()
    return full.reshape(acc.region_shape)
