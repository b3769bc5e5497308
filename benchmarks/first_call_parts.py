"""Where a kernel's first call goes: trace, lower (palladium's lowering rule and its
checks inside it), XLA compile, run (compiled segments inside it), for palladium and
jax's HLO interpreter, each in a fresh process.

    python benchmarks/first_call_parts.py -k gmm -k flash          # warm cache
    python benchmarks/first_call_parts.py -k gmm --cold --repeats 3
    python benchmarks/first_call_parts.py --one-process            # first calls only

``--order hlo,pd,floor`` adds the floor: the same first call with every ``pallas_call``
replaced by one that returns the sum of its operands' elements, broadcast to its output
shapes (so nothing that computes the operands is dropped): what the kernel's own wrapper
costs to trace, lower and compile, which every interpreter pays on a first call.

``--one-process``: the first calls of ``interpret_kernels.py`` alone (every kernel in one
process, in its order; HLO's first call, then palladium's after ``jax.clear_caches()``),
wall and process CPU time: an A/B of first calls in a minute.

Every measurement is a fresh process (``--worker``) that runs HLO's first call of the
kernel and then palladium's (as ``interpret_kernels.py`` does, ``jax.clear_caches()``
between), with ``$PALLADIUM_CACHE_DIR`` a fresh folder (``--cold``) or one filled by an
earlier process (warm). Wall and process CPU time per phase, in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _worker(name: str, order: str, warmup: bool) -> dict:
    sys.path.insert(0, HERE)

    import jax
    import kernel_cases
    from _timed import timed_calls
    from interpret_kernels import _forced

    import palladium.interpret as pi
    from palladium.interpret.fidelity import checks, tpu_compiler
    from palladium.interpret.hook import jax_hook
    from palladium.interpret.state import segment_cache

    def forced(value):
        return _forced(value)()

    case = next(c for c in kernel_cases.all_cases() if name in c.name)
    fn, args = case.make()
    out: dict[str, float] = {}

    def phases(tag: str, mode) -> None:
        jax.clear_caches()
        jitted = jax.jit(fn)
        with mode:
            t = time.perf_counter(), time.process_time()

            def mark(phase: str) -> None:
                nonlocal t
                now = time.perf_counter(), time.process_time()
                out[f"{tag} {phase}"] = now[0] - t[0]
                out[f"{tag} {phase} cpu"] = now[1] - t[1]
                t = now

            t0 = t
            traced = jitted.trace(*args)
            mark("trace")
            lowered = traced.lower()
            mark("lower")
            compiled = lowered.compile()
            mark("compile")
            jax.block_until_ready(compiled(*args))
            mark("run")
            out[f"{tag} total"] = t[0] - t0[0]
            out[f"{tag} total cpu"] = t[1] - t0[1]

    def hlo() -> None:
        phases("hlo", forced(True))

    def palladium() -> None:
        with (timed_calls(jax_hook, "_pallas_call_lowering") as rule,
              timed_calls(jax_hook, "check_compiles_and_fits") as fid,
              timed_calls(tpu_compiler, "compile_verdict") as verdict,
              timed_calls(checks, "check_lowering") as approx,
              timed_calls(jax_hook.PreparedKernel, "from_params") as prep,
              timed_calls(jax_hook, "_execute") as run,
              timed_calls(segment_cache, "_load") as seg_load):
            segs = jax_hook.STATE.segments
            before = segs.compiled
            inner_get = segs.get
            seg_time = [0.0]

            def get(text, compile_fn):
                def timed():
                    t0 = time.perf_counter()
                    try:
                        return compile_fn()
                    finally:
                        seg_time[0] += time.perf_counter() - t0
                return inner_get(text, timed)

            segs.get = get
            try:
                phases("pd", forced(pi.InterpretParams()))
            finally:
                del segs.get
        out.update({"pd rule": rule.seconds, "pd fidelity": fid.seconds,
                    "pd verdict": verdict.seconds, "pd approx": approx.seconds,
                    "pd prepare": prep.seconds, "pd execute": run.seconds,
                    "pd seg load": seg_load.seconds, "pd seg compile": seg_time[0],
                    "pd segs compiled": segs.compiled - before})

    def floor() -> None:
        from jax.experimental import pallas as pl

        original = pl.pallas_call
        pl.pallas_call = _free_pallas_call
        try:
            phases("floor", forced(True))
        finally:
            pl.pallas_call = original

    if warmup:  # as in interpret_kernels.py, where other kernels ran before
        small_fn, small_args = kernel_cases.matmul_case(256).make()
        for mode in (forced(True), forced(pi.InterpretParams())):
            jax.clear_caches()
            with mode:
                jax.block_until_ready(jax.jit(small_fn)(*small_args))
    for which in order.split(","):
        {"hlo": hlo, "pd": palladium, "floor": floor}[which]()
    out["libtpu"] = float(tpu_compiler.compiler_version() is not None)
    return out


def _free_pallas_call(kernel, out_shape, **_):
    """A ``pallas_call`` whose kernel costs next to nothing: its outputs are the sum of
    every operand's elements, broadcast (so XLA keeps whatever computes the operands:
    an unused operand's producers would be dropped, and an optimization barrier does not
    stop that on XLA's CPU backend)."""
    import jax
    import jax.numpy as jnp

    def call(*operands):
        total = sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(operands))
        return jax.tree.map(lambda s: jnp.full(s.shape, total, s.dtype), out_shape)

    return call


