"""Multi-device collectives: palladium.interpret vs jax's own TPU interpret mode.

Four collectives written with remote DMAs (right permute, ring all-gather, all-reduce with
a barrier-semaphore handshake, reduce-scatter) and jax's shipped
``jax.experimental.pallas.ops.tpu.all_gather`` run under ``jit(shard_map)`` over a mesh of
N CPU devices. Every result is checked against numpy ("(WRONG)" marks a wrong one). Every measurement runs in its own subprocess whose process has N+1 host
devices (jax's interpreter hangs when the mesh uses every host device) and a timeout;
a run that does not finish is reported as "> T s (timeout)". Reported: the first call
(trace + compile + run) and the steady state (median of repeated calls), and the ratio
jax / palladium (higher is better for palladium); then palladium's steady time vs the
device count (2, 4, 8, 16).

    python benchmarks/interpret_multi_device.py [--quick] [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

COLLECTIVES = ("right_permute", "all_gather", "all_reduce", "reduce_scatter", "jax_all_gather")


# --- the kernels (worker side; jax is imported only in the worker) ------------------------


def _kernels():
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    mesh_id = pl.DeviceIdType.MESH
    any_spec = pl.BlockSpec(memory_space=pl.ANY)

    def right_permute(x, *, n, interpret):
        def kernel(x_ref, o_ref, send, recv):
            right = jax.lax.rem(jax.lax.axis_index("x") + 1, n)
            copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=(right,),
                                                device_id_type=mesh_id)
            copy.start()
            copy.wait()

        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), in_specs=[any_spec],
            out_specs=any_spec, scratch_shapes=[pltpu.SemaphoreType.DMA] * 2,
            interpret=interpret)(x)

    def all_gather(x, *, n, interpret):
        def kernel(x_ref, o_ref, local_sem, send_sems, recv_sems):
            me = jax.lax.axis_index("x")
            right = jax.lax.rem(me + 1, n)
            pltpu.make_async_copy(x_ref, o_ref.at[me], local_sem).start()
            pltpu.make_async_copy(x_ref, o_ref.at[me], local_sem).wait()
            for step in range(n - 1):
                slot = jax.lax.rem(me - step + n, n)
                copy = pltpu.make_async_remote_copy(
                    o_ref.at[slot], o_ref.at[slot], send_sems.at[step], recv_sems.at[step],
                    device_id=(right,), device_id_type=mesh_id)
                copy.start()
                copy.wait()

        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((n, *x.shape), x.dtype),
            in_specs=[any_spec], out_specs=any_spec,
            scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA((n - 1,)),
                            pltpu.SemaphoreType.DMA((n - 1,))],
            interpret=interpret)(x).reshape(n * x.shape[0], *x.shape[1:])

    def all_reduce(x, *, n, interpret):
        def kernel(x_ref, o_ref, buf, send_sems, recv_sems):
            me = jax.lax.axis_index("x")
            right = jax.lax.rem(me + 1, n)
            left = jax.lax.rem(me - 1 + n, n)
            barrier = pltpu.get_barrier_semaphore()
            pl.semaphore_signal(barrier, 1, device_id=(left,), device_id_type=mesh_id)
            pl.semaphore_signal(barrier, 1, device_id=(right,), device_id_type=mesh_id)
            pl.semaphore_wait(barrier, 2)
            buf[me] = x_ref[...]
            for step in range(n - 1):
                slot = jax.lax.rem(me - step + n, n)
                copy = pltpu.make_async_remote_copy(
                    buf.at[slot], buf.at[slot], send_sems.at[step], recv_sems.at[step],
                    device_id=(right,), device_id_type=mesh_id)
                copy.start()
                copy.wait()
            total = buf[0]
            for i in range(1, n):
                total = total + buf[i]
            o_ref[...] = total

        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.VMEM((n, *x.shape), x.dtype),
                            pltpu.SemaphoreType.DMA((n - 1,)), pltpu.SemaphoreType.DMA((n - 1,))],
            compiler_params=pltpu.CompilerParams(collective_id=0),
            interpret=interpret)(x)

    def reduce_scatter(x, *, n, interpret):
        def kernel(x_ref, o_ref, buf, send_sem, recv_sem):
            me = jax.lax.axis_index("x")
            buf[me] = x_ref[me]
            copies = []
            for k in range(1, n):
                target = jax.lax.rem(me + k, n)
                copy = pltpu.make_async_remote_copy(
                    x_ref.at[target], buf.at[me], send_sem, recv_sem, device_id=(target,),
                    device_id_type=mesh_id)
                copy.start()
                copies.append(copy)
            for copy in copies:
                copy.wait_send()
            for copy in copies:
                copy.wait_recv()
            total = buf[0]
            for i in range(1, n):
                total = total + buf[i]
            o_ref[...] = total

        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
            scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA,
                            pltpu.SemaphoreType.DMA],
            interpret=interpret)(x)

    del jnp
    return {"right_permute": right_permute, "all_gather": all_gather,
            "all_reduce": all_reduce, "reduce_scatter": reduce_scatter}


def _reference(name, x, n):
    import numpy as np

    x = np.asarray(x)
    if name == "reduce_scatter":
        return x.reshape(n, n, *x.shape[1:]).sum(0).reshape(-1, *x.shape[2:])
    blocks = x.reshape(n, -1, *x.shape[1:])
    if name == "right_permute":
        return np.concatenate([blocks[(d - 1) % n] for d in range(n)])
    if name == "all_gather":
        return np.concatenate([x] * n)
    if name == "jax_all_gather":
        return x
    return np.concatenate([blocks.sum(0)] * n)


def worker(impl: str, name: str, n: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas import tpu as pltpu
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    if impl == "jax":
        interpret = pltpu.InterpretParams()
    else:
        import palladium.interpret as pi

        interpret = pi.InterpretParams()
    mesh = jax.make_mesh((n,), ("x",), devices=jax.devices()[:n])
    shape = (n * n, 8, 128) if name == "reduce_scatter" else (n * 8, 128)
    x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape) % 97
    x = jax.device_put(x, NamedSharding(mesh, P("x")))
    if name == "jax_all_gather":
        # jax's shipped kernel: a bidirectional ring that reuses one receive semaphore
        # per direction at every step.
        from jax.experimental.pallas.ops.tpu import all_gather as shipped

        force = pltpu.force_tpu_interpret_mode if impl == "jax" else pi.force_tpu_interpret_mode

        def f(x):
            with force(interpret):
                return shipped.all_gather(x, mesh=mesh, axis_name="x")
    else:
        fn = functools.partial(_kernels()[name], n=n, interpret=interpret)
        f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                  check_vma=False))
    t0 = time.perf_counter()
    out = np.asarray(f(x))
    first = time.perf_counter() - t0
    correct = bool(np.array_equal(out, _reference(name, x, n)))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    return {"first": first, "steady": statistics.median(times), "correct": correct}


# --- the driver ---------------------------------------------------------------------------


def measure(impl: str, name: str, n: int, repeats: int, timeout: float) -> dict | None:
    """One measurement in a subprocess with n+1 host devices; None on timeout."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n + 1}"
    cmd = [sys.executable, __file__, "--worker", impl, name, str(n), str(repeats)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:120]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _fmt(r: dict | None, key: str, timeout: float) -> str:
    if r is None:
        return f"> {timeout:g} s (timeout)"
    if "error" in r:
        return f"error: {r['error']}"
    flag = "" if r["correct"] else " (WRONG)"
    return f"{r[key] * 1e3:.1f} ms{flag}"


