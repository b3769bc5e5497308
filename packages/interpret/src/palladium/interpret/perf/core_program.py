"""A core's recorded events as the program the replay runs (``replay.Replay``): the
grid's block copies scheduled as the TPU pipeline issues them (the replay's module
docstring says how), each grid step with its overhead, a kernel's own DMAs, signals,
waits and barriers in the core's order."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from palladium.interpret.eval.context import CoreId
from palladium.interpret.perf.dma_runs import member, route
from palladium.interpret.perf.model import ChipModel

__all__ = ["core_program"]

Action = tuple[Any, ...]


def core_program(core: CoreId, events: list[tuple[Any, ...]], chip: ChipModel,
                 step_overhead: float) -> Iterator[Action]:
    """The core's program: its events, with the grid's block copies scheduled as the
    TPU pipeline issues them; each grid step costs the core ``step_overhead``."""
    pre: list[tuple[Any, ...]] = []
    steps: list[dict[str, Any]] = []
    for ev in events:
        kind = ev[0]
        if kind == "step":
            steps.append({"point": ev[2], "in": [], "body": [], "out": [], "done": False})
        elif not steps:
            pre.append(ev)
        elif kind == "in":
            steps[-1]["in"].append(ev)
        elif kind == "body_end":
            steps[-1]["done"] = True
        else:  # after the body: output copies and whatever follows, in order
            steps[-1]["out" if steps[-1]["done"] else "body"].append(ev)
    # per buffer (by id, held): its label; per kind of DMA: its signals and args (member)
    labels: dict[Any, tuple[Any, ...]] = {}
    # A pipeline whose blocks move (copied at more than one step) pays a fixed part at
    # its ends, before its first block copy is issued and after its last is waited for:
    # round 22's copies over 2 to 16 steps take 0.3 us more than the model without it,
    # kernels of one step or of blocks copied once do not (vpu/*, grid/revisit/*)
    moving = (any(st["in"] for st in steps[1:])
              or any(ev[0] == "out" for st in steps[:-1] for ev in st["out"]))
    if moving:
        yield ("overhead", chip.launch_overhead_s, "prologue")
    for ev in pre:
        if (action := _action(ev, labels)) is not None:
            yield action
    if not steps:
        return
    dev = core[0]
    seq = iter(range(1 << 62))

    # (one action, shared: a block copy's issue on the core, before its DMA)
    issue = (("overhead", chip.block_copy_issue_s, "block copy issue",)
             if chip.block_copy_issue_s else None)

    def copy(ev: tuple[Any, ...], key: Any) -> Action:
        """The DMA of the block copy ``ev`` that signals ``key``."""
        _, step, nbytes, _n, name, local, strided = ev
        # (an operand XLA placed in VMEM: its blocks are copied VMEM -> VMEM)
        where = "VMEM" if local else "HBM"
        src, dst = (where, name) if ev[0] == "in" else (name, where)
        return ("dma", -1 - next(seq), f"copy {name} block (step {step})",
                ("local" if local else "hbm", dev), nbytes, [(key, nbytes)],
                {"bytes": nbytes, "src": src, "dst": dst},
                "block local" if local else
                ("block strided " if strided else "block ") + ("in" if ev[0] == "in" else "out"))

    issue_at: dict[int, list[tuple[Any, ...]]] = defaultdict(list)  # -1: prologue
    for t, st in enumerate(steps):
        for ev in st["in"]:
            n = ev[3]
            issue_at[t if n == 1 else max(t - (n - 1), -1) if t else -1].append(ev)
    for ev in issue_at.pop(-1, []):
        if issue:
            yield issue
        yield copy(ev, ("pipe", core, "in", ev[1]))
    out_waits: dict[int, list[tuple[Any, int]]] = defaultdict(list)
    last = len(steps) - 1
    for s, st in enumerate(steps):
        point = str(st["point"])
        yield ("begin", f"step {s} {point}", {"grid_point": point})
        yield ("overhead", step_overhead, "step overhead")
        # (with n buffers the next inputs are fetched before this step's are waited for:
        # their buffer held step s - 1's, done; one buffer: this step's own, then waited)
        for ev in issue_at.get(s, ()):
            if issue:
                yield issue
            yield copy(ev, ("pipe", core, "in", ev[1] if ev[3] != 1 else s))
        if st["in"]:
            total = sum(ev[2] for ev in st["in"])
            yield ("wait", ("pipe", core, "in", s), total, "input blocks", "hbm")
        for ev in st["body"]:  # (``_action``'s compute, inline: the common case)
            if ev[0] == "c":
                if ev[1]:
                    yield ("compute", ev[1], "compute")
            elif (action := _action(ev, labels)) is not None:
                yield action
        for ev in st["out"]:
            if ev[0] == "out":
                key = ("pipe", core, "out", s, ev[4])
                if issue:
                    yield issue
                yield copy(ev, key)
                out_waits[min(s + ev[3] - 1, last + 1)].append((key, ev[2]))
            elif (action := _action(ev, labels)) is not None:
                yield action
        for key, nbytes in out_waits.pop(s, []):
            yield ("wait", key, nbytes, "output block write-back", "hbm")
        yield ("end",)
    for key, nbytes in out_waits.pop(last + 1, []):
        yield ("wait", key, nbytes, "output block write-back", "hbm")
    if moving:
        yield ("overhead", chip.launch_overhead_s, "epilogue")


def _action(ev: tuple[Any, ...], labels: dict[Any, tuple[Any, ...]]) -> Action | None:
    """The recorded event ``ev`` as the replay's action (None: nothing to do)."""
    kind = ev[0]
    if kind == "c":
        return ("compute", ev[1], "compute") if ev[1] else None
    if kind == "dma":
        d = ev[1]
        direction, res = route(d)
        dma_id, name, signals, args = member(d, labels)
        return ("dma", dma_id, name, res, d.nbytes, signals, args, direction)
    if kind == "dmas":  # a run (``dma_runs``): one resource, size and direction
        direction, res = route(ev[1][0])
        return ("dmas", [member(x, labels) for x in ev[1]], res, ev[1][0].nbytes, direction)
    if kind == "sig":
        return ("signal", ev[1], ev[2])
    if kind == "wait":
        return ("wait", ev[1], ev[2], ev[3], "dma" if ev[4] else "sem")
    if kind == "bar":
        return ("barrier",)
    if kind == "mem":
        return ("mem", ev[1])
    return None