def _one_process(names: list[str]) -> None:
    sys.path.insert(0, HERE)
    import jax
    import kernel_cases
    from interpret_kernels import _forced

    import palladium.interpret as pi

    for case in kernel_cases.all_cases():
        if names and not any(n in case.name for n in names):
            continue
        fn, args = case.make()
        res = {}
        for mode, ctx in (("hlo", _forced(True)), ("pd", _forced(pi.InterpretParams()))):
            jax.clear_caches()
            with ctx():
                t = time.perf_counter(), time.process_time()
                jax.block_until_ready(jax.jit(fn)(*args))
                res[mode] = (time.perf_counter() - t[0], time.process_time() - t[1])
        (hw, hc), (pw, pc) = res["hlo"], res["pd"]
        print(f"| {case.name} | {hw * 1e3:.0f} / {hc * 1e3:.0f} | {pw * 1e3:.0f} / "
              f"{pc * 1e3:.0f} | {hw / pw:.1f}x | {hc / pc:.1f}x |", flush=True)


def _run(python: str, name: str, cache: str, order: str, warmup: bool) -> dict:
    env = dict(os.environ, PALLADIUM_CACHE_DIR=cache, JAX_PLATFORMS="cpu")
    proc = subprocess.run([python, __file__, "--worker", name, "--order", order]
                          + (["--warmup"] if warmup else []),
                          env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--order", default="hlo,pd")
    parser.add_argument("--warmup", action="store_true",
                        help="a small matmul under both interpreters first")
    parser.add_argument("-k", action="append", default=[])
    parser.add_argument("--cold", action="store_true", help="a fresh palladium cache")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--one-process", action="store_true",
                        help="first calls only, every kernel in this process")
    opts = parser.parse_args(argv)
    if opts.one_process:
        print("| kernel | HLO first, wall / CPU ms | palladium first, wall / CPU ms | "
              "wall ratio | CPU ratio |\n|---|---|---|---|---|")
        _one_process(opts.k)
        return 0
    if opts.worker:
        print(json.dumps(_worker(opts.worker, opts.order, opts.warmup)))
        return 0
    names = opts.k or ["matmul", "flash forward", "flash backward", "splash", "gmm",
                       "paged", "rg-lru", "gated-delta", "int8"]
    warm_dir = tempfile.mkdtemp(prefix="palladium-warm-")
    for name in names:
        runs = []
        if not opts.cold:
            _run(opts.python, name, warm_dir, opts.order, opts.warmup)  # fills the cache
        for _ in range(opts.repeats):
            cache = tempfile.mkdtemp(prefix="palladium-cold-") if opts.cold else warm_dir
            runs.append(_run(opts.python, name, cache, opts.order, opts.warmup))
        keys = list(runs[0])
        med = {k: statistics.median(r[k] for r in runs) for k in keys}
        print(f"## {name} ({'cold' if opts.cold else 'warm'} cache, libtpu "
              f"{bool(med['libtpu'])}, median of {len(runs)}; load "
              f"{os.getloadavg()[0]:.1f}); ms, wall / CPU")
        print("| phase | HLO | palladium | floor (no kernel) |")
        print("|---|---|---|---|")
        for phase in ("trace", "lower", "compile", "run", "total"):
            cells = [f"{med[f'{t} {phase}'] * 1e3:.0f} / {med[f'{t} {phase} cpu'] * 1e3:.0f}"
                     if f"{t} {phase}" in med else "" for t in ("hlo", "pd", "floor")]
            print(f"| {phase} | {' | '.join(cells)} |")
        print("palladium's parts (wall): " + ", ".join(
            f"{k[3:]} {med[k] * 1e3:.0f}" if "compiled" not in k else f"{k[3:]} {med[k]:.0f}"
            for k in keys if k.startswith("pd ") and not k.endswith("cpu")
            and k.split()[1] not in ("trace", "lower", "compile", "run", "total")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
