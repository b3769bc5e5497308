"""A program as a launch that skips work runs it: the steps it never computes left out of
the loop (issue 40, item 4: the skip-float path should not walk what cannot change the
answer).

Under ``skip_floating_point_ops`` an equation with floating-point results is not
computed: its rule returns the same read-only results at every call
(``program._compute_rule``); under ``skip_unused_integer_ops`` so does an integer array
equation whose results steer nothing (``steering_values.py``). Which steps those are is
known before the program runs (their rules and the launch's ``unused_values``), so a
launch runs the program's :class:`Skipping` variant: the skipped steps' results are in
its template, its loops leave them out, and an observer of every equation is still told
each of them in its place (the timeline costs them). The results, the equations told and
their order are the plain program's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Skipping", "skipping"]


@dataclasses.dataclass(frozen=True, slots=True)
class Skipping:
    """A program's steps as a launch that skips them runs them: ``template`` with the
    skipped steps' results, ``fast`` and ``observed`` as the program's (``Program``)
    without the skipped steps' runs (in ``observed`` a skipped step's rule is None: the
    observer is told of it, nothing runs), and per step of ``fast`` its equation's
    position in the program's ``eqns`` (what a failure tells)."""

    template: tuple[Any, ...]
    fast: tuple[Any, ...]
    observed: tuple[Any, ...]
    positions: tuple[int, ...]


def _skipped(rule: Any, eqn: Any, skip_float: bool, unused: Any) -> bool:
    """Whether ``rule`` (a step's) returns its skipped results at every call of a launch
    with these settings: ``program._skipped``, decided once."""
    float_outs = getattr(rule, "float_outs", None)
    if float_outs is None:  # not a compute rule that skips (a scalar's, a ref's, ...)
        return False
    if float_outs:
        return skip_float
    return unused is not None and bool(eqn.outvars) and all(v in unused for v in eqn.outvars)


def skipping(prog: Any, skip_float: bool, unused: Any) -> Skipping | None:
    """``prog``'s variant for a launch with these settings (made once per program and
    settings, kept in ``prog.variants``), or None when it skips no step."""
    key = (skip_float, unused)
    known = prog.variants.get(key, prog)
    if known is not prog:
        return known  # type: ignore[no-any-return]
    template = list(prog.template)
    fast: list[Any] = []
    observed: list[Any] = []
    positions: list[int] = []
    i = 0
    skipped = 0
    for step, entry in zip(prog.steps, prog.observed):
        rule, eqn, _operands, _one, _out, outs, told = entry
        if step.observe_only or not told or not _skipped(rule, eqn, skip_float, unused):
            observed.append(entry)
            if not step.observe_only:  # (a call inlined: not in ``fast``)
                fast.append(prog.fast[i])
                positions.append(i)
                i += 1
            continue
        for slot, value in zip(outs, rule.skipped_results()):
            template[slot] = value
        observed.append((None, *entry[1:]))
        i += 1
        skipped += 1
    variant = Skipping(tuple(template), tuple(fast), tuple(observed),
                       tuple(positions)) if skipped else None
    prog.variants[key] = variant
    return variant
