"""Every failure is a palladium exception naming the kernel, the operand, the grid point,
the core and the source line; a failed kernel leaves nothing behind."""

import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _launch_harness import blocked_call, out_of_bounds_block_call, revisit_call
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import (
    DataRaceError,
    DeadlockError,
    InterpretParams,
    KernelError,
    OutOfBoundsError,
    RevisitError,
    SemaphoreLeakError,
    UnsupportedPrimitiveError,
    errors_as_raised,
)

P = InterpretParams()
X = jnp.ones((16, 128), jnp.float32)


@pytest.fixture(autouse=True)
def _no_callback_log(caplog):
    # jax logs every failing host callback with its traceback; palladium filters that
    # record out for its own exceptions (the exception carries the message).
    with caplog.at_level(logging.DEBUG, logger="jax._src.callback"):
        yield
    assert [r for r in caplog.records if r.name == "jax._src.callback"] == []


def _dynamic_oob_call(params=P):
    def oob_kernel(start_ref, x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(start_ref[0], 8), :]

    return pl.pallas_call(
        oob_kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(2,),
            in_specs=[pl.BlockSpec((8, 128), lambda i, s: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, s: (0, 0)),
        ),
        interpret=params,
    )


def test_out_of_bounds_read_names_operand_kernel_grid_point_core_and_line():
    with pytest.raises(OutOfBoundsError) as info, errors_as_raised():
        _dynamic_oob_call()(jnp.array([4], jnp.int32), X)
    msg = str(info.value)
    for part in ("'x_ref'", "kernel 'oob_kernel'", "grid point (0,)", "core 0", "test_errors.py:"):
        assert part in msg, (part, msg)
    # The advice names the interpreter's own options, not the simulator's.
    assert "InterpretParams(out_of_bounds_reads='uninitialized')" in msg
    assert "buffer_bounds='padded'" in msg


def test_out_of_bounds_under_jit_is_wrapped_without_the_context_manager():
    f = jax.jit(_dynamic_oob_call())
    with pytest.raises(jax.errors.JaxRuntimeError, match="Out-of-bounds read of 'x_ref'"):
        f(jnp.array([4], jnp.int32), X)
    with pytest.raises(OutOfBoundsError), errors_as_raised():
        f(jnp.array([4], jnp.int32), X)


def test_out_of_bounds_reads_uninitialized_policy():
    # (the fill read out of bounds reaches the output: the test checks it is the fill)
    out = _dynamic_oob_call(InterpretParams(out_of_bounds_reads="uninitialized",
                                            uninitialized_reads="off"))(
        jnp.array([4], jnp.int32), jnp.ones((8, 128), jnp.float32)
    )
    np.testing.assert_array_equal(out[:4], 1.0)
    assert np.isnan(np.asarray(out[4:])).all()


def test_out_of_bounds_block_index_names_the_input():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    f = out_of_bounds_block_call(kernel, P)
    with pytest.raises(OutOfBoundsError) as info, errors_as_raised():
        f(X)
    msg = str(info.value)
    assert "x_ref" in msg and "block (5, 0)" in msg and "kernel 'kernel'" in msg


def test_failing_kernel_then_a_good_one():
    with pytest.raises(OutOfBoundsError), errors_as_raised():
        _dynamic_oob_call()(jnp.array([12], jnp.int32), X)
    out = _dynamic_oob_call()(jnp.array([0], jnp.int32), X * 3)
    np.testing.assert_array_equal(out, 3.0)


def test_revisited_output_block():
    def revisit_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    f = revisit_call(revisit_kernel, P)
    with pytest.raises(RevisitError) as info, errors_as_raised():
        f(X)
    msg = str(info.value)
    assert "output 'o_ref'" in msg and "block (0, 0)" in msg
    assert "grid point (1, 0)" in msg and "(0, 0) through (0, 0)" in msg
    assert "kernel 'revisit_kernel'" in msg and "core 0" in msg and "test_errors.py:" in msg


def test_deadlock_names_semaphore_and_line():
    def deadlock_kernel(x_ref, o_ref, sem):
        pl.semaphore_wait(sem, 1)

    f = pl.pallas_call(
        deadlock_kernel,
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        scratch_shapes=[pltpu.SemaphoreType.REGULAR],
        interpret=P,
    )
    with pytest.raises(DeadlockError) as info, errors_as_raised():
        f(X)
    msg = str(info.value)
    assert "'sem'" in msg and "kernel 'deadlock_kernel'" in msg and "test_errors.py:" in msg
    assert "grid point ()" in msg and "core 0" in msg and "for 1, count 0" in msg


def test_semaphore_leak_at_exit():
    def leak_kernel(x_ref, o_ref, sems):
        pl.semaphore_signal(sems.at[1], 1)
        o_ref[...] = x_ref[...]

    f = pl.pallas_call(
        leak_kernel,
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        scratch_shapes=[pltpu.SemaphoreType.REGULAR((3,))],
        interpret=P,
    )
    with pytest.raises(SemaphoreLeakError, match="sems") as info, errors_as_raised():
        f(X)
    msg = str(info.value)
    for part in ("kernel 'leak_kernel'", "'sems[1]'", "core 0", "count 1", "test_errors.py:"):
        assert part in msg, (part, msg)


