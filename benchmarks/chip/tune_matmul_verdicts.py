"""The TPU compiler's verdict on every configuration examples/tune_matmul.py sweeps, on
the chip itself, to check the approximation's "uncertain" margin (issue 44 item 3).

    OUT=/tmp/out python benchmarks/chip/tune_matmul_verdicts.py [--size 2048]

On a TPU VM (jax[tpu]); needs only jax (the guide's kernel is copied here).
Writes $OUT/tune_matmul_verdicts.json: per (bm, bk, bn), "accepted" or the first line of
the compiler's error, with the chip, jax and libtpu versions. Compare with
`python examples/tune_matmul.py --size 2048 --chips v5e` on a CPU without libtpu: the
configurations ranked "compiles" should all be accepted here; those marked
"compiles, uncertain" (VMEM within 10% of the limit) are the ones that may not be.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import time

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def matmul(x, y, *, bm, bk, bn):
    """examples/timeline.py's kernel (the Pallas TPU matmul guide's), as
    examples/tune_matmul.py sweeps it (two buffers per input), copied so that this script
    needs jax alone."""
    def kernel(x_ref, y_ref, z_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            z_ref[...] = acc_ref[...].astype(z_ref.dtype)

    (m, k), (_, n) = x.shape, y.shape
    mode = pl.Buffered(2)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk), pipeline_mode=mode),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j), pipeline_mode=mode)],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, y)


def configs(size: int) -> list[tuple[int, int, int]]:
    """tune_matmul.configs: bm in 256..1024, bk and bn in 512..2048, dividing ``size``."""
    return [(bm, bk, bn) for bm in (256, 512, 1024) for bk in (512, 1024, 2048)
            for bn in (512, 1024, 2048) if size % bm == 0 and size % bk == 0 and size % bn == 0]


def verdict(size: int, bm: int, bk: int, bn: int) -> str:
    x = jax.ShapeDtypeStruct((size, size), jnp.bfloat16)
    fn = jax.jit(lambda a, b: matmul(a, b, bm=bm, bk=bk, bn=bn))
    try:
        fn.lower(x, x).compile()
    except Exception as e:  # noqa: BLE001 - the compiler's rejection, whatever its type
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
    return "accepted"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048)
    args = parser.parse_args()
    device = jax.devices()[0]
    rows = []
    for bm, bk, bn in configs(args.size):
        t0 = time.perf_counter()
        rows.append({"bm": bm, "bk": bk, "bn": bn, "verdict": verdict(args.size, bm, bk, bn),
                     "compile_seconds": round(time.perf_counter() - t0, 3)})
        print(rows[-1], flush=True)
    versions = {}
    for dist in ("jax", "jaxlib", "libtpu"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    out = os.environ.get("OUT", ".")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tune_matmul_verdicts.json"), "w") as f:
        json.dump({"size": args.size, "device": device.device_kind, "versions": versions,
                   "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
