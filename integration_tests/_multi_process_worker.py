"""One process of a multi-process test run (``test_multi_process.py`` starts them).

    python _multi_process_worker.py SCENARIO PROCESS PROCESSES PORT DEVICES OUT_DIR

PROCESSES == 1: no ``jax.distributed`` (the one-process reference run). Else process
PROCESS of PROCESSES, coordinator on 127.0.0.1:PORT, each with DEVICES/PROCESSES CPU
devices. Writes ``OUT_DIR/<PROCESS>.json`` ({"outputs": {name: [[position, path]]},
"errors": {name: [type, message]}, "seconds": {name: s}}) and the local shards as
``.npy`` files, then leaves with ``os._exit`` (no distributed shutdown barrier: a test
may have killed a peer).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import time

SCENARIO, PROCESS, PROCESSES, PORT, DEVICES, OUT = sys.argv[1:7]
PROCESS, PROCESSES, DEVICES = int(PROCESS), int(PROCESSES), int(DEVICES)
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES // PROCESSES}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

if PROCESSES > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{PORT}", num_processes=PROCESSES, process_id=PROCESS
    )

import numpy as np  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import palladium.interpret as pi  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "examples"))
import collectives  # noqa: E402

PARAMS = pi.InterpretParams(rendezvous_timeout=30.0, watchdog_timeout=60.0)
MESH = jax.make_mesh((DEVICES,), ("x",), devices=jax.devices())
RESULT: dict = {"outputs": {}, "errors": {}, "seconds": {}}


def global_array(x: np.ndarray) -> jax.Array:
    """``x`` split over the mesh's devices along its first axis (this process's part)."""
    return jax.make_array_from_callback(
        x.shape, NamedSharding(MESH, P("x")), lambda index: x[index]
    )


def shard_mapped(fn):
    return jax.jit(jax.shard_map(fn, mesh=MESH, in_specs=P("x"), out_specs=P("x"), check_vma=False))


def record(name: str, call) -> None:
    """Run ``call()``; save this process's shards of its result, or its error."""
    start = time.perf_counter()
    try:
        with pi.errors_as_raised():
            out = call()
            out.block_until_ready()
    except Exception as e:  # noqa: BLE001 - the test checks type and message
        RESULT["errors"][name] = [type(e).__name__, str(e)]
        RESULT["seconds"][name] = time.perf_counter() - start
        return
    RESULT["seconds"][name] = time.perf_counter() - start
    shards = []
    for shard in out.addressable_shards:
        first = shard.index[0].start or 0
        path = os.path.join(OUT, f"{name}-{PROCESS}-{first}.npy")
        np.save(path, np.asarray(shard.data))
        shards.append([first, path])
    RESULT["outputs"][name] = shards


def collectives_scenario() -> None:
    for name, fn in collectives.COLLECTIVES.items():
        x = np.asarray(collectives.inputs(name, DEVICES))
        f = shard_mapped(functools.partial(fn, n=DEVICES, interpret=PARAMS))
        record(name, lambda f=f, x=x: f(global_array(x)))
    from jax.experimental.pallas.ops.tpu import all_gather as shipped

    x = np.asarray(collectives.inputs("all_gather", DEVICES))

    def jax_all_gather():
        with pi.force_tpu_interpret_mode(PARAMS):
            return shipped.all_gather(global_array(x), mesh=MESH, axis_name="x")

    record("jax_all_gather", jax_all_gather)


def _deadlock_kernel(x_ref, o_ref, sem):
    """Each device signals its right neighbour once, then waits for 2: all block."""
    me = jax.lax.axis_index("x")
    pl.semaphore_signal(
        sem, 1, device_id=((me + 1) % DEVICES,), device_id_type=pl.DeviceIdType.MESH
    )
    pl.semaphore_wait(sem, 2)
    o_ref[...] = x_ref[...]


def deadlock_scenario() -> None:
    def fn(x):
        return pl.pallas_call(
            _deadlock_kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.SemaphoreType.REGULAR],
            interpret=PARAMS,
        )(x)

    x = np.asarray(collectives.inputs("right_permute", DEVICES))
    record("deadlock", lambda: shard_mapped(fn)(global_array(x)))


