"""Choose the Pallas matmul guide's block sizes on a CPU: every (bm, bk, bn) checked for
TPU v5e and v6e (compiles? fits in VMEM?), predicted, ranked fastest first, next to the
guide's published v5e time where there is one.

    python examples/tune_matmul.py [--size 4096] [--chips v5e v6e] [--processes 2]
                                   [--csv sweep.csv] [--json sweep.json] [--plot sweep.png]

The kernel is examples/timeline.py's (the guide's: an f32 accumulator in VMEM, a 3-D grid,
bf16 operands). The TPU compiler decides what compiles where libtpu is installed
(``palladium-interpret[compiler]``), else palladium's approximation.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import sys

import jax
import jax.numpy as jnp

import palladium.interpret as pi

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timeline import matmul  # noqa: E402  (the guide's kernel)

#: The Pallas TPU matmul guide's published v5e times (docs/pallas/tpu/matmul.ipynb, bf16,
#: ``timeit`` of the jitted call: ~0.1 ms of dispatch included), by (m, bm, bk, bn).
PUBLISHED_V5E = {
    (1024, 128, 128, 128): 0.29766598949208854e-3,
    (4096, 128, 128, 128): 11.771515250438824e-3,
    (8192, 128, 128, 128): 91.83577066054567e-3,
    (1024, 512, 1024, 1024): 0.12708659982308746e-3,
    (4096, 512, 1024, 1024): 0.88908776990138e-3,
    (8192, 512, 1024, 1024): 6.099433819763363e-3,
}


def make_call(bm: int, bk: int, bn: int):
    """The function ``sweep`` predicts for one configuration (module level: it pickles
    for ``--processes``)."""
    return functools.partial(matmul, bm=bm, bk=bk, bn=bn, buffers=2, interpret=False)


def configs(size: int) -> list[dict[str, int]]:
    """bm in 256..1024, bk and bn in 512..2048 (powers of two dividing ``size``)."""
    out = []
    for bm, bk, bn in itertools.product((256, 512, 1024), (512, 1024, 2048), (512, 1024, 2048)):
        if size % bm == 0 and size % bk == 0 and size % bn == 0:
            out.append({"bm": bm, "bk": bk, "bn": bn})
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096, help="m = k = n")
    parser.add_argument("--chips", nargs="+", default=["v5e", "v6e"])
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--top", type=int, default=8, help="rows of each ranking to print")
    parser.add_argument("--csv")
    parser.add_argument("--json")
    parser.add_argument("--plot")
    args = parser.parse_args(argv)
    operand = jax.ShapeDtypeStruct((args.size, args.size), jnp.bfloat16)
    for chip in args.chips:
        result = pi.sweep(make_call, configs(args.size), operand, operand, chip=chip,
                          processes=args.processes)
        doubtful = [row for row in result.ranked if row.uncertain]
        print(f"### {args.size}^3 bf16 matmul on TPU {chip}: {len(result.ranked)} of "
              f"{len(result.rows)} configurations compile "
              f"({result.ranked[0].prediction.checker if result.ranked else '-'}), "
              f"swept in {result.wall_seconds:.1f} s")
        if doubtful:  # ranked after the sure ones: the compiler may reject them
            print(f"{len(doubtful)} of them uncertain (VMEM within 10% of the limit), ranked "
                  f"last: pip install 'palladium-interpret[compiler]' for the TPU "
                  f"compiler's verdict")
        print()
        print("| rank | bm, bk, bn | verdict | predicted | bound | exposed DMA | VMEM | "
              "published (v5e) |")
        print("|---|---|---|---|---|---|---|---|")
        for rank, row in enumerate(result.ranked[: args.top], 1):
            p = row.prediction
            c = row.config
            pub = PUBLISHED_V5E.get((args.size, c["bm"], c["bk"], c["bn"])) if chip == "v5e" \
                else None
            print(f"| {rank} | {c['bm']}, {c['bk']}, {c['bn']} | {row.verdict} | "
                  f"{p.predicted_seconds * 1e3:.3f} ms | {p.bound} | "
                  f"{p.exposed_dma_seconds * 1e6:.1f} us | {p.vmem_bytes / 2**20:.1f} MiB | "
                  f"{'' if pub is None else f'{pub * 1e3:.3f} ms'} |")
        for row in result.rejected:
            print(f"| - | {row.label} | {row.verdict}: {row.error} | | | | | |")
        print()
        for what, path in (("csv", args.csv), ("json", args.json), ("plot", args.plot)):
            if path:
                root, ext = os.path.splitext(path)
                out = f"{root}-{chip}{ext}"
                {"csv": result.to_csv, "json": result.to_json, "plot": result.plot}[what](out)
                print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
