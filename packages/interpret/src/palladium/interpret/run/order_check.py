"""Catch kernels whose result silently depends on the order DMAs complete in.

A DMA started and not yet waited for may complete at any time on a TPU. In "on_wait"
mode palladium completes pending DMAs in issue order by default; with
``InterpretParams(dma_order="random", dma_order_trials=k)`` it runs the launch ``k``
more times with other seeds (each a different legal completion order and core
interleaving) and compares every output bit for bit. When two runs disagree it reruns
the disagreeing seed with the race detector and raises ``DmaOrderDependenceError``
naming the outputs and devices that differ and the unordered accesses (the DMAs by
``src->dst`` name, the cores, the source lines) that make them differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from palladium.interpret.errors import DmaOrderDependenceError, SimulationError
from palladium.interpret.params import InterpretParams

Results = list[list[np.ndarray]]

_MAX_REPORTS = 4


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def differences(first: Results, second: Results, names: Sequence[str]) -> list[str]:
    """``"output 'o' on device d: n of m elements differ (first at index i: x vs y)"``."""
    out = []
    for device, (outs_a, outs_b) in enumerate(zip(first, second)):
        for name, a, b in zip(names, outs_a, outs_b):
            if _same(a, b):
                continue
            differ = ~((a == b) | ((a != a) & (b != b)))
            where = np.argwhere(differ)
            first_at = tuple(int(i) for i in where[0]) if len(where) else ()
            out.append(
                f"output '{name}' on device {device}: {len(where)} of {a.size} elements differ "
                f"(first at index {first_at}: {a[first_at]!r} vs {b[first_at]!r})"
            )
    return out


def check_dma_order(
    run: Callable[[InterpretParams], Results],
    races: Callable[[InterpretParams], list[Any]],
    params: InterpretParams,
    results: Results,
    kernel_name: str,
    output_names: Sequence[str],
    agree: Callable[[bool], bool] = bool,
) -> None:
    """Rerun with ``params.dma_order_trials`` other seeds; raise on the first difference.

    ``run(params)`` executes the launch and returns its outputs; ``races(params)``
    executes it with race detection collecting and returns the race reports. A launch
    split over processes compares each process's devices there: ``agree(found)`` is
    whether any process found a difference (every process then takes the same steps).
    """
    base = params.seed
    for trial in range(1, params.dma_order_trials + 1):
        other_params = dataclasses.replace(params, random_seed=base + trial, dma_order_trials=0)
        other = run(other_params)
        diffs = differences(results, other, output_names)
        if not agree(bool(diffs)):
            continue
        reports: list[Any] = []
        for seed in (base + trial, base):
            try:
                reports = races(dataclasses.replace(other_params, random_seed=seed))
            except SimulationError:
                reports = []
            if agree(bool(reports)):
                break
        lines = [
            f"kernel '{kernel_name}': the result depends on the order in which DMAs complete "
            f"(random_seed {base} and {base + trial} pick different legal completion "
            f"orders and give different outputs):",
            *(f"  {d}" for d in diffs),
        ]
        if not diffs:
            lines.append("  (on devices that other processes simulate: see their error)")
        if reports:
            lines.append("conflicting accesses not ordered by any semaphore wait or barrier:")
            lines.extend(f"  {r}" for r in reports[:_MAX_REPORTS])
            if len(reports) > _MAX_REPORTS:
                lines.append(f"  ... and {len(reports) - _MAX_REPORTS} more")
        else:
            lines.append(
                "the race detector found no unordered access pair in these runs; rerun with "
                "detect_races=True and other seeds to find the DMAs involved"
            )
        lines.append(
            "Wait on each DMA's semaphore (or signal/wait a semaphore) before using its "
            "destination or reusing its source."
        )
        raise DmaOrderDependenceError("\n".join(lines))
