"""A core's compute chunk as the recorder costs it: the dataflow chain of its equations
(``Chunk``) and a memoised run of equations that started one (``Run``); see
``recorder.TimelineRecorder._on_chain``."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Chunk", "Run"]


@dataclasses.dataclass
class Chunk:
    """The dataflow chain of one core's current compute chunk (``_on_chain``)."""

    #: when each value (by variable; a ref's last store by ("ref", var)) is ready:
    #: its first vreg and all of it
    ready: dict[Any, tuple[float, float]] = dataclasses.field(default_factory=dict)
    end: float = 0.0  # the chain's end
    #: the equations seen (a repeat starts a loop's next iteration) and the first
    #: repeated one
    seen: set[int] = dataclasses.field(default_factory=set)
    anchor: int | None = None
    #: when the current loop iteration began (a loop body is one basic block on the
    #: chip: an iteration's loads cannot start before the last one's last op issued),
    #: and when the chunk's last op issued
    start: float = 0.0
    issued: float = 0.0
    mxu_free: float = 0.0  # when the MXU takes its next dot
    #: when the current basic block began (the last conditional's end) and each unit's
    #: busy time since then: a conditional waits for both its block's chain and its
    #: busiest unit
    base: float = 0.0
    busy: dict[str, float] = dataclasses.field(default_factory=dict)
    #: the values holding a lane reduction's result in every lane (spreading them over
    #: the lanes is free)
    replicated: set[Any] = dataclasses.field(default_factory=set)

    def copy(self) -> Chunk:
        return dataclasses.replace(self, ready=dict(self.ready), seen=set(self.seen),
                                   replicated=set(self.replicated), busy=dict(self.busy))


@dataclasses.dataclass(slots=True)
class Run:
    """A run of equations that started a chunk, costed once (``_costed``): the equations
    (held: the memo is keyed by their ids), the counts and chain it left, the chunk's
    seconds (None until pushed) and how often it was pushed again since its counts were
    last added (``_count_repeats``)."""

    ops: tuple[Any, ...]
    counts: Any
    chain: Chunk | None
    seconds: float | None = None
    repeats: int = 0
