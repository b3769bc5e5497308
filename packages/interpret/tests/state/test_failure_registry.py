"""``errors_as_raised`` re-raises the launch's own exception, found by the failure id
its message carries (not by matching text); the registry keeps only what re-raising
needs (not the failed launch's simulation or operands); ``RendezvousTimeoutError`` of a
multi-device launch comes out typed too."""

import gc
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from palladium.interpret import (
    DataRaceError,
    InterpretParams,
    OutOfBoundsError,
    RendezvousTimeoutError,
    errors_as_raised,
)
from palladium.interpret.hook import jax_hook
from palladium.race_detect import RaceReport


def _oob_call(rows, cols=128):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(rows - 4 + pl.program_id(0), 8), :]  # past the end

    return jax.jit(pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, cols), jnp.float32), grid=(1,),
        in_specs=[pl.BlockSpec((rows, cols), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((8, cols), lambda i: (0, 0)), interpret=InterpretParams()))


class _Tagged(Exception):
    def __init__(self, message, tag):
        super().__init__(message)
        self.tag = tag


def _failing_recorder_call(tag):
    def recorder(point, core):
        raise _Tagged("recorder refused", tag)

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          grid=(1,), interpret=InterpretParams(grid_point_recorder=recorder))


def test_failures_with_the_same_text_are_told_apart_by_id():
    x = jnp.ones((8, 128), jnp.float32)
    wrappers = []
    for tag in ("first", "second"):
        with pytest.raises(jax.errors.JaxRuntimeError) as info:
            np.asarray(jax.jit(_failing_recorder_call(tag))(x))  # JaxRuntimeError in jit
        wrappers.append(info.value)
    assert all("_Tagged (a kernel's failure inside jax.jit" in str(w) for w in wrappers)
    assert all("): recorder refused\n" in str(w) for w in wrappers)
    assert all("[palladium failure #" in str(w) for w in wrappers)
    # Claim the older one first: text matching would have picked the newer.
    for wrapper, tag in zip(wrappers, ("first", "second")):
        with pytest.raises(_Tagged) as info, errors_as_raised():
            raise wrapper
        assert info.value.tag == tag
        assert str(info.value) == "recorder refused"  # the id tag is not in the original
        assert info.value.__cause__ is wrapper
    with pytest.raises(jax.errors.JaxRuntimeError), errors_as_raised():
        raise wrappers[0]  # claimed already: the wrapper itself


def test_reraised_exception_keeps_its_attributes_and_where_it_failed():
    x = jnp.ones((8, 128), jnp.float32)
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm, buf, sem)
        copy.start()
        o_ref[...] = buf[...]
        copy.wait()

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        interpret=InterpretParams(detect_races=True))
    with pytest.raises(DataRaceError) as info, errors_as_raised():
        jax.jit(call)(x)
    assert isinstance(info.value.report, RaceReport)
    assert "buf" in str(info.value) and "[palladium failure" not in str(info.value)
    assert any(f.name == "execute_devices" for f in info.value.launch_traceback)


def test_a_failed_launch_does_not_keep_its_simulation_alive():
    rows = 8192  # a 4 MiB input, copied into the simulated VMEM block
    call, x = _oob_call(rows), jnp.ones((rows, 128), jnp.float32)
    with pytest.raises(jax.errors.JaxRuntimeError):
        np.asarray(call(x))  # compile, warm every cache
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(8):
            with pytest.raises(jax.errors.JaxRuntimeError, match="OutOfBoundsError"):
                np.asarray(call(x))
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(jax_hook._FAILURES) >= 8
    assert kept < 4 * 2**20, f"{kept / 2**20:.1f} MiB kept by 8 failed launches"
    with pytest.raises(OutOfBoundsError, match="(?i)out-of-bounds read of 'x_ref'"), \
            errors_as_raised():
        np.asarray(call(x))


@pytest.mark.timeout(60)
def test_rendezvous_timeout_comes_out_typed():
    n = 2
    mesh = jax.make_mesh((n,), ("x",), devices=jax.devices()[:n])

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    def per_device(x):
        call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=InterpretParams(rendezvous_timeout=0.5))
        # Device 1 skips the kernel: device 0 waits for it in vain.
        return jax.lax.cond(jax.lax.axis_index("x") == 0, call, lambda v: v, x)

    f = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    x = jax.device_put(jnp.ones((16, 128), jnp.float32), NamedSharding(mesh, P("x")))
    with pytest.raises(RendezvousTimeoutError, match=r"devices \[1\] never arrived"), \
            errors_as_raised():
        np.asarray(f(x))
    # A launch on both devices succeeds, and replaces the failed run's runtime tokens
    # (jax would otherwise re-raise its error at every later effects_barrier).
    both = jax.jit(jax.shard_map(
        lambda v: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(v.shape, v.dtype),
                                 interpret=InterpretParams())(v),
        mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
    np.testing.assert_array_equal(np.asarray(both(x)), 2 * np.ones((16, 128), np.float32))
    jax.effects_barrier()


def test_registry_is_bounded():
    from palladium.interpret.state.failures import FailureLog

    log = FailureLog(capacity=3)
    errors = [ValueError(f"e{i}") for i in range(5)]
    ids = [log.record(e) for e in errors]
    assert len(log) == 3
    assert log.claim(f"... [palladium failure #{ids[0]}]") is None  # forgotten
    assert str(errors[4]).startswith(  # what jax shows
        "ValueError (a kernel's failure inside jax.jit reaches Python as jax's "
        "JaxRuntimeError; see the last line): e4\n[palladium failure #")
    got = log.claim(f"x {errors[4]}")
    assert type(got) is ValueError and str(got) == "e4" and got is not errors[4]
