"""The access path: each ref access of a kernel body resolved once, and kept.

A kernel reads, writes and copies its refs at the same few places on every grid step.
Whatever a rule derives from an access's operands -- the indexer tree unflattened, the
access resolved (region and post ops), the simulator's plan of the region (which holds
the race detector's view of it), a DMA's view, its semaphores' positions, its byte count
-- depends on the operands only through their *structure*: each memory ref's buffer shape
and dtype and whether it is SMEM (never tile-padded) or host memory, each semaphore
array's shape, and the integer value of every index operand (``operand_key``). This
module owns that key, the one bounded cache every access kind uses (``PlanCache``) and
what is kept per key: a ``ResolvedAccess`` for loads and stores, a ``DmaPlan`` for a DMA
start and a ``DmaWaitPlan`` for a wait. The rules (``rules_memory``, ``rules_dma``) look
up and run, one code path per primitive: an operand the key cannot describe (an
array-valued index: a gather; a ref with transforms a plugin's evaluation passes to a DMA
or a masked load) has no key, and its access resolves to a plan made for that one call
(``PlanCache.get(None, ...)``: built, not kept), which the rule runs as any other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable
from itertools import chain, islice
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np

from palladium.interpret.eval.refs import Access, MemRef, RefView, SemaphoreRef
from palladium.shared_memory import AccessPlan

__all__ = ["LIMIT", "DmaPlan", "DmaWaitPlan", "PlanCache",
           "ResolvedAccess", "base_refs", "operand_key"]

#: Entries a cache keeps before it starts again (a kernel whose indices take more values
#: than this, e.g. a DMA per page of a large page table, re-resolves; nothing is wrong).
LIMIT = 4096

T = TypeVar("T")
_NDARRAY = np.ndarray


class PlanCache(Generic[T]):
    """A bounded ``key -> plan`` map: ``get(key, build, *args)`` builds a plan once per
    key, as ``build(*args)`` (the arguments passed, not a closure made on every hit:
    ``get`` runs on every access). The key None (``operand_key`` of operands it cannot
    describe) is the uncached case: the plan is built for this access and not kept."""

    __slots__ = ("entries", "limit")

    def __init__(self, limit: int = LIMIT) -> None:
        self.entries: dict[Hashable, T] = {}
        self.limit = limit

    def get(self, key: Hashable | None, build: Callable[..., T], *args: Any) -> T:
        if key is None:
            return build(*args)
        hit = self.entries.get(key)
        if hit is None:
            hit = build(*args)
            if len(self.entries) >= self.limit:
                self.entries.clear()
            self.entries[key] = hit
        return hit

    def __len__(self) -> int:
        return len(self.entries)


class ResolvedAccess(NamedTuple):
    """A load's or store's access and the simulator's plan of its region."""

    access: Access
    plan: AccessPlan


@dataclasses.dataclass(frozen=True, slots=True)
class DmaPlan:
    """A DMA start, resolved: where its refs and semaphores are among the operands, the
    plans of both regions, the view it moves (None: the regions' elements as they are).
    ``operands``: None for a plan a cache keeps (its positions are among each call's
    operands); else the one call's operands as base refs (``base_refs``), which the
    positions index."""

    src_at: int
    src_plan: AccessPlan
    dst_at: int
    dst_plan: AccessPlan
    view: Any
    dst_sem: tuple[int, int]  # (operand position of the array, flat position in it)
    src_sem: tuple[int, int] | None
    device_id: Any
    operands: list[Any] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DmaWaitPlan:
    """A DMA wait, resolved: the bytes it waits for and its semaphore's position
    (``operands`` as in ``DmaPlan``)."""

    nbytes: int
    sem: tuple[int, int]
    operands: list[Any] | None = None


def operand_key(invals: list[Any], skip: int = -1, stop: int = -1) -> tuple[Hashable, ...] | None:
    """The structure of an access's operands (see the module docstring; a ref's is kept
    on the ref), or None when one of them has none (an array-valued index, a foreign
    operand: the access is resolved for its call alone). ``skip``: the position of an
    operand that is no part of the access (a store's value); ``stop``: the operands from
    there on are not either (a masked access's value, mask and fill). Runs on every
    access: a loop of type tests over ``invals`` itself, or over slices of it (iterators,
    no list made) when some operands are not part of the access."""
    items: Iterable[Any] = invals
    if skip >= 0 or stop >= 0:
        end = len(invals) if stop < 0 else stop
        items = (chain(islice(invals, skip), islice(invals, skip + 1, end)) if 0 <= skip < end
                 else islice(invals, end))
    key: list[Hashable] = []
    append = key.append
    for x in items:
        t = type(x)
        if t is _NDARRAY:  # (first: most operands are an index, a 0-d array)
            if x.ndim:
                return None
            append(int(x))
        elif t is MemRef or t is SemaphoreRef:
            append(x.structure)
        elif t is int or isinstance(x, np.integer):
            append(int(x))
        else:
            return None
    return tuple(key)


def base_refs(invals: list[Any]) -> list[Any]:
    """``invals`` with each ref with transforms (a plugin's ``RefView``) as its base ref:
    where an uncached plan finds the refs it names by position."""
    return [x.ref if type(x) is RefView else x for x in invals]


def semaphore_at(invals: list[Any], where: tuple[int, int]) -> int:
    """The simulator id of the semaphore at ``where`` (a ``DmaPlan``'s position)."""
    return invals[where[0]].id_at(where[1])  # type: ignore[no-any-return]
