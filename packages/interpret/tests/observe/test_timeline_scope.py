"""A timeline (and any scoped launch observer) records the launches of the context that
opened it: its thread, or its asyncio task, never another thread's. Before, a timeline
open on thread A held thread B's launches too (the observer registry was process-wide).

A multi-device launch runs on XLA's own threads, which carry no caller context: it is
recorded by the open scopes when they all belong to one context (the usual program),
and by none, with a ``RuntimeWarning``, when several contexts have scopes open."""

import asyncio
import threading
import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import palladium.interpret as pi
from palladium.interpret import InterpretParams


def _kernel(name):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    kernel.__name__ = name
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          interpret=InterpretParams())


X = jnp.zeros((8, 128), jnp.float32)


def _run(call, n):
    for _ in range(n):
        jax.block_until_ready(call(X))


@pytest.mark.timeout(300)
def test_a_timeline_does_not_see_another_threads_launches():
    mine, theirs = _kernel("kernel_a"), _kernel("kernel_b")
    _run(mine, 1), _run(theirs, 1)  # compiled before the race
    both_running = threading.Barrier(2, timeout=60)
    b_done = threading.Event()
    errors = []

    def thread_b():
        try:
            both_running.wait()
            _run(theirs, 20)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        finally:
            b_done.set()

    b = threading.Thread(target=thread_b)
    b.start()
    with pi.timeline() as tl:
        both_running.wait()
        _run(mine, 5)
        assert b_done.wait(timeout=120)
    b.join(timeout=60)
    assert errors == []
    assert [r.kernel_name for r in tl.launches] == ["kernel_a"] * 5


@pytest.mark.timeout(300)
def test_concurrent_threads_each_record_their_own_launches():
    calls = {name: _kernel(name) for name in ("kernel_a", "kernel_b", "kernel_c")}
    for call in calls.values():
        _run(call, 1)
    start = threading.Barrier(len(calls), timeout=60)
    seen: dict[str, list[str]] = {}
    errors = []

    def worker(name, n):
        try:
            with pi.timeline() as tl:
                start.wait()
                _run(calls[name], n)
            seen[name] = [r.kernel_name for r in tl.launches]
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(name, 3 + i))
               for i, name in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert errors == []
    assert seen == {"kernel_a": ["kernel_a"] * 3, "kernel_b": ["kernel_b"] * 4,
                    "kernel_c": ["kernel_c"] * 5}


@pytest.mark.timeout(300)
def test_asyncio_tasks_each_record_their_own_launches():
    calls = {name: _kernel(name) for name in ("kernel_a", "kernel_b")}

    async def task(name, n):
        with pi.timeline() as tl:
            for _ in range(n):
                jax.block_until_ready(calls[name](X))
                await asyncio.sleep(0)  # the other task runs (and launches) here
        return [r.kernel_name for r in tl.launches]

    async def main():
        return await asyncio.gather(task("kernel_a", 3), task("kernel_b", 4))

    assert asyncio.run(main()) == [["kernel_a"] * 3, ["kernel_b"] * 4]


@pytest.mark.timeout(120)
def test_scoped_observers_nest_and_end_with_their_block():
    from palladium.interpret.observe.observers import scoped_launch_observer

    seen = []
    call = _kernel("kernel_a")
    with scoped_launch_observer(lambda info: seen.append(("outer", info.kernel_name))):
        with scoped_launch_observer(lambda info: seen.append(("inner", info.kernel_name))):
            _run(call, 1)
        _run(call, 1)
    _run(call, 1)
    assert seen == [("outer", "kernel_a"), ("inner", "kernel_a"), ("outer", "kernel_a")]


def _two_device_call():
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    x = jax.device_put(jnp.zeros((16, 128), jnp.float32), NamedSharding(mesh, P("x")))
    f = jax.jit(jax.shard_map(_kernel("sharded_kernel"), mesh=mesh, in_specs=P("x"),
                              out_specs=P("x"), check_vma=False))
    return lambda: jax.block_until_ready(f(x))


@pytest.mark.timeout(120)
def test_a_multi_device_launch_is_recorded_by_the_one_context_with_scopes():
    run = _two_device_call()
    with pi.timeline() as tl:
        run()
    assert [(r.kernel_name, r.num_devices) for r in tl.launches] == [("sharded_kernel", 2)]


@pytest.mark.timeout(120)
def test_a_multi_device_launch_with_scopes_in_two_contexts_is_recorded_by_none():
    run = _two_device_call()
    run()
    opened, release = threading.Event(), threading.Event()

    def other():
        with pi.timeline() as other_tl:
            opened.set()
            release.wait(timeout=60)
        assert other_tl.launches == []

    t = threading.Thread(target=other)
    t.start()
    try:
        assert opened.wait(timeout=60)
        with pi.timeline() as tl, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
    finally:
        release.set()
        t.join(timeout=60)
    assert tl.launches == []
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == [
        "palladium: kernel 'sharded_kernel' ran on XLA's threads (a multi-device launch) "
        "while launch observers (timelines, the pytest plugin) were open in 2 contexts "
        "(threads or tasks); it cannot be told whose launch it is, so none records it. "
        "Run multi-device launches from one thread at a time while recording."
    ]