def _ratio(jax_r: dict | None, pal_r: dict | None, key: str, timeout: float) -> str:
    if pal_r is None or "error" in pal_r:
        return "-"
    if jax_r is None:
        return f"> {timeout / pal_r[key]:.0f}x"
    if "error" in jax_r:
        return "-"
    return f"{jax_r[key] / pal_r[key]:.1f}x"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--worker", nargs=4, metavar=("IMPL", "NAME", "N", "REPEATS"))
    args = parser.parse_args(argv)
    if args.worker:
        impl, name, n, repeats = args.worker
        print(json.dumps(worker(impl, name, int(n), int(repeats))))
        return 0
    repeats = 3 if args.quick else 10
    compare_ns = (2, 4) if args.quick else (2, 4, 8)
    scale_ns = (2, 4, 8) if args.quick else (2, 4, 8, 16)
    print("### palladium vs jax's TPU interpret mode (mesh of N devices, N+1 host devices)")
    print()
    print("| collective | N | jax first | palladium first | ratio | jax steady | "
          "palladium steady | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    pal_results: dict[tuple[str, int], dict | None] = {}
    for name in COLLECTIVES:
        for n in compare_ns:
            pal = measure("palladium", name, n, repeats, args.timeout)
            pal_results[(name, n)] = pal
            jx = measure("jax", name, n, max(1, repeats // 3), args.timeout)
            t = args.timeout
            print(f"| {name} | {n} | {_fmt(jx, 'first', t)} | {_fmt(pal, 'first', t)} | "
                  f"{_ratio(jx, pal, 'first', t)} | {_fmt(jx, 'steady', t)} | "
                  f"{_fmt(pal, 'steady', t)} | {_ratio(jx, pal, 'steady', t)} |", flush=True)
    print()
    print("### palladium steady-state time vs device count")
    print()
    print("| collective | " + " | ".join(f"N={n}" for n in scale_ns) + " |")
    print("|---|" + "---|" * len(scale_ns))
    for name in COLLECTIVES:
        cells = []
        for n in scale_ns:
            r = pal_results.get((name, n)) or measure("palladium", name, n, repeats, args.timeout)
            cells.append(_fmt(r, "steady", args.timeout))
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
