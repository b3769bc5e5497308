"""The chip's outputs against palladium's, on the same kernels and inputs.

Each kernel runs compiled on the TPU (``interpret=False``) and under palladium on the CPU
device of the same host (``force_tpu_interpret_mode``, which makes the CPU the default
device there), on the same inputs. Reported per kernel: the largest difference relative
to the output's scale (max |chip - palladium| / max |chip|), whether NaNs sit at the same
places, and the share of bit-equal elements. Run on a TPU VM (PYTHONPATH with
packages/*/src)::

    python benchmarks/chip_vs_palladium.py --out chip_vs_palladium.json

The table is in benchmarks/README.md ("palladium's results against the chip's").
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas.ops.tpu import flash_attention as fa
from jax.experimental.pallas.ops.tpu import matmul as jax_matmul

import palladium.interpret as pi


def blocked(body, shape, dtype=jnp.float32, block=(256, 256), n_in=1, out_shape=None):
    """A BlockSpec kernel over a 2-D grid of ``block``s of ``shape``."""
    grid = (shape[0] // block[0], shape[1] // block[1])
    spec = pl.BlockSpec(block, lambda i, j: (i, j))
    out_shape = out_shape or jax.ShapeDtypeStruct(shape, dtype)
    out_spec = spec if out_shape.shape == shape else pl.BlockSpec(
        (block[0], out_shape.shape[1]), lambda i, j: (i, 0))
    return lambda *xs: pl.pallas_call(body, out_shape=out_shape, grid=grid,
                                      in_specs=[spec] * n_in, out_specs=out_spec)(*xs)


def unary(fn):
    def body(x_ref, o_ref):
        o_ref[...] = fn(x_ref[...])
    return body


def axpy(a_ref, x_ref, y_ref, o_ref):
    o_ref[...] = a_ref[...] * x_ref[...] + y_ref[...]


def row_reduce(fn):
    def body(x_ref, o_ref):
        o_ref[...] = jnp.broadcast_to(fn(x_ref[...], axis=1, keepdims=True), o_ref.shape)
    return body


def cases(rng):
    f32 = np.float32
    x = rng.standard_normal((1024, 1024)).astype(f32)
    pos = np.abs(x) + 0.1
    yield "exp f32", blocked(unary(jnp.exp), x.shape), (x,)
    yield "tanh f32", blocked(unary(jnp.tanh), x.shape), (x,)
    yield "sin f32", blocked(unary(jnp.sin), x.shape), (x * 10,)
    yield "log f32", blocked(unary(jnp.log), x.shape), (pos,)
    yield "rsqrt f32", blocked(unary(jax.lax.rsqrt), x.shape), (pos,)
    yield "divide f32", blocked(lambda a, b, o: o.__setitem__(..., a[...] / b[...]), x.shape,
                                n_in=2), (x, pos)
    yield "a*x+y f32", blocked(axpy, x.shape, n_in=3), tuple(
        rng.standard_normal((1024, 1024)).astype(f32) for _ in range(3))
    yield "row sum f32", blocked(row_reduce(jnp.sum), x.shape, block=(256, 1024),
                                 out_shape=jax.ShapeDtypeStruct((1024, 128), jnp.float32)), (x,)
    nan = x.copy()
    nan[::97, 5] = np.nan
    yield "row max with NaN f32", blocked(
        row_reduce(jnp.max), x.shape, block=(256, 1024),
        out_shape=jax.ShapeDtypeStruct((1024, 128), jnp.float32)), (nan,)
    yield "bf16 add", blocked(lambda a, b, o: o.__setitem__(..., a[...] + b[...]), x.shape,
                              dtype=jnp.bfloat16, n_in=2), (
        x.astype(jnp.bfloat16), pos.astype(jnp.bfloat16))
    a = rng.standard_normal((512, 1024)).astype(f32)
    b = rng.standard_normal((1024, 512)).astype(f32)
    yield "jax matmul f32", functools.partial(jax_matmul.matmul, block_shape=(256, 256),
                                              block_k=256), (a, b)
    yield "matmul f32 precision=HIGHEST", blocked(
        lambda a_ref, b_ref, o_ref: o_ref.__setitem__(..., jnp.dot(
            a_ref[...], b_ref[...], precision=jax.lax.Precision.HIGHEST,
            preferred_element_type=jnp.float32)),
        (512, 512), block=(512, 512), n_in=2), (a[:, :512], b[:512])
    yield "jax matmul bf16", functools.partial(jax_matmul.matmul, block_shape=(256, 256),
                                               block_k=256), (
        a.astype(jnp.bfloat16), b.astype(jnp.bfloat16))
    q, k, v = (rng.standard_normal((1, 2, 512, 128)).astype(f32) for _ in range(3))
    sizes = fa.BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1)
    for causal in (False, True):
        yield f"flash attention f32 causal={causal}", functools.partial(
            fa.flash_attention, causal=causal, block_sizes=sizes), (q, k, v)
    yield "flash attention bf16", functools.partial(fa.flash_attention, block_sizes=sizes), tuple(
        t.astype(jnp.bfloat16) for t in (q, k, v))


def _bf16(t):
    return np.asarray(np.asarray(t, np.float32).astype(jnp.bfloat16), np.float64)


#: What we think the chip computes where it differs from f32 arithmetic: an f32 dot at
#: the default precision as one MXU pass over operands rounded to bfloat16.
MODELS = {
    "jax matmul f32": lambda a, b: _bf16(a) @ _bf16(b),
}


def compare(chip, ours):
    chip = np.asarray(chip, np.float64)
    ours = np.asarray(ours, np.float64)
    nan_same = bool(np.array_equal(np.isnan(chip), np.isnan(ours)))
    finite = ~(np.isnan(chip) | np.isnan(ours))
    scale = float(np.max(np.abs(chip[finite]))) if finite.any() else 1.0
    diff = float(np.max(np.abs(chip[finite] - ours[finite]))) if finite.any() else 0.0
    return {"max_diff_rel_to_scale": diff / max(scale, 1e-30), "nan_same_places": nan_same,
            "chip_nans": int(np.isnan(chip).sum()), "palladium_nans": int(np.isnan(ours).sum()),
            "bit_equal_share": float(np.mean(chip == ours))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="chip_vs_palladium.json")
    args = parser.parse_args()
    if jax.default_backend() != "tpu":
        sys.exit("chip_vs_palladium.py needs a TPU as jax's default backend")
    rows = []
    for name, fn, xs in cases(np.random.default_rng(0)):
        try:
            chip = np.asarray(jax.jit(fn)(*xs))
            with pi.force_tpu_interpret_mode(pi.InterpretParams()):
                ours = np.asarray(jax.jit(fn)(*xs))
            rows.append({"kernel": name, **compare(chip, ours)})
            if name in MODELS:
                model = MODELS[name](*xs)
                rows[-1]["chip_vs_model"] = compare(chip, model)["max_diff_rel_to_scale"]
                rows[-1]["palladium_vs_model"] = compare(ours, model)["max_diff_rel_to_scale"]
        except Exception as e:
            rows.append({"kernel": name, "error": f"{type(e).__name__}: {str(e)[:400]}"})
        print(json.dumps(rows[-1]), flush=True)
    meta = {"chip": jax.devices()[0].device_kind, "jax": jax.__version__,
            "date": datetime.date.today().isoformat(),
            "script": "benchmarks/chip_vs_palladium.py"}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
