"""``pl.CostEstimate`` from recorded launches: what XLA needs to schedule around a kernel.

``flops``: the MXU's (2 x M x N x K per ``dot_general``, from the shapes the kernel body
multiplies, every grid step) plus one per element of floating-point vector arithmetic
(adds, multiplies, divides, max/min, reductions: XLA's cost analysis counts these too);
``transcendentals``: elements of exp, log, tanh, logistic, rsqrt, sin, ... (``div`` is
a flop, as XLA counts it); ``bytes_accessed``: with ``"traffic"`` (the default) the bytes
the launch really moved to and from HBM (block copies, re-fetches included, and its own
DMAs), with ``"operands"`` the bytes of the ``pallas_call``'s operands and results once
each (what XLA's cost analysis charges any custom call); ``remote_bytes_transferred``:
bytes of remote (ICI) DMAs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from jax.experimental import pallas as pl

from palladium.interpret.errors import ConfigError
from palladium.interpret.perf import LaunchRecord

__all__ = ["cost_estimate"]

_BYTES = ("traffic", "operands")


def _operand_bytes(record: LaunchRecord) -> int:
    """The blocked inputs' and outputs' arrays, once each (scalar prefetch left out: a
    few SMEM words), on every device."""
    kernel = record.info.kernel
    total = sum(
        math.prod(info.array_shape) * np.dtype(info.dtype).itemsize
        for info in (*kernel.inputs, *kernel.outputs)
    )
    return total * record.num_devices


def cost_estimate(
    records: LaunchRecord | Sequence[LaunchRecord], *, bytes_accessed: str = "traffic"
) -> pl.CostEstimate:
    """The ``pl.CostEstimate`` (jax's own type) of one recorded launch, or the sum of
    several (every device of each launch counted): pass it to
    ``pl.pallas_call(..., cost_estimate=...)``. See the module docstring for what each
    field counts; ``bytes_accessed`` is ``"traffic"`` or ``"operands"``.

    Record the launch with :func:`palladium.interpret.timeline` (any
    ``InterpretParams``: ``skip_floating_point_ops=True`` gives the same counts) or take
    it from :func:`palladium.interpret.predict` (``Prediction.cost_estimate()``).
    """
    if bytes_accessed not in _BYTES:
        raise ConfigError(
            f"cost_estimate(bytes_accessed={bytes_accessed!r}): pass one of {_BYTES}."
        )
    if isinstance(records, LaunchRecord):
        records = [records]
    if not records:
        raise ConfigError(
            "cost_estimate: no launch record given; record one with palladium.interpret.timeline()."
        )
    flops = transcendentals = moved = remote = 0.0
    for r in records:
        if r.failed:
            raise ConfigError(
                f"cost_estimate: launch #{r.index} of kernel "
                f"'{r.kernel_name}' failed ({r.error}); nothing to count."
            )
        flops += r.flops + r.vector_flops
        transcendentals += r.transcendentals
        hbm = sum(n for (kind, _), n in r.resource_bytes.items() if kind == "hbm")
        remote += sum(n for (kind, _), n in r.resource_bytes.items() if kind == "ici")
        moved += hbm if bytes_accessed == "traffic" else _operand_bytes(r)
    return pl.CostEstimate(
        flops=int(round(flops)),
        transcendentals=int(round(transcendentals)),
        bytes_accessed=int(round(moved)),
        remote_bytes_transferred=int(round(remote)),
    )