def _all_gather_then_die(victim: int, before_dying=None):
    """A warm-up all-gather, then process ``victim`` kills itself (SIGKILL) in round 2 of
    the next launch's exchanges (after ``before_dying()``); that launch."""
    def die(transport) -> None:
        if before_dying is not None:
            before_dying()
        os.kill(os.getpid(), signal.SIGKILL)

    return _warm_up_then(victim, die)


def killed_scenario() -> None:
    """Process 1 dies in the second launch; the others must fail with PeerProcessError."""
    record("killed", _all_gather_then_die(1))


def coordinator_killed_scenario() -> None:
    """As ``killed``, but process 0 (the coordinator) kills itself."""

    def note_the_time():
        with open(os.path.join(OUT, "killed_at"), "w") as out:
            out.write(repr(time.time()))

    launch = _all_gather_then_die(0, note_the_time)
    start = time.perf_counter()
    record("killed", launch)
    # Reached only if jax's client did not end this process first.
    with open(os.path.join(OUT, f"{PROCESS}.json"), "w") as out:
        json.dump(dict(RESULT, ended=time.perf_counter() - start), out)
    os._exit(0)


def partial_scenario() -> None:
    """A warm-up launch, then only process 0 runs the second launch."""
    x = np.asarray(collectives.inputs("right_permute", DEVICES))
    params = pi.InterpretParams(rendezvous_timeout=4.0)
    f = shard_mapped(functools.partial(collectives.right_permute, n=DEVICES, interpret=params))
    record("warm_up", lambda: f(global_array(x)))
    if PROCESS == 0:
        record("partial", lambda: f(global_array(x)))
    else:
        time.sleep(10)  # alive (heartbeat going) but never reaching the launch


def _racy_kernel(x_ref, o_ref, local_sem, send, recv):
    """Each device copies its block into its own output while its left neighbour's
    remote DMA writes the same output, unordered: a write-write race on every device."""
    me = jax.lax.axis_index("x")
    remote = pltpu.make_async_remote_copy(
        x_ref,
        o_ref,
        send,
        recv,
        device_id=((me + 1) % DEVICES,),
        device_id_type=pl.DeviceIdType.MESH,
    )
    local = pltpu.make_async_copy(x_ref, o_ref, local_sem)
    remote.start()
    local.start()
    local.wait()
    remote.wait()


def race_scenario() -> None:
    """The racy kernel twice with races collected: each process's reports."""
    params = pi.InterpretParams(detect_races=True, on_race="collect", rendezvous_timeout=30.0)
    any_spec = pl.BlockSpec(memory_space=pl.ANY)

    def fn(x):
        return pl.pallas_call(
            _racy_kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[any_spec],
            out_specs=any_spec,
            scratch_shapes=[pltpu.SemaphoreType.DMA] * 3,
            interpret=params,
        )(x)

    x = np.asarray(collectives.inputs("right_permute", DEVICES))
    f = shard_mapped(fn)
    RESULT["races"] = []
    for k in range(2):
        with pi.collect_race_reports() as reports:
            record(f"race{k}", lambda: f(global_array(x)))
        RESULT["races"].append([str(r) for r in reports])
    # Race-free collectives (remote DMAs, signals, the initial barrier): no report.
    for name in ("all_gather", "all_reduce", "reduce_scatter"):
        xs = np.asarray(collectives.inputs(name, DEVICES))
        g = shard_mapped(
            functools.partial(collectives.COLLECTIVES[name], n=DEVICES, interpret=params)
        )
        with pi.collect_race_reports() as reports:
            record(name, lambda g=g, xs=xs: g(global_array(xs)))
        RESULT["races"].append([str(r) for r in reports])


