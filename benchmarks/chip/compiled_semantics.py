"""What the chip computes, against palladium's calls 1-4 (issue 42, items 2 and 3).

Runs each kernel compiled on the TPU (a plain ``pallas_call``, no interpret mode) and
under palladium on the CPU (calls 1..4 of one jitted function: calls 1-2 simulated,
3-4 the whole-launch executable, which this script makes compile whatever the kernel's
size), and writes ``compiled_semantics.json`` to the directory in ``$OUT``:

- ``nan_minmax``: ``jnp.max``/``jnp.min`` over the rows/columns of (64, 128) f32 blocks
  and over a whole block, two NaNs in the input: NaN outputs per call;
- ``axpy``: f32 ``a * x + y`` on (1024, 128): elements equal to separate rounding
  (numpy) and to one rounding (an FMA);
- ``inplace_ahead``: ``input_output_aliases={0: 0}`` with input block i and output
  block i + 1 (16 blocks of 128 rows, 15 grid steps): per run, the rows of the output
  whose step read the old input block, the block the step before wrote (new), or
  neither; 5 runs on the chip; under palladium, the same counts, and whether
  ``detect_races=True`` raises ``DataRaceError``;
- ``scalar_steered``: a kernel whose step g writes the scalar operand step g + 1's index
  map reads (``sel[g + 1] = (sel[g] + 1) % 4``, ``sel = [3, 0, 0, 0, 0]``): the input
  block each step read (the pipeline computes step g + 1's block at step g's start,
  before the body writes: 3, 0, 0, 0);
- ``elementwise``: the remaining differences (``exp``, ``tanh``, ``log``, division,
  ``rsqrt``, a row sum) between the chip and palladium's calls 1 and 4, in ulp.

Run on a TPU machine from the repository root:
``OUT=/tmp/out python benchmarks/chip/compiled_semantics.py`` (``--chip-only``: only
save the chip's outputs to ``$OUT/chip.npz``; ``--chip-npz PATH``: take them from
there instead of running on a TPU). The palladium half runs
in a subprocess on the CPU (``JAX_PLATFORMS=cpu``) with ``packages/*/src`` on
``PYTHONPATH``; on a machine without a TPU the chip half is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

R, C, G = 64, 128, 4          # NaN kernel: 4 blocks of (64, 128)
AR = 1024                     # axpy rows
NB, BR = 16, 128              # in-place kernel: blocks, rows per block
MARK = 1000.0                 # what a step adds to the rows it reads
RUNS = 5


# --- the kernels: each returns ``f(interpret) -> jitted function`` -------------------------
def nan_kernel(interpret):
    def kernel(x_ref, rows_ref, cols_ref, all_ref):
        x = x_ref[...]
        rows_ref[...] = jnp.broadcast_to(jnp.max(x, axis=0, keepdims=True), (8, C))
        cols_ref[...] = jnp.broadcast_to(jnp.min(x, axis=1, keepdims=True), (R, C))
        all_ref[...] = x * 0.0 + jnp.max(x)

    return jax.jit(lambda x: pl.pallas_call(
        kernel, grid=(G,), in_specs=[pl.BlockSpec((R, C), lambda i: (i, 0))],
        out_specs=[pl.BlockSpec((8, C), lambda i: (i, 0)), pl.BlockSpec((R, C), lambda i: (i, 0)),
                   pl.BlockSpec((R, C), lambda i: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((G * 8, C), jnp.float32),
                   jax.ShapeDtypeStruct((G * R, C), jnp.float32),
                   jax.ShapeDtypeStruct((G * R, C), jnp.float32)],
        interpret=interpret)(x))


def axpy_kernel(interpret):
    def kernel(a_ref, x_ref, y_ref, o_ref):
        o_ref[...] = a_ref[...] * x_ref[...] + y_ref[...]

    spec = pl.BlockSpec((256, C), lambda i: (i, 0))
    return jax.jit(lambda a, x, y: pl.pallas_call(
        kernel, grid=(AR // 256,), in_specs=[spec] * 3, out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((AR, C), jnp.float32), interpret=interpret)(a, x, y))


def inplace_kernel(interpret):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + MARK

    return jax.jit(lambda x: pl.pallas_call(
        kernel, grid=(NB - 1,), in_specs=[pl.BlockSpec((BR, C), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BR, C), lambda i: (i + 1, 0)), input_output_aliases={0: 0},
        out_shape=jax.ShapeDtypeStruct((NB * BR, C), jnp.float32), interpret=interpret)(x))


def elementwise_kernel(interpret):
    def kernel(x_ref, y_ref, exp_ref, tanh_ref, log_ref, div_ref, rsqrt_ref, sum_ref):
        x, y = x_ref[...], y_ref[...]
        exp_ref[...] = jnp.exp(x)
        tanh_ref[...] = jnp.tanh(x)
        log_ref[...] = jnp.log(jnp.abs(x) + 0.5)
        div_ref[...] = x / (jnp.abs(y) + 0.25)
        rsqrt_ref[...] = jax.lax.rsqrt(jnp.abs(y) + 0.25)
        sum_ref[...] = jnp.broadcast_to(jnp.sum(x, axis=1, keepdims=True), (256, C))

    spec = pl.BlockSpec((256, C), lambda i: (i, 0))
    return jax.jit(lambda x, y: pl.pallas_call(
        kernel, grid=(2,), in_specs=[spec, spec], out_specs=[spec] * 6,
        out_shape=[jax.ShapeDtypeStruct((512, C), jnp.float32)] * 6, interpret=interpret)(x, y))


def scalar_kernel(interpret):
    from jax.experimental.pallas import tpu as pltpu  # noqa: PLC0415

    def kernel(sel_ref, x_ref, o_ref):
        g = pl.program_id(0)
        o_ref[...] = x_ref[...] + 1.0
        sel_ref[g + 1] = (sel_ref[g] + 1) % 4

    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(4,),
        in_specs=[pl.BlockSpec((8, C), lambda g, sel: (sel[g], 0))],
        out_specs=pl.BlockSpec((8, C), lambda g, sel: (g, 0)))
    return jax.jit(lambda sel, x: pl.pallas_call(
        kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((32, C), jnp.float32),
        interpret=interpret)(sel, x))


SCALAR_ARGS = (np.array([3, 0, 0, 0, 0], np.int32), np.arange(32 * C, dtype=np.float32).reshape(32, C))


def blocks_read(out):
    return [int((np.asarray(out)[g * 8, 0] - 1) // (8 * C)) for g in range(4)]


ELEMENTWISE = ("exp", "tanh", "log", "div", "rsqrt", "row_sum")


def inputs():
    rng = np.random.default_rng(42)
    x = rng.standard_normal((G * R, C)).astype(np.float32)
    x[3, 5] = np.nan
    x[R + 10, 7] = np.nan
    a, ax, ay = (rng.standard_normal((AR, C)).astype(np.float32) for _ in range(3))
    rows = np.arange(NB * BR, dtype=np.float32)[:, None]
    inplace = np.broadcast_to(rows, (NB * BR, C)).copy()
    ex, ey = (rng.standard_normal((512, C)).astype(np.float32) for _ in range(2))
    return {"nan": (x,), "axpy": (a, ax, ay), "inplace": (inplace,), "elementwise": (ex, ey)}


# --- what the outputs say ---------------------------------------------------------------------
def nan_counts(outs):
    return {name: int(np.isnan(np.asarray(o)).sum()) for name, o in zip(("rows", "cols", "all"), outs)}


def axpy_counts(out, a, x, y):
    out = np.asarray(out)
    separate = a * x + y
    fused = (np.float64(a) * np.float64(x) + np.float64(y)).astype(np.float32)
    return {"elements": int(out.size), "equal_separate_rounding": int((out == separate).sum()),
            "equal_fma": int((out == fused).sum()),
            "separate_differs_from_fma": int((separate != fused).sum())}


def inplace_counts(out, x):
    """Rows of output blocks 1.. whose step read the old input block (x + MARK), the new
    one (what the step before wrote: x of the block before + 2 MARK), or neither."""
    out = np.asarray(out)[BR:, 0]
    old = x[:-BR, 0] + MARK
    new = x[:-2 * BR, 0] + 2 * MARK  # (or more steps back: see ``deeper``)
    is_old = out == old
    is_new = np.zeros_like(is_old)
    is_new[BR:] = out[BR:] == new
    deeper = out > old + MARK / 2  # (a cascade over more than one step)
    is_new |= deeper
    blocks_new = sorted({int(i // BR) + 1 for i in np.flatnonzero(is_new)})
    return {"rows": int(out.size), "old": int(is_old.sum()), "new": int(is_new.sum()),
            "neither": int((~is_old & ~is_new).sum()), "blocks_with_new_rows": blocks_new}


def ulps(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    ia = a.view(np.int32).astype(np.int64)
    ib = b.view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(2**31) - ia, ia)
    ib = np.where(ib < 0, -(2**31) - ib, ib)
    return np.abs(ia - ib)


def differences(chip, ours):
    """Elements that differ, the largest difference in ulp, absolute, and relative where
    the chip's value is at least 1e-3 (near 0 an ulp is tiny)."""
    a, b = np.float64(chip), np.float64(ours)
    big = np.abs(a) >= 1e-3
    rel = np.abs(a - b)[big] / np.abs(a[big])
    return {"differ": int((ulps(chip, ours) > 0).sum()), "max_ulp": int(ulps(chip, ours).max()),
            "max_abs": float(np.abs(a - b).max()), "max_rel": float(rel.max()) if rel.size else 0.0}


