"""What the multi-device benchmarks share: one measurement in a subprocess with N+1 host
devices and a timeout, the collectives of ``examples/collectives.py`` (and jax's shipped
all-gather) as a called function with its input and numpy reference, and a result cell.

jax is imported only inside the functions a worker process calls.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "examples")


def in_subprocess(script: str, args: list[str], n: int, timeout: float) -> dict | None:
    """``python script *args`` with ``n + 1`` host devices (jax's interpreter hangs when a
    mesh uses every host device): the JSON of its last stdout line; None on timeout,
    ``{"error": its last stderr line}`` when it failed."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n + 1}"
    cmd = [sys.executable, os.path.abspath(script), *args]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:120]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def collective(name: str, n: int, interpret: Any, force: Any = None) -> tuple[Callable, Any, Any]:
    """The collective ``name`` over a mesh of ``n`` devices run with ``interpret``:
    (its jitted call, its sharded input, the numpy result it must give). ``jax_all_gather``
    is jax's shipped all-gather (a bidirectional ring reusing one receive semaphore per
    direction), run under ``force(interpret)`` (a ``force_tpu_interpret_mode``)."""
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    import collectives

    mesh = collectives.mesh(n)
    # jax's shipped all-gather takes the same input as ours.
    x = collectives.sharded(
        collectives.inputs("all_gather" if name == "jax_all_gather" else name, n), mesh)
    expected = np.asarray(x) if name == "jax_all_gather" else collectives.reference(name, x, n)
    if name == "jax_all_gather":
        from jax.experimental.pallas.ops.tpu import all_gather as shipped

        def f(x):
            with force(interpret):
                return shipped.all_gather(x, mesh=mesh, axis_name="x")
        return f, x, expected
    fn = functools.partial(collectives.COLLECTIVES[name], n=n, interpret=interpret)
    return (jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                  check_vma=False)), x, expected)


def cell(r: dict | None, key: str, timeout: float) -> str:
    """A measurement's ``key`` seconds as a table cell (timeouts, errors, wrong results)."""
    if r is None:
        return f"> {timeout:g} s (timeout)"
    if "error" in r:
        return f"error: {r['error']}"
    flag = "" if r["correct"] else " (WRONG)"
    return f"{r[key] * 1e3:.1f} ms{flag}"
