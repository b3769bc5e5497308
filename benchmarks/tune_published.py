"""``palladium.interpret.predict`` against every published TPU time we found: predicted vs
published, the error of each, and what each prediction cost on this CPU.

Sources (all TPU v5e, bf16, ``timeit`` of the jitted call, so each published time includes
~0.1 ms of dispatch: the matmul guide times XLA's 1024^3 matmul, ~11 us of MXU work, at
0.119 ms):

* the Pallas TPU matmul guide (jax docs/pallas/tpu/matmul.ipynb): its kernel at m = k = n
  of 1024, 4096, 8192 with blocks (128, 128, 128) and (512, 1024, 1024), and the same
  with a transposed right-hand side and with a fused ReLU;
* the Pallas TPU sparse guide (jax docs/pallas/tpu/sparse.ipynb): the block-sparse (DSD)
  matmul, 16384^3, 512 blocks, 10% of the left operand's blocks non-zero (the guide's
  own ``jax.random`` mask: 107 blocks, 3,424 grid steps), and the dense matmul with a
  lower-triangular block-sparse output mask (16384^3, blocks 512 x 1024 x 512).

    python benchmarks/tune_published.py [--quick] [--compile-check auto|approximate]

``--quick`` leaves out the cases over 20,000 grid steps.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi

S = jax.ShapeDtypeStruct
BF16 = jnp.bfloat16

#: What ``timeit`` of a jitted call adds to a kernel on the guide's v5e: the guide times
#: XLA's 1024^3 bf16 matmul at 0.11943 ms, whose MXU work is 2 * 1024^3 / 197 TFLOP/s =
#: 10.9 us; the rest, 0.1085 ms, is dispatch and synchronisation.
DISPATCH_S = 0.11943008983507753e-3 - 2 * 1024**3 / 197e12


def guide_matmul(x, y, *, bm, bk, bn, transpose_rhs=False, activation=None):
    """The matmul guide's kernel and its two variants (``y`` is (n, k) when
    ``transpose_rhs``)."""
    m, k = x.shape
    n = y.shape[0] if transpose_rhs else y.shape[1]
    dims = (((1,), (1,)), ((), ())) if transpose_rhs else (((1,), (0,)), ((), ()))

    def kernel(x_ref, y_ref, z_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jax.lax.dot_general(x_ref[...], y_ref[...], dims,
                                            preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            acc = acc_ref[...]
            if activation == "relu":
                acc = jnp.maximum(acc, 0.0)
            z_ref[...] = acc.astype(z_ref.dtype)

    y_spec = (pl.BlockSpec((bn, bk), lambda i, j, kk: (j, kk)) if transpose_rhs
              else pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)))
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)), y_spec],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
            grid=(m // bm, n // bn, k // bk)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, y)


def dsd_case(size=16384, blk=512, p=0.1):
    """The sparse guide's DSD matmul with the guide's own mask (same key, same draw)."""
    mask_key, _ = jax.random.split(jax.random.key(0))
    block_mask = np.asarray(jax.random.bernoulli(mask_key, p=p, shape=(size // blk,) * 2))
    rows, cols = np.nonzero(block_mask)
    nb = len(rows)
    ii, kk = jnp.asarray(rows, jnp.int32), jnp.asarray(cols, jnp.int32)

    def kernel(ii_ref, kk_ref, x_ref, y_ref, _, o_ref, acc):
        b = pl.program_id(1)
        row = ii_ref[b]

        @pl.when((b == 0) | (row != ii_ref[jnp.maximum(b - 1, 0)]))
        def _():
            acc[...] = jnp.zeros_like(acc)

        acc[...] += jnp.dot(x_ref[0, :, :], y_ref[...], preferred_element_type=jnp.float32)

        # the guide reads idxs_i_ref[min(b + 1, num_blocks)], one past the end at the
        # last step (palladium raises OutOfBoundsError there): clamped to the last block
        @pl.when((b == nb - 1) | (row != ii_ref[jnp.minimum(b + 1, nb - 1)]))
        def _():
            o_ref[...] = acc[...].astype(o_ref.dtype)

    def call(ii, kk, x_blocks, y, zeros):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2, grid=(size // blk, nb),
                in_specs=[pl.BlockSpec((1, blk, blk), lambda j, b, i, k: (b, 0, 0)),
                          pl.BlockSpec((blk, blk), lambda j, b, i, k: (k[b], j)),
                          pl.BlockSpec((blk, blk), lambda j, b, i, k: (i[b], j))],
                out_specs=pl.BlockSpec((blk, blk), lambda j, b, i, k: (i[b], j)),
                scratch_shapes=[pltpu.VMEM((blk, blk), jnp.float32)]),
            out_shape=jax.ShapeDtypeStruct((size, size), BF16),
            input_output_aliases={4: 0},
        )(ii, kk, x_blocks, y, zeros)

    args = (ii, kk, S((nb, blk, blk), BF16), S((size, size), BF16), S((size, size), BF16))
    return call, args, (size // blk) * nb


def masked_case(size=16384, bm=512, bk=1024, bn=512):
    """The sparse guide's dense matmul with a lower-triangular block-sparse output mask:
    the guide's prefetch maps, computed here with numpy (its ``sparsify_mask``)."""
    nbm, nbn = size // bm, size // bn
    block_mask = np.zeros((nbm, nbn), np.int32)
    kind = np.zeros((nbm, nbn), np.int32)  # 0: the diagonal's triangle, 1: all ones
    for i in range(nbm):
        for j in range(nbn):
            if j * bn <= (i + 1) * bm - 1:  # the block holds a nonzero of tril
                block_mask[i, j] = 1
                kind[i, j] = 1 if (j + 1) * bn - 1 <= i * bm else 0
    prefetch_mask = np.zeros_like(block_mask)
    prefetch_i = np.zeros_like(block_mask)
    prefetch_j = np.zeros_like(block_mask)
    nxt = (0, nbm - 1, nbn - 1)
    for i in range(nbm - 1, -1, -1):  # the guide walks the blocks backwards
        for j in range(nbn - 1, -1, -1):
            if block_mask[i, j]:
                nxt = (kind[i, j], i, j)
            prefetch_mask[i, j], prefetch_i[i, j], prefetch_j[i, j] = nxt

    def kernel(block_mask_ref, pm, pi_, pj, x_ref, y_ref, mask_ref, o_ref, acc):
        del pm, pi_, pj
        i, j, k = pl.program_id(0), pl.program_id(1), pl.program_id(2)

        @pl.when(k == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)
            acc[...] = jnp.zeros_like(acc)

        @pl.when(block_mask_ref[i, j] != 0)
        def _():
            acc[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

            @pl.when(k == pl.num_programs(2) - 1)
            def _():
                o_ref[...] = (mask_ref[0, ...] * acc[...]).astype(o_ref.dtype)

    def x_map(i, j, k, bmask, pm, p_i, p_j):
        return (p_i[i, j], (bmask[i, j] != 0) * k)

    def y_map(i, j, k, bmask, pm, p_i, p_j):
        return ((bmask[i, j] != 0) * k, p_j[i, j])

    def call(bmask, pm, p_i, p_j, x, y, mask_data):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=4, grid=(nbm, nbn, size // bk),
                in_specs=[pl.BlockSpec((bm, bk), x_map), pl.BlockSpec((bk, bn), y_map),
                          pl.BlockSpec((1, bm, bn), lambda i, j, k, b, pm, *_: (pm[i, j], 0, 0))],
                out_specs=pl.BlockSpec((bm, bn), lambda i, j, k, *_: (i, j)),
                scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)]),
            out_shape=jax.ShapeDtypeStruct((size, size), BF16),
        )(bmask, pm, p_i, p_j, x, y, mask_data)

    as_j = functools.partial(jnp.asarray, dtype=jnp.int32)
    args = (as_j(block_mask), as_j(prefetch_mask), as_j(prefetch_i), as_j(prefetch_j),
            S((size, size), BF16), S((size, size), BF16), S((2, bm, bn), jnp.int32))
    return call, args, nbm * nbn * (size // bk)


def matmul_cases():
    for variant, source, pub in [
        ("", "matmul guide", {
            (1024, 128): 0.29766598949208854e-3, (4096, 128): 11.771515250438824e-3,
            (8192, 128): 91.83577066054567e-3, (1024, 512): 0.12708659982308746e-3,
            (4096, 512): 0.88908776990138e-3, (8192, 512): 6.099433819763363e-3}),
        ("transposed RHS", "matmul guide", {
            (1024, 128): 0.3029372810851783e-3, (4096, 128): 12.017967159627005e-3,
            (8192, 128): 95.00920018996112e-3, (1024, 512): 0.12131539988331496e-3,
            (4096, 512): 0.8790623804088682e-3, (8192, 512): 6.107717020204291e-3}),
        ("fused ReLU", "matmul guide", {
            (1024, 128): 0.30103540048003196e-3, (4096, 128): 11.807117109419778e-3,
            (8192, 128): 91.81861146935262e-3, (1024, 512): 0.12622540001757442e-3,
            (4096, 512): 0.896632740041241e-3, (8192, 512): 6.130605939542875e-3}),
    ]:
        for (m, b), published in pub.items():
            bm, bk, bn = (128, 128, 128) if b == 128 else (512, 1024, 1024)
            fn = functools.partial(guide_matmul, bm=bm, bk=bk, bn=bn,
                                   transpose_rhs=variant == "transposed RHS",
                                   activation="relu" if variant == "fused ReLU" else None)
            y = S((m, m), BF16)
            name = f"matmul {m}^3, blocks ({bm}, {bk}, {bn})" + (f", {variant}" if variant else "")
            steps = (m // bm) * (m // bn) * (m // bk)
            yield name, source, fn, (S((m, m), BF16), y), steps, published


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--compile-check", default="auto")
    args = parser.parse_args(argv)
    cases = list(matmul_cases())
    dsd, dsd_args, dsd_steps = dsd_case()
    cases.append(("block-sparse DSD matmul 16384^3, blocks 512, 10% nonzero", "sparse guide",
                  dsd, dsd_args, dsd_steps, 8.136e-3))
    masked, masked_args, masked_steps = masked_case()
    cases.append(("matmul 16384^3 with a lower-triangular output mask, blocks (512, 1024, 512)",
                  "sparse guide", masked, masked_args, masked_steps, 28.648e-3))
    print(f"jax {jax.__version__}; predictions on TPU v5e, compile_check={args.compile_check}")
    print()
    print("| case | source | grid steps | published | predicted | error | predicted + "
          f"{DISPATCH_S * 1e3:.3f} ms dispatch | error | bound | time to predict |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, source, fn, fargs, steps, published in cases:
        if args.quick and steps > 20_000:
            continue
        t0 = time.perf_counter()
        p = pi.predict(fn, *fargs, chip="v5e", compile_check=args.compile_check)
        wall = time.perf_counter() - t0
        if not p.compiles:
            print(f"| {name} | {source} | {steps:,} | {published * 1e3:.3f} ms | rejected: "
                  f"{p.reason} | | | | | {wall:.1f} s |", flush=True)
            continue
        err = p.predicted_seconds / published - 1
        with_dispatch = p.predicted_seconds + DISPATCH_S
        err2 = with_dispatch / published - 1
        print(f"| {name} | {source} | {steps:,} | {published * 1e3:.3f} ms | "
              f"{p.predicted_seconds * 1e3:.3f} ms | {err:+.0%} | {with_dispatch * 1e3:.3f} ms | "
              f"{err2:+.0%} | {p.bound} | {wall:.1f} s |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
