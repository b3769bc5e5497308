"""A compiled segment: the one traced evaluator (``traced_eval.py``) over a run of a
kernel body's equations, with no DMA table and no grid.

:func:`segment_function` turns a run of equations (pure array code, ``ref[...]`` loads
and stores, and loops, conditionals and calls made of the same) into a function of the
segment's input values and the contents of the refs it touches, returning the
segment's live results, the refs' new contents and one flag: no flag of the traced
state was raised (every ref access within its buffer, every ``while`` loop ended within
``WHILE_LIMIT`` iterations, no read of an element nothing initialised). ``jax.jit``
compiles it (``eval/segments.py``). A false flag means the results are not used: the
segment runs again equation by equation, and that path reports the out-of-bounds
access or runs the loop under the watchdog exactly as it always did.

Which equations may be in a segment is :func:`fusible`: one rule per kind of equation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.compiled.traced_eval import CALLS, run_equation
from palladium.interpret.compiled.traced_state import Handle, TracedState, TraceFacts
from palladium.interpret.eval.jaxprs import nested_jaxprs
from palladium.interpret.eval.primitive_groups import INDEXED_ACCESSES

__all__ = ["fusible", "is_ref", "segment_function"]

_ACCESS = INDEXED_ACCESSES  # (ref[...] reads and writes: eval/primitive_groups)


def is_ref(atom: Any) -> bool:
    return isinstance(getattr(atom, "aval", None), jc.AbstractRef)


def _plain_indexer(eqn: Any, n_lead: int) -> bool:
    """Whether an access's transforms are one ``NDIndexer`` of unit-stride slices of
    static size and scalar indices (what ``dynamic_slice`` expresses)."""
    transforms = eqn.params["tree"].unflatten(eqn.invars[n_lead:])
    if len(transforms) > 1 or any(not isinstance(t, jc.NDIndexer) for t in transforms):
        return False
    for t in transforms:
        for i in t.indices:
            if isinstance(i, jc.Slice):
                if i.stride != 1 or not isinstance(i.size, int | np.integer):
                    return False
            elif getattr(getattr(i, "aval", None), "shape", None) != () and not isinstance(
                    i, int | np.integer):
                return False
    return True


def fusible(eqn: Any, has_own_rule: Callable[[Any], bool]) -> bool:
    """Whether ``eqn`` can run inside a compiled segment. ``has_own_rule(primitive)``:
    the interpreter evaluates that primitive itself (DMAs, semaphores, program ids, ...),
    so it must stay outside."""
    prim = eqn.primitive
    if prim in _ACCESS:
        return (not is_ref(eqn.outvars[0]) and
                _plain_indexer(eqn, 1 if prim is jc.get_p else 2))
    if prim is jc.while_p and any(e.primitive in _ACCESS for e in eqn.params["cond_jaxpr"].jaxpr.eqns):
        return False  # a loop test that reads a ref: its bounds are checked one by one
    if prim in (jc.scan_p, jc.while_p, jc.cond_p, *CALLS):
        return all(fusible(e, has_own_rule) for j in nested_jaxprs(eqn) for e in j.eqns)
    if has_own_rule(prim) or eqn.effects:
        return False
    return not any(is_ref(a) for a in (*eqn.invars, *eqn.outvars))


def segment_function(eqns: Sequence[Any], inputs: Sequence[Any], refs: Sequence[Any],
                     outputs: Sequence[Any], written: Sequence[int],
                     log: bool = False, tracked: dict[int, str] | None = None,
                     used: set[Any] | None = None) -> Callable[..., Any]:
    """The segment as ``f(*input_values, *ref_contents) -> (outputs, new contents of the
    refs ``written`` (by position in ``refs``), ok)``; with ``log``, a fourth result: the
    start indices of every access, in the order of :func:`access_log_plan`. With
    ``tracked`` (ref position -> ``"read"``: the segment reads it, ``"written"``: it only
    writes it, ``"whole"``: it only writes all of it), the tracked refs' masks of
    initialised elements: ``f`` takes those of the refs it reads after the contents (the
    others start empty; a ref written whole has one flag for a mask) and returns, last,
    those of the tracked refs ``written`` (in that order); a read of an element no mask holds makes ``ok`` false
    (the segment runs equation by equation, where values carry shadows); ``used``: the
    variables something reads (a swap whose old value is not among them reads nothing)."""
    handles = [Handle(i) for i in range(len(refs))]
    order = sorted(tracked or {})
    old_read = None if used is None else set(used)

    def f(*args: Any) -> Any:
        values, contents = args[: len(inputs)], args[len(inputs): len(inputs) + len(refs)]
        given = iter(args[len(inputs) + len(refs):])
        masks = {i: next(given) if tracked[i] == "read" else jnp.bool_(False)
                 if tracked[i] == "whole" else jnp.zeros(contents[i].shape, bool)
                 for i in order} if tracked else None
        st = TracedState(list(contents), jnp.int32(0), TraceFacts(),
                         log=[] if log else None, masks=masks, old_read=old_read)
        env: dict[Any, Any] = dict(zip(inputs, values))
        env.update(zip(refs, handles))
        for eqn in eqns:
            env.update(zip(eqn.outvars, run_equation(eqn, [_read(env, a) for a in eqn.invars], st)))
        result: tuple[Any, ...] = (
            [_read(env, a) for a in outputs], [st.bufs[i] for i in written], st.flag == 0)
        if log:
            result = (*result, st.log)
        if tracked:
            assert st.masks is not None
            result = (*result, [st.masks[i] for i in written if i in st.masks])
        return result

    return f


def _read(env: dict[Any, Any], atom: Any) -> Any:
    return atom.val if isinstance(atom, jc.Literal) else env[atom]
