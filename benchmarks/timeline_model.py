"""The timeline's performance model: predictions vs published TPU measurements and vs
the roofline, and what recording a timeline costs.

1. Published: the Pallas TPU matmul guide's own v5e timings (docs/pallas/tpu/matmul.ipynb,
   bf16, ``timeit`` of the jitted call, so they include ~0.1 ms of dispatch: the guide's
   XLA 1024^3 matmul takes 119 us for ~11 us of MXU work), against palladium's
   prediction of the same kernel (``skip_floating_point_ops=True``: shapes suffice).
2. Roofline: the benchmark kernels (jax's shipped matmul and flash attention of
   interpret_vs_jax.py, an elementwise add, the ring all-gather of
   examples/collectives.py on 4 devices), predicted vs max(flops / MXU peak,
   bytes / bandwidth) on v5e.
3. Cost: steady-state time of a launch with and without a ``timeline()`` recording it
   (replay included), median of repeated calls. Target: under 1.3x.

    python benchmarks/timeline_model.py [--quick]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=5").strip()  # N + 1 for N = 4

import argparse  # noqa: E402
import functools  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.experimental.pallas.ops.tpu import flash_attention as fa  # noqa: E402
from jax.experimental.pallas.ops.tpu.matmul import matmul as jax_matmul  # noqa: E402

import palladium.interpret as pi  # noqa: E402
from palladium.interpret.perf import chip_model  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import collectives  # noqa: E402

V5E = chip_model("v5e")


def guide_matmul(m, bm, bk, bn, params):
    """The Pallas TPU matmul guide's kernel (accumulator scratch, 3-D grid), bf16."""

    def kernel(x_ref, y_ref, z_ref, acc_ref, *, nsteps):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == nsteps - 1)
        def _():
            z_ref[...] = acc_ref[...].astype(z_ref.dtype)

    call = pl.pallas_call(
        functools.partial(kernel, nsteps=m // bk),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                      pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
            grid=(m // bm, m // bn, m // bk)),
        out_shape=jax.ShapeDtypeStruct((m, m), jnp.bfloat16),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=params,
    )
    x = jnp.ones((m, m), jnp.bfloat16)
    return lambda: call(x, x)


def predict(fn):
    with pi.timeline() as tl:
        jax.block_until_ready(fn())
    return tl.launches[-1]


# (m, bm, bk, bn) -> the guide's published v5e time in seconds (first of its three runs)
PUBLISHED = {
    (1024, 128, 128, 128): 0.00029766598949208854,
    (4096, 128, 128, 128): 0.011771515250438824,
    (1024, 512, 1024, 1024): 0.00012708659982308746,
    (4096, 512, 1024, 1024): 0.00088908776990138,
    (8192, 512, 1024, 1024): 0.006099433819763363,
}


def published_table(quick: bool) -> None:
    print("### Predicted vs published TPU v5e times (Pallas matmul guide, bf16)")
    print()
    print("| m = k = n | blocks (bm, bk, bn) | grid steps | published | predicted | "
          "predicted / published | bound | MXU use |")
    print("|---|---|---|---|---|---|---|---|")
    params = pi.InterpretParams(chip="v5e", skip_floating_point_ops=True)
    for (m, bm, bk, bn), measured in PUBLISHED.items():
        steps = (m // bm) * (m // bn) * (m // bk)
        if quick and steps > 2000:
            continue
        rec = predict(guide_matmul(m, bm, bk, bn, params))
        print(f"| {m} | ({bm}, {bk}, {bn}) | {steps} | {measured * 1e3:.3f} ms | "
              f"{rec.predicted_seconds * 1e3:.3f} ms | {rec.predicted_seconds / measured:.2f} | "
              f"{rec.bound} | {rec.mxu_utilisation:.0%} |", flush=True)
    print()


def _flash(seq, block, params):
    q = jnp.ones((1, 1, seq, 128), jnp.float32)
    sizes = fa.BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1)
    return lambda: pi_force(params, lambda: fa.flash_attention(q, q, q, block_sizes=sizes))


def pi_force(params, fn):
    with pi.force_tpu_interpret_mode(params):
        return fn()


def _jax_matmul(n, block, params):
    x = jnp.ones((n, n), jnp.float32)
    return lambda: pi_force(params, lambda: jax_matmul(x, x, block_shape=(block, block),
                                                        block_k=block))


def _add(rows, block, params):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    spec = pl.BlockSpec((block, 1024), lambda i: (i, 0))
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((rows, 1024), jnp.float32),
                          grid=(rows // block,), in_specs=[spec, spec], out_specs=spec,
                          interpret=params)
    x = jnp.ones((rows, 1024), jnp.float32)
    return lambda: call(x, x)


def _gather(n, rows, params):
    x = collectives.iota((n * rows, 1024))
    return lambda: collectives.run(
        lambda s, n: collectives.all_gather(s, n=n, interpret=params), n, x)


def roofline_table() -> None:
    print("### Predicted vs roofline on TPU v5e (benchmark kernels)")
    print()
    print("| kernel | flops | HBM / ICI bytes | roofline | predicted | predicted / roofline "
          "| bound |")
    print("|---|---|---|---|---|---|---|")
    p = pi.InterpretParams(chip="v5e", skip_floating_point_ops=True)
    n, seq = 1024, 2048
    cases = [
        ("jax matmul 1024^3 f32 (blocks 128)", _jax_matmul(n, 128, p), 2 * n**3,
         3 * n * n * 4, "hbm"),
        ("jax matmul 1024^3 f32 (blocks 512)", _jax_matmul(n, 512, p), 2 * n**3,
         3 * n * n * 4, "hbm"),
        ("flash attention seq 2048 (blocks 128)", _flash(seq, 128, p), 4 * seq * seq * 128,
         4 * seq * 128 * 4, "hbm"),
        ("elementwise add 8192x1024 f32 (blocks 512 rows)", _add(8192, 512, p), 0,
         3 * 8192 * 1024 * 4, "hbm"),
        ("ring all-gather, 4 devices x 256 KiB", _gather(4, 64, p), 0, 3 * 64 * 1024 * 4,
         "ici"),
    ]
    for name, fn, flops, nbytes, link in cases:
        rec = predict(fn)
        bw = V5E.hbm_bytes_per_second if link == "hbm" else V5E.ici_bytes_per_second
        roof = max(flops / V5E.mxu_bf16_flops, nbytes / bw)
        print(f"| {name} | {flops:.2e} | {nbytes:,} ({link.upper()}) | {roof * 1e6:.1f} us | "
              f"{rec.predicted_seconds * 1e6:.1f} us | {rec.predicted_seconds / roof:.2f} | "
              f"{rec.bound} |", flush=True)
    print()


def _once(fn, record: bool) -> float:
    t0 = time.perf_counter()
    if record:
        with pi.timeline() as tl:
            jax.block_until_ready(fn())
        assert tl.launches  # replayed here, inside the measurement
    else:
        jax.block_until_ready(fn())
    return time.perf_counter() - t0


def cost_table(repeats: int) -> None:
    print(f"### Cost of recording a timeline (steady state, median of {repeats} calls each, "
          f"without and with alternating call by call)")
    print()
    print("| kernel | without | with timeline | ratio |")
    print("|---|---|---|---|")
    p = pi.InterpretParams(chip="v5e")
    for name, fn in [("jax matmul 1024^3 f32 (blocks 128)", jax.jit(_jax_matmul(1024, 128, p))),
                     ("flash attention seq 2048 (blocks 128)", jax.jit(_flash(2048, 128, p))),
                     ("elementwise add 8192x1024 f32", jax.jit(_add(8192, 512, p)))]:
        jax.block_until_ready(fn())
        _once(fn, True)
        off, on = [], []
        for _ in range(repeats):  # alternate, so machine load hits both alike
            off.append(_once(fn, False))
            on.append(_once(fn, True))
        a, b = statistics.median(off), statistics.median(on)
        print(f"| {name} | {a:.3f} s | {b:.3f} s | {b / a:.2f}x |", flush=True)
    print()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cost-only", action="store_true")
    args = parser.parse_args(argv)
    if args.cost_only:
        cost_table(5 if args.quick else 15)
        return
    print(f"jax {jax.__version__}, {os.cpu_count()} cores; chip model v5e: MXU "
          f"{V5E.mxu_bf16_flops:.3g} FLOP/s, HBM {V5E.hbm_bytes_per_second:.3g} B/s, ICI "
          f"{V5E.ici_bytes_per_second:.3g} B/s/link, step overhead "
          f"{V5E.step_overhead_s * 1e6:.2f} us, DMA latency {V5E.dma_latency_s * 1e6:.2f} us")
    print()
    published_table(args.quick)
    roofline_table()
    cost_table(5 if args.quick else 15)


if __name__ == "__main__":
    main(sys.argv[1:])
