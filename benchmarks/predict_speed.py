"""What one ``palladium.interpret.predict`` costs on this CPU, on jax's shipped kernels.

Every kernel runs in a fresh process (``--worker``): the first ``predict`` there (tracing,
lowering, the compile-and-fit verdict, the simulated launch, the timeline replay), then
a repeated one on the same configuration (what each further call of a ``sweep`` pays).
Reported: process CPU seconds and wall seconds of each, the predicted TPU time (the two
must agree: ``predict`` is a function of the kernel and its shapes) and the grid steps.
The goal (issue 40 item 4): every prediction <= 2 s of CPU.

    python benchmarks/predict_speed.py                 # every kernel
    python benchmarks/predict_speed.py -k paged        # only those whose name has "paged"
    python benchmarks/predict_speed.py --profile paged # cProfile of one first prediction

Operands whose values do not steer the kernel are ``jax.ShapeDtypeStruct`` (predict passes
zeros); page tables, lengths and group sizes are real arrays. ``--compile-check``
defaults to ``approximate`` so that the numbers do not depend on libtpu being installed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def _cases() -> dict[str, Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]]:
    """name -> make() returning (kernel_fn, args) for predict; jax imported lazily."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    S = jax.ShapeDtypeStruct
    f32, bf16 = jnp.float32, jnp.bfloat16

    def matmul(n, block, dtype=f32):
        from jax.experimental.pallas.ops.tpu.matmul import matmul as mm

        return functools.partial(mm, block_shape=(block, block), block_k=block), (
            S((n, n), dtype), S((n, n), dtype))

    def guide(n, bm, bk, bn):
        sys.path.insert(0, HERE)
        from tune_published import guide_matmul

        return functools.partial(guide_matmul, bm=bm, bk=bk, bn=bn), (
            S((n, n), bf16), S((n, n), bf16))

    def flash(causal, heads, seq, block, dtype=f32):
        from jax.experimental.pallas.ops.tpu import flash_attention as fa

        sizes = fa.BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1)
        fn = functools.partial(fa.flash_attention, causal=causal, block_sizes=sizes)
        return fn, tuple(S((1, heads, seq, 128), dtype) for _ in range(3))

    def splash(heads, seq, block):
        from jax.experimental.pallas.ops.tpu.splash_attention import (
            splash_attention_kernel as sk,
        )
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

        def fn(q, k, v):
            mask = sm.MultiHeadMask([sm.CausalMask((seq, seq)) for _ in range(heads)])
            sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block)
            kernel = sk.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1)
            return kernel(q, k, v)

        return fn, tuple(S((heads, seq, 128), f32) for _ in range(3))

    def paged(batch, heads, page, pages_per_seq, per_block, dtype=f32):
        from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

        rng = np.random.default_rng(0)
        total = batch * pages_per_seq
        lengths = jnp.asarray(rng.integers(page, page * pages_per_seq, batch), jnp.int32)
        indices = jnp.asarray(rng.permutation(total).reshape(batch, pages_per_seq), jnp.int32)
        fn = functools.partial(paged_attention, pages_per_compute_block=per_block)
        return fn, (S((batch, heads, 128), dtype), S((heads, total, page, 128), dtype),
                    S((heads, total, page, 128), dtype), lengths, indices)

    def ragged():
        from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

        rng = np.random.default_rng(0)
        q_lens, kv_lens = np.array([5, 1, 18]), np.array([40, 17, 90, 0])
        pages = jnp.asarray(rng.permutation(64)[:32].reshape(4, 8), jnp.int32)
        cu_q = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens), [q_lens.sum()]]), jnp.int32)
        fn = functools.partial(rpa.ragged_paged_attention, num_kv_pages_per_block=4,
                               num_queries_per_block=8)
        return fn, (S((32, 8, 128), f32), S((64, 16, 4, 128), f32),
                    jnp.asarray(kv_lens, jnp.int32), pages, cu_q, jnp.array([3], jnp.int32))

    def gmm(m, k, n, groups):
        from jax.experimental.pallas.ops.tpu.megablox import gmm as mgmm

        sizes = jnp.asarray([m // 8, 3 * m // 8, m // 4, m // 4], jnp.int32)[:groups]
        return functools.partial(mgmm, tiling=(128, 128, 128)), (
            S((m, k), f32), S((groups, k, n), f32), sizes)

    return {
        "jax matmul 1024^3 f32 (blocks 128)": lambda: matmul(1024, 128),
        "jax matmul 2048^3 bf16 (blocks 256)": lambda: matmul(2048, 256, bf16),
        "guide matmul 1024^3 bf16 (128, 128, 128)": lambda: guide(1024, 128, 128, 128),
        "guide matmul 4096^3 bf16 (512, 1024, 1024)": lambda: guide(4096, 512, 1024, 1024),
        "guide matmul 4096^3 bf16 (128, 128, 128)": lambda: guide(4096, 128, 128, 128),
        "flash forward h2 seq 1024 (blocks 128)": lambda: flash(False, 2, 1024, 128),
        "flash forward causal h2 seq 1024 (blocks 128)": lambda: flash(True, 2, 1024, 128),
        "flash forward causal h8 seq 2048 bf16 (blocks 128)":
            lambda: flash(True, 8, 2048, 128, bf16),
        "splash causal h2 seq 1024 (blocks 256)": lambda: splash(2, 1024, 256),
        "paged attention b4 h4 pages 16x16 (block 4)": lambda: paged(4, 4, 16, 16, 4),
        "paged attention b8 h8 pages 64x16 bf16 (block 8)":
            lambda: paged(8, 8, 16, 64, 8, bf16),
        "paged attention b32 h8 pages 128x16 bf16 (block 8)":
            lambda: paged(32, 8, 16, 128, 8, bf16),
        "ragged paged attention (3 sequences)": ragged,
        "megablox gmm 1024x256x256, 4 groups": lambda: gmm(1024, 256, 256, 4),
    }


def _parts() -> dict[str, float]:
    """CPU seconds of predict's parts, counted from here on: ``lower`` (trace, lower with
    the compile-and-fit check, compile: ``tune.predict._lowered``; before issue 40.4 the
    abstract lowering, the run traced and lowered again) and ``replay`` (the
    timeline's replay of a launch: ``perf.record.LaunchRecord``); the rest of a
    prediction is the simulated launch."""
    import importlib

    predict_module = importlib.import_module("palladium.interpret.tune.predict")
    timeline = importlib.import_module("palladium.interpret.perf.timeline")
    record = importlib.import_module("palladium.interpret.perf.record")
    spent = {"lower": 0.0, "replay": 0.0}

    def timed(part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **kw: Any) -> Any:
            t0 = time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                spent[part] += time.process_time() - t0
        return call

    for lowering in ("_lowered", "_float_steered"):  # (the latter: before issue 40.4)
        if hasattr(predict_module, lowering):
            setattr(predict_module, lowering, timed("lower", getattr(predict_module, lowering)))
    timeline.LaunchRecord = timed("replay", record.LaunchRecord)  # type: ignore[misc]
    return spent


def _worker(name: str, compile_check: str, repeats: int) -> dict[str, Any]:
    import warnings

    import palladium.interpret as pi

    fn, args = _cases()[name]()
    out: dict[str, Any] = {"kernel": name}
    spent = _parts()
    for i in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p = pi.predict(fn, *args, chip="v5e", compile_check=compile_check)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        tag = "first" if i == 0 else "repeat"
        out[f"{tag}_cpu_s"], out[f"{tag}_wall_s"] = cpu, wall
        for part in spent:
            out[f"{tag}_{part}_cpu_s"] = spent[part]
            spent[part] = 0.0
        out[f"{tag}_predicted_s"] = p.predicted_seconds
        out["grid_steps"] = p.grid_steps
        out["bound"] = p.bound
    return out


def _profile(name: str, compile_check: str) -> None:
    import cProfile
    import pstats

    import palladium.interpret as pi

    fn, args = _cases()[name]()
    prof = cProfile.Profile()
    prof.enable()
    pi.predict(fn, *args, chip="v5e", compile_check=compile_check)
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(45)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", action="append", default=[], help="kernels whose name has this")
    parser.add_argument("--compile-check", default="approximate")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--profile", help="cProfile the first prediction of this kernel")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--cold", action="store_true",
                        help="each worker on an empty palladium disk cache")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.worker, args.compile_check, args.repeats)))
        return
    names = list(_cases())
    if args.profile:
        _profile(next(n for n in names if args.profile in n), args.compile_check)
        return
    chosen = [n for n in names if not args.k or any(k in n for k in args.k)]
    print(f"predict on TPU v5e, compile_check={args.compile_check}; CPU = process CPU "
          f"seconds, each kernel in a fresh process"
          + (" with an empty disk cache" if args.cold else ""))
    print()
    print("| kernel | grid steps | predicted | first: CPU / wall | first: lower / replay CPU "
          "| repeat: CPU / wall | repeat: replay CPU |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for name in chosen:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", name,
               "--compile-check", args.compile_check, "--repeats", str(args.repeats)]
        env = dict(os.environ)
        with tempfile.TemporaryDirectory() as cache:
            if args.cold:
                env["PALLADIUM_CACHE_DIR"] = cache
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        if proc.returncode != 0:
            print(f"| {name} | failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]} |"
                  " | | | | |", flush=True)
            continue
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(row)
        rep = (f"{row['repeat_cpu_s']:.2f} s / {row['repeat_wall_s']:.2f} s | "
               f"{row['repeat_replay_cpu_s']:.2f} s" if "repeat_cpu_s" in row else " | ")
        print(f"| {name} | {row['grid_steps']:,} | {row['first_predicted_s'] * 1e6:,.2f} us | "
              f"{row['first_cpu_s']:.2f} s / {row['first_wall_s']:.2f} s | "
              f"{row['first_lower_cpu_s']:.2f} s / {row['first_replay_cpu_s']:.2f} s | {rep} |",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
