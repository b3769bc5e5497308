"""Multi-device kernels: ``pallas_call`` / ``core_map`` inside ``shard_map`` over N CPU
devices, simulated together in one palladium simulation (remote DMAs, remote semaphore
signals, barrier semaphores, the initial barrier), each compared with a jnp reference,
and the errors such kernels raise. The collectives' correctness over every DMA mode and
device count is tested with examples/collectives.py in integration_tests/test_collectives.py."""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _multi_device_harness import mesh as harness_mesh
from _multi_device_harness import remote_copy_on_2x2, run_on_devices, sharded
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import (
    DataRaceError,
    DeadlockError,
    DmaOrderDependenceError,
    InterpretParams,
    KernelError,
    RendezvousTimeoutError,
    errors_as_raised,
    force_tpu_interpret_mode,
)
from palladium.interpret.hook.jax_hook import in_flight_rendezvous
from palladium.interpret.state.rendezvous import RendezvousRegistry

MESH_ID = pl.DeviceIdType.MESH
ANY = pl.BlockSpec(memory_space=pl.ANY)


_run = run_on_devices


def _iota(shape):
    return jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)


def test_two_axis_mesh_mesh_ids_and_axis_index():
    """A 2x2 mesh: MESH ids are (row, col) coordinates; send to the transposed device."""
    x, out = remote_copy_on_2x2(
        lambda: (jax.lax.axis_index("b"), jax.lax.axis_index("a")), MESH_ID,
        InterpretParams(detect_races=True))
    blocks = np.asarray(x).reshape(2, 8, 2, 128)
    np.testing.assert_array_equal(out.reshape(2, 8, 2, 128), blocks.transpose(2, 1, 0, 3))


# --- errors -----------------------------------------------------------------------------


def _racy_gather(x, *, n, params):
    """Both neighbours write their block into the SAME slot of my output: which one
    lands last depends on DMA completion order."""

    def kernel(x_ref, o_ref, send_sems, recv_sem):
        me = jax.lax.axis_index("x")
        for k, neighbour in enumerate((jax.lax.rem(me + 1, n), jax.lax.rem(me - 1 + n, n))):
            pltpu.make_async_remote_copy(x_ref, o_ref, send_sems.at[k], recv_sem,
                                         device_id=(neighbour,),
                                         device_id_type=MESH_ID).start()
        for k in range(2):
            pltpu.make_async_remote_copy(x_ref, o_ref, send_sems.at[k], recv_sem,
                                         device_id=(0,), device_id_type=MESH_ID).wait_send()
            pltpu.make_async_remote_copy(x_ref, o_ref, send_sems.at[k], recv_sem,
                                         device_id=(0,), device_id_type=MESH_ID).wait_recv()

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA],
        interpret=params,
    )(x)


def test_racy_collective_is_reported_as_a_data_race():
    x = _iota((32, 128))
    with pytest.raises(DataRaceError) as info, errors_as_raised():
        _run(functools.partial(_racy_gather, params=InterpretParams(detect_races=True)), 4, x)
    text = str(info.value)
    assert "x_ref->o_ref" in text and "o_ref (HBM, device" in text
    assert "test_multi_device.py" in text
    assert in_flight_rendezvous() == 0


def test_racy_collective_is_reported_as_dma_order_dependence():
    x = _iota((32, 128))
    params = InterpretParams(dma_order="random", dma_order_trials=6)
    with pytest.raises(DmaOrderDependenceError) as info, errors_as_raised():
        _run(functools.partial(_racy_gather, params=params), 4, x)
    text = str(info.value)
    assert "depends on the order in which DMAs complete" in text
    assert "output 'o_ref' on device" in text
    assert "data race on" in text and "x_ref->o_ref" in text and "test_multi_device.py" in text
    # The race-free counterpart passes the same check: integration_tests/test_collectives.py.


