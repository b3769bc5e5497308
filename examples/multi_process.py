"""The collectives of ``collectives.py`` on a slice simulated by several processes.

Starts P processes on this machine, the way a ``jax.distributed`` program runs on P
hosts: each calls ``jax.distributed.initialize`` (coordinator on a free loopback port)
with D/P CPU devices, builds the same mesh over all D devices and runs the same
``shard_map``ped kernels with the same ``InterpretParams``. Palladium simulates each
process's devices in that process; remote DMAs and signals between processes travel
over direct TCP connections between the processes (made through jax's
coordination service). Every process checks its shards against numpy.

    python examples/multi_process.py --processes 2              # 8 devices, 2 processes
    python examples/multi_process.py --processes 4 --devices 16
    python examples/multi_process.py --processes 2 --devices 64 --kernels all_gather --repeats 3

``launch(...)`` (used by benchmarks/device_scaling.py) returns every process's report:
steady seconds per kernel (the median of ``repeats`` calls after the first), rounds and
messages of the last launch, seconds spent exchanging them, and whether it was right.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = ("right_permute", "all_gather", "all_reduce", "reduce_scatter", "jax_all_gather")
# "exchange": also time the transport alone (benchmarks/device_scaling.py)


def worker(
    process: int,
    processes: int,
    port: int,
    devices: int,
    kernels: list[str],
    repeats: int,
    check_memory: bool = True,
) -> dict:
    """One process: initialise jax.distributed, run and time each kernel, check it."""
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices // processes}"
    import jax

    if processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{port}", num_processes=processes, process_id=process
        )
    import functools

    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import palladium.interpret as pi
    from palladium.interpret.hook import multi_process
    sys.path.insert(0, HERE)
    import collectives

    params = pi.InterpretParams(watchdog_timeout=None, check_memory=check_memory)
    mesh = jax.make_mesh((devices,), ("x",), devices=jax.devices())
    spec = NamedSharding(mesh, P("x"))
    exchanges: list[multi_process.KvTransport] = []
    original_meet = multi_process.KvTransport.meet

    def meet(self, timeout, what=""):  # keep the launch's transport, for its counts
        exchanges.append(self)
        return original_meet(self, timeout, what)

    multi_process.KvTransport.meet = meet  # type: ignore[method-assign]
    report: dict = {"process": process, "kernels": {}}
    if "exchange" in kernels and processes > 1:
        report["exchange"] = _exchange_cost(multi_process, processes)
    for name in (k for k in kernels if k != "exchange"):
        base = "all_gather" if name == "jax_all_gather" else name
        x = np.asarray(collectives.inputs(base, devices))
        xs = jax.make_array_from_callback(x.shape, spec, lambda index, x=x: x[index])
        if name == "jax_all_gather":
            from jax.experimental.pallas.ops.tpu import all_gather as shipped

            @jax.jit
            def f(xs):
                with pi.force_tpu_interpret_mode(params):
                    return shipped.all_gather(xs, mesh=mesh, axis_name="x")

            expected = x
        else:
            f = jax.jit(
                jax.shard_map(
                    functools.partial(collectives.COLLECTIVES[name], n=devices, interpret=params),
                    mesh=mesh,
                    in_specs=P("x"),
                    out_specs=P("x"),
                    check_vma=False,
                )
            )
            expected = np.asarray(collectives.reference(name, x, devices))
        per = expected.shape[0] // devices
        times, cpu = [], []
        for _ in range(1 + repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            out = f(xs)
            out.block_until_ready()
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        right = all(
            np.array_equal(
                np.asarray(s.data),
                expected[s.index[0].start or 0 :][:per] if name != "jax_all_gather" else expected,
            )
            for s in out.addressable_shards
        )
        last = exchanges[-1] if exchanges else None
        report["kernels"][name] = {
            "first": times[0],
            "steady": statistics.median(times[1:]) if repeats else None,
            # CPU seconds of this process (all threads) in the steady calls: on a busy
            # machine a better measure of the work than wall time
            "steady_cpu": statistics.median(cpu[1:]) if repeats else None,
            "right": bool(right),
            "rounds": last.round if last else 0,
            "exchange_seconds": last.seconds if last else 0.0,
        }
    return report


def _exchange_cost(multi_process, processes: int, rounds: int = 200) -> dict:
    """Seconds per round of each transport alone (the direct connections, ``socket``,
    and the key-value store, ``kv``), with 1 and with 256 messages of 4 KiB (one
    (8, 128) float32 block each) posted by every process per round."""
    import pickle

    import numpy as np

    from palladium.interpret.state.process_state import STATE

    where = STATE.processes.current()
    out = {}
    for kind in ("socket", "kv"):
        cls = multi_process.SocketTransport if kind == "socket" else multi_process.KvTransport
        for count in (1, 256):
            # distinct arrays: pickle writes one array listed 256 times only once
            payload = pickle.dumps([np.full((8, 128), i, np.float32) for i in range(count)])
            transport = cls(where, where.launch_id(f"ping{kind}{count}"), "ping")
            transport.meet(60.0)
            transport.exchange(payload)  # (the first round of a run makes the connections)
            start = time.perf_counter()
            for _ in range(rounds):
                transport.exchange(payload)
            out[f"{kind}{count}"] = (time.perf_counter() - start) / rounds
    return out


def launch(
    processes: int,
    devices: int,
    kernels: list[str],
    repeats: int = 1,
    timeout: float = 1800.0,
    check_memory: bool = True,
) -> list[dict]:
    """Run ``worker`` in ``processes`` processes; every process's report."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    procs = []
    try:
        for p in range(processes):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        os.path.abspath(__file__),
                        "--worker",
                        str(p),
                        str(port),
                        "--processes",
                        str(processes),
                        "--devices",
                        str(devices),
                        "--repeats",
                        str(repeats),
                        *([] if check_memory else ["--no-check-memory"]),
                        "--kernels",
                        *kernels,
                    ],
                    env=env,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        outs = [proc.communicate(timeout=timeout)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    reports = []
    for p, (proc, out) in enumerate(zip(procs, outs)):
        if proc.returncode != 0:
            raise RuntimeError(f"process {p} failed (exit status {proc.returncode})")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument(
        "--kernels", nargs="+", default=list(KERNELS), choices=[*KERNELS, "exchange"]
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--no-check-memory",
        action="store_true",
        help="skip the TPU compiler's memory check (where libtpu is installed): a ring "
        "all-gather on 256 devices needs more semaphores than a TPU has",
    )
    parser.add_argument("--worker", nargs=2, type=int, metavar=("PROCESS", "PORT"))
    args = parser.parse_args(argv)
    if args.worker:
        process, port = args.worker
        report = worker(
            process,
            args.processes,
            port,
            args.devices,
            args.kernels,
            args.repeats,
            check_memory=not args.no_check_memory,
        )
        print(json.dumps(report), flush=True)
        if args.processes > 1:  # the coordinator (process 0) leaves last
            from palladium.interpret import _jax_compat

            client = _jax_compat.distributed_client()
            client.key_value_set(f"example/done/{process}", "1")
            if process == 0:
                for q in range(1, args.processes):
                    client.blocking_key_value_get(f"example/done/{q}", 600_000)
                # Let the service answer the last set before it goes: a process whose
                # RPC fails on a vanished coordinator is aborted by jax's client.
                time.sleep(1.0)
        os._exit(0)
    reports = launch(
        args.processes,
        args.devices,
        args.kernels,
        args.repeats,
        check_memory=not args.no_check_memory,
    )
    print(f"{args.devices} devices over {args.processes} processes:")
    for name in (k for k in args.kernels if k != "exchange"):
        rows = [r["kernels"][name] for r in reports]
        ok = all(r["right"] for r in rows)
        steady = max(r["steady"] for r in rows) if args.repeats else max(r["first"] for r in rows)
        print(
            f"  {name}: {'right' if ok else 'WRONG'}, {steady * 1e3:.1f} ms "
            f"({rows[0]['rounds']} rounds)"
        )
        if not ok:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
