"""The groups of primitives every evaluator, analysis and check names: the one home of
each (``tests/test_architecture`` keeps it so: no other module spells out a set of them).

- **Calls** (:data:`CALLS`): a body (:func:`call_body`, a ``ClosedJaxpr``) run on the
  call's operands one for one and answering its results. :data:`NESTED_CALLS` adds
  ``remat`` (``jax.checkpoint``), whose body is an open ``Jaxpr``, for the analyses
  that only walk bodies.
- **Ref accesses** (:data:`REF_ACCESSES`): the primitives that read or write a ref's
  contents, with what each does and the name jax's interpreter gives it in messages.
  :data:`INDEXED_ACCESSES` are the three whose ref is followed by an indexer tree (the
  ``tree`` parameter), with how many operands come before the tree.
- **DMAs** (:data:`DMA_PRIMITIVES`) and :data:`ACCESS_PRIMITIVES`, every primitive that
  goes through the access path (``access_path.py``): the ref accesses and the DMAs.

>>> from palladium.interpret import _jax_compat as jc
>>> INDEXED_ACCESSES[jc.swap_p], REF_ACCESSES[jc.addupdate_p].writes
(2, (False, True))
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.extend.core.primitives as jex_prims

from palladium.interpret import _jax_compat as jc

__all__ = ["ACCESS_PRIMITIVES", "CALLS", "DMA_PRIMITIVES", "INDEXED_ACCESSES",
           "NESTED_CALLS", "REF_ACCESSES", "RefAccess", "call_body", "jax_access_name"]

#: Calls whose body is a ``ClosedJaxpr`` run on the operands (:func:`call_body`).
CALLS: tuple[Any, ...] = (jc.jit_p, jc.custom_jvp_call_p, jc.custom_vjp_call_p,
                          jex_prims.closed_call_p)

#: Every call whose body takes the call's operands one for one (``remat``'s body is an
#: open ``Jaxpr``, its ``jaxpr`` parameter).
NESTED_CALLS: tuple[Any, ...] = (*CALLS, jex_prims.remat_p)


def call_body(eqn: Any) -> Any:
    """The ``ClosedJaxpr`` a call equation (one of :data:`CALLS`) runs."""
    return eqn.params["jaxpr"] if eqn.primitive is jc.jit_p else eqn.params["call_jaxpr"]


class RefAccess(NamedTuple):
    """What a ref access primitive does to its ref."""

    verb: str  #: "read", "write" or "accumulate into" (for messages)
    jax_name: str  #: the name jax's interpreter gives it in its messages
    writes: tuple[bool, ...]  #: the accesses it makes, in order: False a read, True a write


_READ, _WRITE, _ACCUMULATE = (False,), (True,), (False, True)

#: The primitives that read or write a ref's contents.
REF_ACCESSES: dict[Any, RefAccess] = {
    jc.get_p: RefAccess("read", "get_p", _READ),
    jc.swap_p: RefAccess("write", "swap_p", _WRITE),
    jc.addupdate_p: RefAccess("accumulate into", "addupdate_p", _ACCUMULATE),
    jc.load_p: RefAccess("read", "load_p", _READ),
    jc.masked_swap_p: RefAccess("write", "swap_p", _WRITE),
}

#: The ref accesses whose indexers are the ``tree`` parameter's leaves, after this many
#: operands (the ref, and for stores the value).
INDEXED_ACCESSES: dict[Any, int] = {jc.get_p: 1, jc.swap_p: 2, jc.addupdate_p: 2}

#: A DMA's start and its wait.
DMA_PRIMITIVES: tuple[Any, ...] = (jc.dma_start_p, jc.dma_wait_p)

#: The primitives that access a ref's contents through the access path
#: (``access_path.py``): each has one rule, a rule compiler, whose cache is a ``PlanCache``.
ACCESS_PRIMITIVES: tuple[Any, ...] = (*REF_ACCESSES, *DMA_PRIMITIVES)


def jax_access_name(primitive: Any) -> str:
    """The name jax's interpreter gives a ref access primitive in its messages."""
    access = REF_ACCESSES.get(primitive)
    return access.jax_name if access is not None else f"{primitive}_p"
