"""The collectives of examples/collectives.py (remote DMAs, barrier semaphores) run by
palladium.interpret inside ``shard_map`` over N CPU devices, each compared with numpy:
every DMA mode, with and without race detection, 2 to 16 devices, repeated and looped
launches, and a kernel after a failed one."""

import functools
import os
import subprocess
import sys
import textwrap

import collectives
import jax
import numpy as np
import pytest
from collectives import (
    COLLECTIVES,
    all_gather,
    all_reduce,
    inputs,
    iota,
    mesh,
    reference,
    right_permute,
    run,
    sharded,
)
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from palladium.interpret import InterpretParams, OutOfBoundsError, errors_as_raised
from palladium.interpret.hook.jax_hook import in_flight_rendezvous

EXAMPLES = os.path.dirname(os.path.abspath(collectives.__file__))

@pytest.mark.parametrize("races", [False, True])
@pytest.mark.parametrize("mode", ["eager", "on_wait"])
@pytest.mark.parametrize("devices", [2, 4, 8])
@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_collective_matches_jnp(name, devices, mode, races):
    params = InterpretParams(dma_execution_mode=mode, detect_races=races)
    x = inputs(name, devices)
    out = run(functools.partial(COLLECTIVES[name], interpret=params), devices, x)
    np.testing.assert_array_equal(out, reference(name, x, devices))
    assert in_flight_rendezvous() == 0


@pytest.mark.parametrize("id_style", ["int", "dict"])
def test_device_id_as_int_and_dict(id_style):
    x = iota((32, 128))
    out = run(functools.partial(right_permute, interpret=InterpretParams(), id_style=id_style),
              4, x)
    np.testing.assert_array_equal(out, reference("right_permute", x, 4))


def test_mesh_using_every_host_device():
    n = len(jax.devices())
    x = inputs("all_gather", n)
    out = run(functools.partial(all_gather, interpret=InterpretParams()), n, x)
    np.testing.assert_array_equal(out, reference("all_gather", x, n))


def test_repeated_calls_are_bit_identical():
    params = InterpretParams(dma_execution_mode="on_wait", random_seed=3)
    m = mesh(4)
    f = jax.jit(jax.shard_map(functools.partial(all_reduce, n=4, interpret=params), mesh=m,
                              in_specs=P("x"), out_specs=P("x"), check_vma=False))
    x = sharded(jax.random.normal(jax.random.key(0), (32, 128)), m)
    first = np.asarray(f(x))
    for _ in range(99):
        np.testing.assert_array_equal(np.asarray(f(x)), first)
    assert in_flight_rendezvous() == 0


def test_race_free_collective_passes_the_dma_order_check():
    """The correct counterpart of the racy gather of
    packages/interpret/tests/hook/test_multi_device.py: random completion orders agree."""
    fine = InterpretParams(dma_order="random", dma_order_trials=3)
    out = run(functools.partial(all_gather, interpret=fine), 4, inputs("all_gather", 4))
    np.testing.assert_array_equal(out, reference("all_gather", inputs("all_gather", 4), 4))


def test_exception_on_one_device_fails_all_and_next_kernel_runs():
    def kernel(x_ref, o_ref):
        me = jax.lax.axis_index("x")
        # only device 2 reads out of bounds
        o_ref[...] = x_ref[pl.ds(me * 4, 8), :]

    def f(x, n):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=InterpretParams())(x)

    with pytest.raises(OutOfBoundsError) as info, errors_as_raised():
        run(f, 4, iota((32, 128)))
    assert "device 2" in str(info.value) and "x_ref" in str(info.value)
    assert in_flight_rendezvous() == 0
    x = inputs("all_gather", 4)
    out = run(functools.partial(all_gather, interpret=InterpretParams()), 4, x)
    np.testing.assert_array_equal(out, reference("all_gather", x, 4))


_SIXTEEN = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=16"
    import functools, sys
    import numpy as np
    import jax
    sys.path.insert(0, {examples!r})
    import collectives as c
    from palladium.interpret import InterpretParams
    for name in ("right_permute", "all_gather", "all_reduce"):
        x = c.inputs(name, 16)
        out = c.run(functools.partial(c.COLLECTIVES[name], interpret=InterpretParams(detect_races=True)), 16, x)
        np.testing.assert_array_equal(out, c.reference(name, x, 16))
    print("ok", len(jax.devices()))
""")


def test_sixteen_devices_in_a_subprocess():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, "-c", _SIXTEEN.format(examples=EXAMPLES)], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok 16")


def test_launches_in_a_loop_and_random_dma_order_with_races():
    """One lowered kernel launched 3 times inside a fori_loop: the k-th call of every
    device meets the k-th of the others; random completion orders find no race."""
    params = InterpretParams(dma_order="random", detect_races=True, random_seed=7)

    def f(x, n):
        return jax.lax.fori_loop(0, 3, lambda i, y: right_permute(y, n=n, interpret=params), x)

    x = iota((32, 128))
    out = run(f, 4, x)
    blocks = np.asarray(x).reshape(4, 8, 128)
    np.testing.assert_array_equal(out, np.concatenate([blocks[(d - 3) % 4] for d in range(4)]))
    assert in_flight_rendezvous() == 0


def test_eager_shard_map():
    m = mesh(4)
    x = inputs("all_gather", 4)
    f = jax.shard_map(functools.partial(all_gather, n=4, interpret=InterpretParams()), mesh=m,
                      in_specs=P("x"), out_specs=P("x"), check_vma=False)
    np.testing.assert_array_equal(f(sharded(x, m)), reference("all_gather", x, 4))