def test_cross_device_deadlock_lists_every_core():
    def kernel(x_ref, o_ref, sem):
        me = jax.lax.axis_index("x")
        # device 0 never signals: everyone waits for a signal from the left
        @pl.when(me != 0)
        def _():
            pl.semaphore_signal(sem, 1, device_id=(jax.lax.rem(me + 1, 4),),
                                device_id_type=MESH_ID)
        pl.semaphore_wait(sem, 1)
        pl.semaphore_wait(sem, 1)
        o_ref[...] = x_ref[...]

    def f(x, n):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              scratch_shapes=[pltpu.SemaphoreType.REGULAR],
                              interpret=InterpretParams())(x)

    with pytest.raises(DeadlockError) as info, errors_as_raised():
        _run(f, 4, _iota((32, 128)))
    text = str(info.value)
    for d in range(4):
        assert f"device {d} core 0 waits on semaphore" in text
    assert "test_multi_device.py" in text
    assert in_flight_rendezvous() == 0


def test_remote_target_outside_the_mesh_is_a_kernel_error():
    def f(x, n):
        def kernel(x_ref, o_ref, send, recv):
            copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=(n,),
                                                device_id_type=MESH_ID)
            copy.start()
            copy.wait()

        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), in_specs=[ANY],
            out_specs=ANY, scratch_shapes=[pltpu.SemaphoreType.DMA] * 2,
            # A constant device id is no communication to Mosaic, which then rejects
            # it; the test is about the interpreter's check of the coordinate.
            interpret=InterpretParams(check_lowering=False))(x)

    with pytest.raises(KernelError, match=r"coordinate 2 is outside mesh axis 'x' of size 2"), \
            errors_as_raised():
        _run(f, 2, _iota((16, 128)))


def test_rendezvous_times_out_when_a_device_never_arrives():
    registry = RendezvousRegistry()
    with pytest.raises(RendezvousTimeoutError, match=r"devices \[1, 2\] never arrived"):
        registry.join("launch", 3, 0, ["x"], lambda args: args, timeout=0.2,
                      describe=lambda: "kernel 'k' launch #0 on 3 devices")
    assert len(registry) == 0


