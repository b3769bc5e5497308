"""The pipeline primitives under palladium.interpret: first call and steady state per call.

Issue 22, item 4: palladium-pipeline's body primitive is evaluated by the interpreter's
own evaluator (a plugin rule of form "evaluate") instead of traced through the
pipeline's own jaxpr evaluator. Cases, each a 256x512x512 f32 matmul pipeline (grid
4x4x4 of 64x128 / 128x128 blocks, the kernel of ``parity_features.py``):

* ``palladium.pipeline.emit_pipeline(..., use_primitive=True)`` (the primitive path);
* jax's own ``emit_pipeline`` primitive (``jax_use_emit_pipeline_primitive``), which
  palladium-pipeline expands into its emitter and the same body primitive;
* the inlined ``palladium.pipeline.emit_pipeline`` (no primitive: unchanged, the control).

The first call (after ``jax.jit(...).lower().compile()``: the interpreter's own first
run, rules traced, programs compiled) needs a fresh process, so each measurement runs in
one; steady is the fastest of ``--calls`` later calls. Wall time and CPU time (of all the
process's threads: less disturbed by other processes on a shared machine) are reported. ``--compare DIR`` measures the palladium sources under ``DIR`` (``DIR/packages/*/src``,
e.g. ``git archive main packages | tar -x -C DIR``) against this checkout in the same
run, alternating which goes first; each cell is the minimum over ``--repeats`` processes.

Run: ``JAX_PLATFORMS=cpu python benchmarks/pipeline_primitive.py [--compare DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

M, K, N = 256, 512, 512
CASES = ("palladium primitive", "jax primitive", "palladium inlined")
ROOT = pathlib.Path(__file__).resolve().parent.parent


def _call(case: str):
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    import palladium.interpret as pi
    import palladium.pipeline as pp

    def kernel(x_hbm, y_hbm, o_hbm):
        def body(x, y, o):
            @pl.when(pl.program_id(2) == 0)
            def _():
                o[...] = jnp.zeros_like(o)

            o[...] += jnp.dot(x[...], y[...], preferred_element_type=jnp.float32)

        emit = pltpu.emit_pipeline if case == "jax primitive" else pp.emit_pipeline
        options = {"use_primitive": case == "palladium primitive"} if emit is not (
            pltpu.emit_pipeline) else {}
        emit(body, grid=(M // 64, N // 128, K // 128),
             in_specs=[pl.BlockSpec((64, 128), lambda i, j, k: (i, k)),
                       pl.BlockSpec((128, 128), lambda i, j, k: (k, j))],
             out_specs=[pl.BlockSpec((64, 128), lambda i, j, k: (i, j))],
             **options)(x_hbm, y_hbm, o_hbm)

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        interpret=pi.InterpretParams(detect_races=True, compile_check="off"))
    x = jax.random.normal(jax.random.key(0), (M, K), jnp.float32)
    y = jax.random.normal(jax.random.key(1), (K, N), jnp.float32)
    jax.config.update("jax_use_emit_pipeline_primitive", case == "jax primitive")
    try:
        compiled = jax.jit(call).trace(x, y).lower().compile()
    finally:
        jax.config.update("jax_use_emit_pipeline_primitive", False)
    expected = jnp.dot(x, y, precision="highest")
    return compiled, (x, y), expected


def _measure(case: str, calls: int) -> dict[str, float]:
    import jax
    import numpy as np

    call, args, expected = _call(case)
    t0, c0 = time.perf_counter(), time.process_time()
    out = jax.block_until_ready(call(*args))
    first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    times, cpu = [], []
    for _ in range(calls):
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(call(*args))
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"first": first, "steady": min(times), "first_cpu": first_cpu,
            "steady_cpu": min(cpu)}


def _child(case: str, calls: int) -> None:
    print(json.dumps(_measure(case, calls)))


def _run(case: str, calls: int, sources: pathlib.Path | None) -> dict[str, float]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if sources is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            str(sources / "packages" / p / "src")
            for p in ("interpret", "pipeline", "shared-memory", "race-detect"))
    out = subprocess.run([sys.executable, __file__, "--child", case, "--calls", str(calls)],
                         env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare", type=pathlib.Path, default=None)
    parser.add_argument("--child", default=None)
    a = parser.parse_args()
    if a.child is not None:
        _child(a.child, a.calls)
        return
    versions: dict[str, pathlib.Path | None] = {"this checkout": None}
    if a.compare is not None:
        versions = {"before": a.compare.resolve(), "after": None}
    best: dict[tuple[str, str], dict[str, float]] = {}
    for rep in range(a.repeats):
        order = list(versions) if rep % 2 == 0 else list(reversed(versions))
        for case in CASES:
            for name in order:
                got = _run(case, a.calls, versions[name])
                cell = best.setdefault((case, name), dict(got))
                for key, value in got.items():
                    cell[key] = min(cell[key], value)
    for what, first, steady in (("wall", "first", "steady"),
                                ("CPU (all threads)", "first_cpu", "steady_cpu")):
        print(f"\n{what} time, min over {a.repeats} processes (steady: min over {a.calls} "
              "calls)\n")
        print("| case | " + " | ".join(f"{v}: first call | {v}: steady" for v in versions)
              + (" | after/before (first, steady) |" if a.compare else " |"))
        print("|---" * (1 + 2 * len(versions) + (1 if a.compare else 0)) + "|")
        for case in CASES:
            cells = [best[(case, v)] for v in versions]
            row = " | ".join(f"{c[first]:.3f} s | {c[steady] * 1e3:.1f} ms" for c in cells)
            if a.compare:
                b, f = cells
                row += f" | {f[first] / b[first]:.2f}, {f[steady] / b[steady]:.2f}"
            print(f"| {case} | {row} |")


if __name__ == "__main__":
    main()