# --- the two halves ---------------------------------------------------------------------------
def chip_outputs(path):
    """Run the kernels on the TPU and save their outputs to ``path`` (an ``.npz``); False
    without a TPU."""
    if not any(d.platform == "tpu" for d in jax.devices()):
        return False
    ins = inputs()
    out = {}
    for name, o in zip(("rows", "cols", "all"), nan_kernel(False)(*ins["nan"])):
        out[f"nan_{name}"] = np.asarray(o)
    out["axpy"] = np.asarray(axpy_kernel(False)(*ins["axpy"]))
    fn = inplace_kernel(False)
    out["inplace"] = np.stack([np.asarray(fn(jnp.asarray(ins["inplace"][0])))
                               for _ in range(RUNS)])
    out["ew"] = np.stack([np.asarray(o) for o in elementwise_kernel(False)(*ins["elementwise"])])
    out["scalar"] = np.stack([np.asarray(scalar_kernel(False)(*SCALAR_ARGS)) for _ in range(3)])
    np.savez(path, **out)
    return True


def chip_half(path):
    """What the chip's outputs (saved by ``chip_outputs``) say."""
    ins = inputs()
    o = np.load(path)
    x = ins["inplace"][0]
    return {"nan_minmax": nan_counts([o["nan_rows"], o["nan_cols"], o["nan_all"]]),
            "axpy": axpy_counts(o["axpy"], *ins["axpy"]),
            "inplace_ahead": [inplace_counts(r, x) for r in o["inplace"]],
            "scalar_steered": [blocks_read(r) for r in o["scalar"]] if "scalar" in o else None,
            }, o["ew"]