@pytest.mark.timeout(60)
def test_rendezvous_deadline_runs_from_the_latest_arrival():
    """Devices arriving one by one, each within the timeout of the one before, meet
    (2.4 s in all against a 1 s timeout); a device that then never comes times out 1 s
    after the latest arrival, not 1 s after the first."""
    import threading
    import time

    registry = RendezvousRegistry()
    results: dict[int, object] = {}

    def device(d):
        time.sleep(0.6 * d)
        results[d] = registry.join("slow", 5, d, d, lambda args: [sum(args)] * 5,
                                   timeout=1.0, describe=lambda: "kernel 'k' launch #0")

    threads = [threading.Thread(target=device, args=(d,)) for d in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == dict.fromkeys(range(5), 10)

    def late(d):
        time.sleep(0.6 * d)
        try:
            registry.join("gap", 3, d, [d], lambda args: args, timeout=1.0,
                          describe=lambda: "kernel 'k' launch #1")
        except RendezvousTimeoutError as e:
            results[d] = (time.monotonic() - start, str(e))

    start = time.monotonic()
    threads = [threading.Thread(target=late, args=(d,)) for d in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (t0, message0), (t1, _) = results[0], results[1]
    assert 1.5 < t0 < 2.5 and 1.5 < t1 < 2.5  # 0.6 s (the second's arrival) + 1 s
    assert "waited 1 s after the latest arrival" in message0
    assert "devices [2] never arrived (arrived: [0, 1])" in message0
    assert len(registry) == 0


# --- megacore x multi-device ------------------------------------------------------------


@pytest.mark.parametrize("devices,cores", [(2, 2), (4, 2), (2, 4)])
def test_core_map_inside_shard_map(devices, cores):
    """Each core of each device sends its slice to the same core of the next device, and
    tells core 0 of that device by a remote signal naming both axes."""
    core_mesh = pltpu.create_tensorcore_mesh("core", num_cores=cores)

    def f(x, n):
        def body(refs):
            x_ref, o_ref = refs

            @pl.core_map(core_mesh, interpret=InterpretParams(detect_races=True))
            def _():
                c = jax.lax.axis_index("core")
                me = jax.lax.axis_index("x")
                right = jax.lax.rem(me + 1, n)

                def scoped(send, recv, done):
                    rows = pl.ds(c * 8, 8)
                    copy = pltpu.make_async_remote_copy(
                        x_ref.at[rows], o_ref.at[rows], send, recv, device_id=(right,),
                        device_id_type=MESH_ID)
                    copy.start()
                    copy.wait()
                    pl.semaphore_signal(done, 1, device_id={"x": right, "core": 0})

                    @pl.when(c == 0)
                    def _():
                        pl.semaphore_wait(done, cores)

                pl.run_scoped(scoped, pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA,
                              pltpu.SemaphoreType.REGULAR)

        _, out = pl.run_state(body)((x, jnp.zeros_like(x)))
        return out

    x = _iota((devices * cores * 8, 128))
    out = _run(f, devices, x)
    blocks = np.asarray(x).reshape(devices, -1, 128)
    np.testing.assert_array_equal(out, np.concatenate([blocks[(d - 1) % devices]
                                                       for d in range(devices)]))


# --- jax's shipped kernel and megacore x multi-device --------------------------------------------------

def test_jax_shipped_all_gather_kernel():
    from jax.experimental.pallas.ops.tpu import all_gather as jax_all_gather

    n = 4
    mesh = harness_mesh(n)
    x = _iota((n * 8, 128))
    with force_tpu_interpret_mode(InterpretParams(detect_races=True)):
        out = jax_all_gather.all_gather(sharded(x, mesh), mesh=mesh, axis_name="x")
    np.testing.assert_array_equal(out, x)


def test_megacore_pallas_call_inside_shard_map():
    """num_cores_or_threads=2: the parallel grid is split across 2 cores per device; each
    core sends its block to the same core of the next device (default target core)."""
    params = InterpretParams(num_cores_or_threads=2, detect_races=True)
    seen = []

    def f(x, n):
        def kernel(x_ref, o_ref, send, recv):
            i = pl.program_id(0)
            right = jax.lax.rem(jax.lax.axis_index("x") + 1, n)
            copy = pltpu.make_async_remote_copy(x_ref.at[i], o_ref.at[i], send, recv,
                                                device_id=(right,), device_id_type=MESH_ID)
            copy.start()
            copy.wait()

        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,),
            in_specs=[ANY], out_specs=ANY, scratch_shapes=[pltpu.SemaphoreType.DMA] * 2,
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
            interpret=dataclasses.replace(params, grid_point_recorder=lambda p, c: seen.append(c)),
        )(x)

    x = _iota((2 * 4, 8, 128))
    out = _run(f, 2, x)
    blocks = np.asarray(x).reshape(2, 4, 8, 128)
    np.testing.assert_array_equal(out.reshape(2, 4, 8, 128), blocks[::-1])
    assert sorted(seen) == [0] * 4 + [1] * 4  # 2 grid points per core on each device


def _two_device_deadlock(x, n):
    def waiting_kernel(x_ref, o_ref, sem):
        pl.semaphore_wait(sem, 1)  # nobody signals it
        o_ref[...] = x_ref[...]

    return pl.pallas_call(waiting_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          scratch_shapes=[pltpu.SemaphoreType.REGULAR],
                          interpret=InterpretParams())(x)


@pytest.mark.timeout(120)
def test_outside_errors_as_raised_the_wrapper_says_how_to_get_the_typed_exception():
    """jax turns a host callback's exception into its own ``JaxRuntimeError`` (jaxlib
    keeps only the text), so a 2-device deadlock cannot reach the caller as
    ``DeadlockError`` unless the caller asks: the message names the type and says how."""
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        _run(_two_device_deadlock, 2, _iota((16, 128)))
    text = str(info.value)
    assert re.search(
        r"DeadlockError: palladium\.interpret\.DeadlockError \(a kernel's failure inside "
        r"jax\.jit reaches Python as jax's JaxRuntimeError; see the last line\): deadlock: "
        r"every core is blocked.*\n\[palladium failure #\d+: palladium\.interpret\."
        r"errors_as_raised\(\) around the jitted call raises the palladium\.interpret\."
        r"DeadlockError itself\]$", text, re.S), text
    assert "scheduler.py" not in text and text.count("every core is blocked") == 1
    with pytest.raises(DeadlockError, match=r"^deadlock: every core is blocked") as typed, \
            errors_as_raised():
        _run(_two_device_deadlock, 2, _iota((16, 128)))
    assert "palladium failure" not in str(typed.value)