def test_semaphore_leak_at_the_end_of_run_scoped_names_the_grid_point_and_line():
    def scoped_leak(x_ref, o_ref):
        def body(sem):
            pl.semaphore_signal(sem, 2)

        pl.run_scoped(body, pltpu.SemaphoreType.REGULAR)
        o_ref[...] = x_ref[...]

    f = blocked_call(scoped_leak, rows=8, grid=(2,), in_map=lambda i: (0, 0),
                     out_map=lambda i: (0, 0), interpret=P)
    with pytest.raises(SemaphoreLeakError) as info, errors_as_raised():
        f(X[:8])
    msg = str(info.value)
    for part in ("kernel 'scoped_leak'", "grid point (0,)", "core 0", "'sem'", "count 2",
                 "end of their scope", "test_errors.py:"):
        assert part in msg, (part, msg)


def race_kernel(x_ref, o_hbm):
    pltpu.sync_copy(x_ref, o_hbm)


def _megacore_race_call(params):
    """Both halves of a parallel grid split over 2 cores copy the same block to HBM."""
    return pl.pallas_call(
        race_kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        grid=(2,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=params,
    )


def test_race_between_megacore_halves():
    f = _megacore_race_call(InterpretParams(num_cores_or_threads=2, detect_races=True))
    with pytest.raises(DataRaceError) as info, errors_as_raised():
        f(X[:8])
    msg = str(info.value)
    assert "o_hbm" in msg and "kernel 'race_kernel'" in msg and "core 1" in msg
    assert "grid point (0,)" in msg and "grid point (1,)" in msg and "core 0" in msg
    assert re.search(r"test_errors\.py:\d+", msg)


def test_race_collect_policy_still_returns_result():
    seen = []

    out = _megacore_race_call(
        InterpretParams(num_cores_or_threads=2, detect_races=True, on_race=seen.append))(X[:8])
    np.testing.assert_array_equal(out, 1.0)
    assert seen and "o_hbm" in str(seen[0])


def test_reading_hbm_directly_is_a_kernel_error():
    def hbm_kernel(x_hbm, o_ref):
        o_ref[...] = x_hbm[...]

    f = pl.pallas_call(
        hbm_kernel,
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        # Mosaic rejects it too ("Loads are only allowed on VMEM and SMEM references"):
        # the test is about the interpreter's own error, so the lowering check is off.
        interpret=InterpretParams(check_lowering=False),
    )
    with pytest.raises(KernelError, match="'x_hbm'.*HBM"), errors_as_raised():
        f(X)


def test_hbm_in_run_scoped_needs_permission():
    def kernel(x_ref, o_ref):
        def body(tmp, sem):
            pltpu.async_copy(x_ref, tmp, sem).wait()
            pltpu.async_copy(tmp, o_ref, sem).wait()

        pl.run_scoped(body, pltpu.HBM((16, 128), jnp.float32), pltpu.SemaphoreType.DMA)

    def call(params):
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            interpret=params,
        )(X * 2)

    with pytest.raises(KernelError, match="allow_hbm_allocation_in_run_scoped"), errors_as_raised():
        call(P)
    np.testing.assert_array_equal(call(InterpretParams(allow_hbm_allocation_in_run_scoped=True)), 2.0)


def test_parallel_dimensions_must_be_a_prefix():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    f = blocked_call(kernel, rows=16, grid=(2, 1), in_map=lambda i, j: (i, 0),
                     out_map=lambda i, j: (i, 0), semantics=("arbitrary", "parallel"),
                     interpret=P)
    with pytest.raises(KernelError, match="prefix"), errors_as_raised():
        f(X)


def test_primitive_without_rule_or_cpu_lowering():
    from jax.extend.core import Primitive

    opaque_p = Primitive("opaque_tpu_op")
    opaque_p.def_abstract_eval(lambda x: x)

    def kernel(x_ref, o_ref):
        o_ref[...] = opaque_p.bind(x_ref[...])

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32), interpret=P)
    with pytest.raises(UnsupportedPrimitiveError, match="opaque_tpu_op") as info, errors_as_raised():
        f(X)
    assert "register_interpret_rule" in str(info.value)
    assert re.search(r"test_errors\.py:\d+", str(info.value))


def test_race_collect_policy_keeps_reports_until_collected():
    from palladium.interpret import collected_race_reports

    collected_race_reports()

    out = _megacore_race_call(
        InterpretParams(num_cores_or_threads=2, detect_races=True, on_race="collect"))(X[:8])
    np.testing.assert_array_equal(out, 1.0)
    reports = collected_race_reports()
    assert reports and "o_hbm" in str(reports[0])
    assert collected_race_reports() == []


def test_a_race_is_a_simulation_error():
    # `except SimulationError` catches every fault of a simulated run, races included.
    from palladium.interpret import PalladiumError, SimulationError

    f = _megacore_race_call(InterpretParams(num_cores_or_threads=2, detect_races=True))
    with pytest.raises(SimulationError) as info, errors_as_raised():
        f(X[:8])
    assert isinstance(info.value, DataRaceError) and isinstance(info.value, PalladiumError)


def test_every_exception_palladium_exports_derives_from_one_base():
    import palladium.interpret
    import palladium.race_detect
    import palladium.shared_memory
    from palladium.interpret import ConfigError, PalladiumError

    for module in (palladium.race_detect, palladium.shared_memory, palladium.interpret):
        errors = [getattr(module, n) for n in module.__all__
                  if isinstance(getattr(module, n), type)
                  and issubclass(getattr(module, n), BaseException)
                  and not issubclass(getattr(module, n), Warning)]
        assert errors, module
        for error in errors:
            assert issubclass(error, PalladiumError), (module.__name__, error)
    with pytest.raises(ConfigError, match="dma_execution_mode"):
        InterpretParams(dma_execution_mode="later")
    with pytest.raises(ValueError, match="uninitialized_memory"):  # still a ValueError
        InterpretParams(uninitialized_memory="garbage")