def palladium_half():
    """(run in a subprocess with JAX_PLATFORMS=cpu)"""
    from palladium.interpret import DataRaceError, InterpretParams, errors_as_raised  # noqa: PLC0415
    from palladium.interpret.compiled import compiled_launch  # noqa: PLC0415

    compiled_launch.MIN_EQUATIONS_PER_LAUNCH = 0  # every kernel here compiled whole
    ins = inputs()
    out = {}

    def calls(make, args, seed, n=4):
        fn = make(InterpretParams(random_seed=seed))
        before = compiled_launch.STATS["compiled"]
        results = [jax.block_until_ready(fn(*args)) for _ in range(n)]
        return results, compiled_launch.STATS["compiled"] - before

    res, compiled = calls(nan_kernel, ins["nan"], 1)
    out["nan_minmax"] = {"calls": [nan_counts(r) for r in res], "compiled_calls": compiled}
    res, compiled = calls(axpy_kernel, ins["axpy"], 2)
    out["axpy"] = {"calls": [axpy_counts(r, *ins["axpy"]) for r in res], "compiled_calls": compiled}
    x = ins["inplace"][0]
    res, compiled = calls(inplace_kernel, (x,), 3)
    out["inplace_ahead"] = {"calls": [inplace_counts(r, x) for r in res],
                            "compiled_calls": compiled}
    try:
        with errors_as_raised():
            inplace_kernel(InterpretParams(detect_races=True))(x).block_until_ready()
        out["inplace_ahead"]["detect_races"] = None
    except DataRaceError as e:
        out["inplace_ahead"]["detect_races"] = str(e)[:600]
    res, compiled = calls(scalar_kernel, SCALAR_ARGS, 5)
    out["scalar_steered"] = {"calls": [blocks_read(r) for r in res], "compiled_calls": compiled}
    res, compiled = calls(elementwise_kernel, ins["elementwise"], 4)
    np.save(Path(os.environ["OUT"]) / "palladium_elementwise.npy",
            np.stack([np.stack([np.asarray(o) for o in r]) for r in res]))
    out["elementwise_compiled_calls"] = compiled
    return out


def main():
    """``--chip-npz PATH``: the chip's outputs saved before (by this script on a TPU
    machine, or the same kernels run there by hand) instead of running them now."""
    out_dir = Path(os.environ["OUT"])
    out_dir.mkdir(parents=True, exist_ok=True)
    if "--palladium" in sys.argv:
        (out_dir / "palladium.json").write_text(json.dumps(palladium_half()))
        return
    chip_npz = out_dir / "chip.npz"
    if "--chip-only" in sys.argv:  # (a TPU machine without palladium: outputs only)
        print("chip outputs saved" if chip_outputs(chip_npz) else "no TPU")
        return
    if "--chip-npz" in sys.argv:
        chip_npz = Path(sys.argv[sys.argv.index("--chip-npz") + 1])
    elif not chip_outputs(chip_npz):
        chip_npz = None
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
        [str(root / "packages" / p / "src") for p in ("interpret", "shared-memory", "race-detect")]
        + [os.environ.get("PYTHONPATH", "")]))
    t0 = time.time()
    sub = subprocess.run([sys.executable, __file__, "--palladium"], env=env,
                         capture_output=True, text=True, timeout=540)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "jax": jax.__version__,
              "palladium_seconds": round(time.time() - t0, 1)}
    chip_ew = None
    if chip_npz is not None:
        result["chip"], chip_ew = chip_half(chip_npz)
    if sub.returncode:
        result["palladium_error"] = sub.stderr[-3000:]
    else:
        result["palladium"] = json.loads((out_dir / "palladium.json").read_text())
    pd_npy = out_dir / "palladium_elementwise.npy"
    if chip_ew is not None and pd_npy.exists():
        calls = np.load(pd_npy)
        result["elementwise_ulps"] = {
            name: {f"call {c + 1}": differences(chip_ew[i], calls[c][i]) for c in (0, 3)}
            | {"elements": int(chip_ew[i].size)}
            for i, name in enumerate(ELEMENTWISE)}
    (out_dir / "compiled_semantics.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