def remote_reads_scenario() -> None:
    """Remote DMAs the Pallas API cannot express (``make_async_remote_copy`` writes
    remote memory; it never reads it nor adds into it), run on palladium's
    ``Simulation`` over this run's key-value store: device d reads device d+1's ``x``
    into its ``out``, adds its ``x`` into device d+1's ``acc``, and copies half of
    device d+2's ``x`` into device d+1's ``fwd``. Race-free, race detection on."""
    from palladium.interpret.hook.multi_process import KvTransport
    from palladium.interpret.state.process_state import STATE
    from palladium.shared_memory import MemorySpace, Partition, SemaphoreKind, Simulation

    per = DEVICES // PROCESSES
    local = range(PROCESS * per, (PROCESS + 1) * per)
    partition = None
    if PROCESSES > 1:
        layout = STATE.processes.current()
        assert layout is not None
        transport = KvTransport(layout, "test/remote_reads", "remote reads")
        transport.meet(30.0)
        partition = Partition(frozenset(local), transport)
    sim = Simulation(DEVICES, 1, seed=7, detect_races=True, on_race="raise",
                     uninitialized_reads="warn", partition=partition)
    rows = np.arange(DEVICES * 256, dtype=np.float32).reshape(DEVICES, 16, 16) / 7
    bufs: dict[str, list] = {"out": [], "acc": [], "fwd": []}
    xs = [sim.allocate(MemorySpace.HBM, d, 0, name="x", value=rows[d]) for d in range(DEVICES)]
    for d in range(DEVICES):
        bufs["out"].append(sim.allocate(MemorySpace.HBM, d, 0, name="out", shape=(16, 16),
                                        dtype=np.float32))
        bufs["acc"].append(sim.allocate(MemorySpace.HBM, d, 0, name="acc",
                                        value=np.full((16, 16), 0.1 * (d + 1), np.float32)))
        bufs["fwd"].append(sim.allocate(MemorySpace.HBM, d, 0, name="fwd", shape=(16, 16),
                                        dtype=np.float32))
    sems = [sim.allocate_semaphores(d, 0, kind=SemaphoreKind.DMA, name="s", shape=(5,))
            for d in range(DEVICES)]
    nbytes = 16 * 16 * 4

    def body(d: int):
        def run() -> None:
            core, right, right2 = (d, 0), (d + 1) % DEVICES, (d + 2) % DEVICES
            s = [int(i) for i in sems[d]]
            sim.barrier(core)
            sim.dma_start(xs[right], None, bufs["out"][d], None, core=core, dst_sem=s[0])
            sim.dma_start(xs[d], None, bufs["acc"][right], None, core=core,
                          dst_core=(right, 0), dst_sem=s[1], src_sem=s[2], add=True)
            sim.dma_start(xs[right2], (slice(0, 8),), bufs["fwd"][right], (slice(8, 16),),
                          core=core, dst_core=(right, 0), dst_sem=s[3], src_sem=s[4])
            for sem, n in ((0, nbytes), (2, nbytes), (1, nbytes), (4, nbytes // 2),
                           (3, nbytes // 2)):
                sim.dma_wait(s[sem], n, core=core)

        return run

    start = time.perf_counter()
    try:
        sim.run({(d, 0): body(d) for d in local})
    except Exception as e:  # noqa: BLE001 - the test checks type and message
        RESULT["errors"]["remote_reads"] = [type(e).__name__, str(e)]
        return
    RESULT["seconds"]["remote_reads"] = time.perf_counter() - start
    for name, refs in bufs.items():
        shards = []
        for d in local:
            path = os.path.join(OUT, f"{name}-{PROCESS}-{d}.npy")
            np.save(path, sim.value(refs[d])[None])
            shards.append([d, path])
        RESULT["outputs"][name] = shards


def _order_kernel(x_ref, o_ref, zeros, sem1, sem2):
    """Two local DMAs into the same output, unordered: the result depends on which
    completes last."""
    zeros[...] = jax.numpy.zeros(zeros.shape, zeros.dtype)
    first = pltpu.make_async_copy(x_ref, o_ref, sem1)
    second = pltpu.make_async_copy(zeros, o_ref, sem2)
    first.start()
    second.start()
    first.wait()
    second.wait()


def order_trials_scenario() -> None:
    """``dma_order_trials`` on a split launch: a race-free ring all-gather passes (and
    is right), an order-dependent kernel is a DmaOrderDependenceError on every process."""
    params = pi.InterpretParams(dma_order="random", dma_order_trials=3, rendezvous_timeout=30.0)
    x = np.asarray(collectives.inputs("all_gather", DEVICES))
    f = shard_mapped(functools.partial(collectives.all_gather, n=DEVICES, interpret=params))
    record("all_gather", lambda: f(global_array(x)))
    any_spec = pl.BlockSpec(memory_space=pl.ANY)

    def fn(x):
        return pl.pallas_call(
            _order_kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[any_spec],
            out_specs=any_spec,
            scratch_shapes=[pltpu.VMEM(x.shape, x.dtype)] + [pltpu.SemaphoreType.DMA] * 2,
            interpret=params,
        )(x)

    xs = np.asarray(collectives.inputs("right_permute", DEVICES))
    record("order", lambda: shard_mapped(fn)(global_array(xs)))


def _warm_up_then(process: int, at_round_2) -> object:
    """A warm-up all-gather (which makes the connections), then process ``process``
    calls ``at_round_2(transport)`` when its next launch starts round 2; that launch."""
    from palladium.interpret.hook import multi_process

    x = np.asarray(collectives.inputs("all_gather", DEVICES))
    f = shard_mapped(functools.partial(collectives.all_gather, n=DEVICES, interpret=PARAMS))
    record("warm_up", lambda: f(global_array(x)))
    if process == PROCESS:
        exchange = multi_process.KvTransport.exchange

        def patched(self, payload):
            if self.round == 2:
                at_round_2(self)
            return exchange(self, payload)

        multi_process.KvTransport.exchange = patched  # type: ignore[method-assign]
    return lambda: f(global_array(x))


def killed_mid_frame_scenario() -> None:
    """Process 1 dies halfway through sending a round's frame (64 MiB posted, what the
    socket took written), with its connections open: the others see them close."""
    from palladium.interpret.hook import peer_links

    def die_mid_frame(transport) -> None:
        peers = [q for q in range(PROCESSES) if q != PROCESS]
        transport.where.links.post(peers, peer_links.ROUND, transport.launch, 2, bytes(64 << 20))
        os.kill(os.getpid(), signal.SIGKILL)

    record("killed", _warm_up_then(1, die_mid_frame))


def failing_scenario() -> None:
    """Process 1 fails (an error of its own, it stays alive) in round 2 of a launch."""

    def fail(transport) -> None:
        raise RuntimeError("injected failure in process 1")

    record("failed", _warm_up_then(1, fail))


def sockets_scenario() -> None:
    """Three launches of two kernels: the transport each used, its rounds and the
    connections' ports after each launch (the same connections every time)."""
    from palladium.interpret.hook import multi_process

    used: list = []
    meet = multi_process.KvTransport.meet

    def keep(self, timeout, what=""):
        used.append(self)
        return meet(self, timeout, what)

    multi_process.KvTransport.meet = keep  # type: ignore[method-assign]
    RESULT["launches"] = []
    for name in ("all_gather", "right_permute", "all_gather"):
        x = np.asarray(collectives.inputs(name, DEVICES))
        f = shard_mapped(functools.partial(collectives.COLLECTIVES[name], n=DEVICES, interpret=PARAMS))
        record(f"{name}{len(RESULT['launches'])}", lambda f=f, x=x: f(global_array(x)))
        t = used[-1]
        ports = t.where.links.endpoints() if t.where.links is not None else {}
        RESULT["launches"].append([type(t).__name__, t.round, sorted(map(list, ports.items()))])


def _scan_kernel(x_ref, o_ref):
    """A loop of small operations: compiled as one segment on its first launch (and
    kept in palladium's disk cache)."""
    def step(t, h):
        h = 0.5 * h + jax.numpy.tanh(x_ref[pl.ds(t, 1), :])
        o_ref[pl.ds(t, 1), :] = h
        return h

    jax.lax.fori_loop(0, x_ref.shape[0], step, jax.numpy.zeros((1, x_ref.shape[1]),
                                                               jax.numpy.float32))


def _scan(x):
    return pl.pallas_call(_scan_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=PARAMS)(x)


def warm_cache_scenario() -> None:
    """A kernel with a compiled segment, on this process's own device and split over
    the processes (run twice with one cache folder: the second run loads the segment's
    executable from disk). Segments only: no launch compiled whole (its compile would
    be counted too)."""
    from palladium.interpret.compiled import compiled_launch

    compiled_launch.MIN_EQUATIONS_PER_LAUNCH = 1 << 60
    x = np.linspace(-2, 2, DEVICES * 64 * 128, dtype=np.float32).reshape(DEVICES * 64, 128)
    local = jax.local_devices()[0]
    record("local", lambda: jax.jit(_scan)(jax.device_put(x[:64], local)))
    record("split", lambda: shard_mapped(_scan)(global_array(x)))
    RESULT["compiled"] = pi.STATE.segments.compiled


def dies_early_scenario() -> None:
    """Process 1 is killed before its first launch (palladium imported: its heartbeat
    runs); process 0 launches."""
    if PROCESS == 1:
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    x = np.asarray(collectives.inputs("right_permute", DEVICES))
    f = shard_mapped(functools.partial(collectives.right_permute, n=DEVICES, interpret=PARAMS))
    record("first", lambda: f(global_array(x)))


def _permute(seed: int):
    params = pi.InterpretParams(rendezvous_timeout=30.0, random_seed=seed)
    return shard_mapped(functools.partial(collectives.right_permute, n=DEVICES,
                                          interpret=params))


def mismatch_scenario() -> None:
    """A launch agreed on, then process 1 launches the same kernel with another
    random_seed, then another kernel of the same name ('kernel'), then a kernel of
    another name than process 0's."""
    x = np.asarray(collectives.inputs("right_permute", DEVICES))
    record("agreed", lambda: _permute(0)(global_array(x)))
    record("seed", lambda: _permute(PROCESS)(global_array(x)))
    xs = np.asarray(collectives.inputs("all_gather", DEVICES))
    gather = shard_mapped(functools.partial(collectives.all_gather, n=DEVICES, interpret=PARAMS))
    if PROCESS == 0:
        record("same_name", lambda: _permute(0)(global_array(x)))
        record("other_name", lambda: _permute(0)(global_array(x)))
    else:
        record("same_name", lambda: gather(global_array(xs)))
        xf = np.linspace(-2, 2, DEVICES * 64 * 128, dtype=np.float32).reshape(-1, 128)
        record("other_name", lambda: shard_mapped(_scan)(global_array(xf)))


def main() -> None:
    {
        "collectives": collectives_scenario,
        "deadlock": deadlock_scenario,
        "killed": killed_scenario,
        "coordinator_killed": coordinator_killed_scenario,
        "partial": partial_scenario,
        "race": race_scenario,
        "remote_reads": remote_reads_scenario,
        "order_trials": order_trials_scenario,
        "killed_mid_frame": killed_mid_frame_scenario,
        "failing": failing_scenario,
        "sockets": sockets_scenario,
        "warm_cache": warm_cache_scenario,
        "dies_early": dies_early_scenario,
        "mismatch": mismatch_scenario,
    }[SCENARIO]()
    with open(os.path.join(OUT, f"{PROCESS}.json"), "w") as f:
        json.dump(RESULT, f)
    sys.stdout.flush()
    if PROCESSES > 1:  # the coordinator (process 0) leaves last: the others need it
        from palladium.interpret import _jax_compat

        client = _jax_compat.distributed_client()
        client.key_value_set(f"test/done/{PROCESS}", "1")
        if PROCESS == 0:
            for q in range(1, PROCESSES):
                if not (SCENARIO in ("killed", "killed_mid_frame", "dies_early") and q == 1):
                    client.blocking_key_value_get(f"test/done/{q}", 60_000)
            # Let the service answer the last set before it goes: a process whose RPC
            # fails on a vanished coordinator is aborted by jax's client.
            time.sleep(1.0)
    os._exit(0)


main()
