"""``InterpretParams(uninitialized_reads=...)``: a read of memory nothing wrote, and an
output region nothing wrote by the end of the launch, reported with the kernel line,
grid point, core, operand and region; clean kernels (partial edge blocks, accumulators
initialised at the first step, DMAs of a partly written buffer, aliases) are silent.
Under races on and off, one and several cores, several devices, and the pipeline
emitter (the emitter's own tests: integration_tests/test_pipeline_under_interpret.py)."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _multi_device_harness import mesh, on_devices, sharded
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import (
    InterpretParams,
    UninitializedReadError,
    UninitializedReadWarning,
    errors_as_raised,
)

pytestmark = pytest.mark.timeout(120)

ANY = pl.BlockSpec(memory_space=pl.ANY)
F32 = jnp.float32
RACES = pytest.mark.parametrize("detect_races", [False, True], ids=["races-off", "races-on"])


def _params(mode="raise", **kw):
    return InterpretParams(uninitialized_reads=mode, **kw)


def _line(fn, offset):
    """``test_uninitialized_reads.py:N``: line ``offset`` of ``fn``'s body."""
    return f"test_uninitialized_reads.py:{fn.__code__.co_firstlineno + offset}"


def add_scratch(x_ref, o_ref, s):
    o_ref[...] = x_ref[...] + s[...]  # BUG: s was never written


def _add_scratch_call(mode, dtype=F32, **kw):
    return pl.pallas_call(
        add_scratch, out_shape=jax.ShapeDtypeStruct((8, 128), dtype),
        scratch_shapes=[pltpu.VMEM((8, 128), dtype)], interpret=_params(mode, **kw))


@RACES
def test_a_read_of_never_written_scratch_names_operand_region_line_grid_point_and_core(detect_races):
    with pytest.raises(UninitializedReadError) as e, errors_as_raised():
        _add_scratch_call("raise", detect_races=detect_races)(jnp.ones((8, 128), F32))
    message = str(e.value)
    assert message.startswith(
        "device 0 core 0: read of never-written memory: 's' (VMEM, device 0 core 0) region "
        "[0:8, 0:128] (1024 of the 1024 elements read were never written by a store, DMA, "
        "block copy or input) at kernel 'add_scratch', grid point (), device 0 core 0 "
        f"({_line(add_scratch, 1)}). On a TPU these bytes are whatever an earlier kernel "
        "left there. Write every element before it is read")
    assert "InterpretParams(uninitialized_reads='off')" in message


def test_an_integer_scratch_is_reported_too():
    with pytest.raises(UninitializedReadError, match=r"'s' \(VMEM, device 0 core 0\)"), \
            errors_as_raised():
        _add_scratch_call("raise", jnp.int32)(jnp.ones((8, 128), jnp.int32))


def test_warn_reports_once_and_the_kernel_goes_on():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _add_scratch_call("warn")(jnp.ones((8, 128), F32))
    reports = [w for w in caught if issubclass(w.category, UninitializedReadWarning)]
    assert len(reports) == 1
    assert "read of never-written memory: 's'" in str(reports[0].message)
    assert np.isnan(np.asarray(out)).all()  # jax's interpreter's fill, as before


def test_off_reads_the_fill_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = pl.pallas_call(
            add_scratch, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
            scratch_shapes=[pltpu.VMEM((8, 128), F32)],
            interpret=InterpretParams(uninitialized_reads="off"),
        )(jnp.ones((8, 128), F32))
    assert np.isnan(np.asarray(out)).all()


def first_block_only(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
        o_ref[...] = x_ref[...]


@RACES
def test_an_output_block_never_written_is_reported_at_the_end_of_the_launch(detect_races):
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    f = pl.pallas_call(first_block_only, out_shape=jax.ShapeDtypeStruct((24, 128), F32),
                       grid=(3,), in_specs=[spec], out_specs=spec,
                       interpret=_params(detect_races=detect_races))
    with pytest.raises(UninitializedReadError) as e, errors_as_raised():
        f(jnp.ones((24, 128), F32))
    assert str(e.value).startswith(
        "kernel 'first_block_only' (test_uninitialized_reads.py:")
    assert (": output 'o_ref' (HBM, device 0) was never written in region [8:24, 0:128] "
            "(2048 of its 3072 elements) by the end of the launch: the caller receives "
            "uninitialised memory (on a TPU, garbage).") in str(e.value)


def scaled(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


@RACES
@pytest.mark.parametrize("cores", [1, 2])
def test_partial_edge_blocks_are_silent(detect_races, cores):
    """The last block covers rows 16:24 of a 20-row array: the kernel reads the whole
    block (rows past the array are padding, as on a TPU) and only rows 16:20 return."""
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    x = jnp.arange(20 * 128, dtype=F32).reshape(20, 128)
    out = pl.pallas_call(
        scaled, out_shape=jax.ShapeDtypeStruct(x.shape, F32), grid=(3,), in_specs=[spec],
        out_specs=spec, compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=_params(detect_races=detect_races, num_cores_or_threads=cores))(x)
    np.testing.assert_array_equal(out, x * 2)


def matmul(x_ref, y_ref, o_ref, acc):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc[...] = jnp.zeros_like(acc)

    acc[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=F32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc[...]


@RACES
def test_an_accumulator_initialised_at_the_first_step_is_silent_on_every_core(detect_races):
    x = jax.random.normal(jax.random.key(0), (256, 256), F32)
    f = pl.pallas_call(
        matmul, out_shape=jax.ShapeDtypeStruct((256, 256), F32), grid=(2, 2, 2),
        in_specs=[pl.BlockSpec((128, 128), lambda i, j, k: (i, k)),
                  pl.BlockSpec((128, 128), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((128, 128), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((128, 128), F32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=_params(detect_races=detect_races, num_cores_or_threads=2))
    np.testing.assert_allclose(f(x, x), x @ x, rtol=1e-4, atol=1e-4)


def init_on_first_point_only(x_ref, o_ref, acc):
    @pl.when(pl.program_id(0) == 0)  # BUG with two cores: core 1 starts at i == 1
    def _():
        acc[...] = jnp.zeros_like(acc)

    acc[...] += x_ref[...]
    o_ref[...] = acc[...]


def test_scratch_initialised_only_at_grid_point_0_is_reported_on_the_other_core():
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    f = pl.pallas_call(
        init_on_first_point_only, out_shape=jax.ShapeDtypeStruct((16, 128), F32), grid=(2,),
        in_specs=[spec], out_specs=spec, scratch_shapes=[pltpu.VMEM((8, 128), F32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=_params(num_cores_or_threads=2))
    with pytest.raises(UninitializedReadError) as e, errors_as_raised():
        f(jnp.ones((16, 128), F32))
    assert str(e.value).startswith(
        "device 0 core 1: read of never-written memory: 'acc' (VMEM, device 0 core 1) "
        "region [0:8, 0:128]")
    assert (f"at kernel 'init_on_first_point_only', grid point (1,), device 0 core 1 "
            f"({_line(init_on_first_point_only, 5)})") in str(e.value)


def scoped_sum(x_ref, o_ref):
    def body(tmp):
        tmp[0:4, :] = x_ref[0:4, :]
        o_ref[...] = tmp[...]  # BUG: rows 4:8 of tmp were never written

    pl.run_scoped(body, pltpu.VMEM((8, 128), F32))


def test_a_run_scoped_buffer_read_before_it_is_written_is_reported():
    f = pl.pallas_call(scoped_sum, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                       interpret=_params())
    with pytest.raises(UninitializedReadError) as e, errors_as_raised():
        f(jnp.ones((8, 128), F32))
    assert "'tmp' (VMEM, device 0 core 0) region [4:8, 0:128] (512 of the 1024" in str(e.value)


def smem_read(x_ref, o_ref, counts):
    counts[0] = 1
    o_ref[...] = x_ref[...] * counts[1].astype(F32)  # BUG: counts[1] never written


def test_an_smem_scalar_never_written_is_reported():
    f = pl.pallas_call(smem_read, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                       scratch_shapes=[pltpu.SMEM((2,), jnp.int32)], interpret=_params())
    with pytest.raises(UninitializedReadError) as e, errors_as_raised():
        f(jnp.ones((8, 128), F32))
    assert "'counts' (SMEM, device 0 core 0) region [1:2] (1 of the 1" in str(e.value)


def copy_out_unwritten(x_hbm, o_hbm, buf, sem):
    copy = pltpu.make_async_copy(buf, o_hbm, sem)  # BUG: buf was never written
    copy.start()
    copy.wait()


@RACES
def test_a_dma_of_a_never_written_buffer_is_reported(detect_races):
    f = pl.pallas_call(copy_out_unwritten, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                       in_specs=[ANY], out_specs=ANY,
                       scratch_shapes=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA],
                       interpret=_params(detect_races=detect_races))
    with pytest.raises(UninitializedReadError) as e, errors_as_raised():
        f(jnp.ones((8, 128), F32))
    assert str(e.value).startswith(
        "device 0 core 0: a DMA (buf->o_hbm) reads never-written memory: 'buf' (VMEM, device 0 "
        "core 0) region [0:8, 0:128] (none of the elements it copies was ever written by a "
        "store, DMA, block copy or input) at kernel 'copy_out_unwritten', grid point (), "
        f"device 0 core 0 ({_line(copy_out_unwritten, 2)}).")


def copy_half(x_hbm, o_hbm, buf, sem):
    buf[0:4, :] = jnp.ones((4, 128), F32)
    pltpu.sync_copy(x_hbm.at[4:8], buf.at[4:8])
    copy = pltpu.make_async_copy(buf, o_hbm, sem)  # the whole buffer, written in two parts
    copy.start()
    copy.wait()


@pytest.mark.parametrize("dma_execution_mode", ["on_wait", "eager"])
def test_a_buffer_written_by_a_store_and_a_dma_copies_out_silently(dma_execution_mode):
    x = jnp.full((8, 128), 3.0, F32)
    out = pl.pallas_call(copy_half, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                         in_specs=[ANY], out_specs=ANY,
                         scratch_shapes=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA],
                         interpret=_params(dma_execution_mode=dma_execution_mode))(x)
    np.testing.assert_array_equal(out[:4], 1.0)
    np.testing.assert_array_equal(out[4:], 3.0)


def copy_part_then_read_all(x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm.at[0:4], buf.at[0:4], sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...]  # BUG: rows 4:8 of buf came from nowhere


def test_a_dma_carries_what_was_written_to_its_destination():
    f = pl.pallas_call(copy_part_then_read_all, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                       in_specs=[ANY],
                       scratch_shapes=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA],
                       interpret=_params())
    with pytest.raises(UninitializedReadError, match=r"'buf' \(VMEM, device 0 core 0\) "
                       r"region \[4:8, 0:128\] \(512 of the 1024"), errors_as_raised():
        f(jnp.ones((8, 128), F32))


def test_an_output_aliased_to_an_input_needs_no_write():
    def nothing(x_ref, o_ref):
        del x_ref, o_ref

    x = jnp.ones((8, 128), F32)
    out = pl.pallas_call(nothing, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                         in_specs=[ANY], out_specs=ANY, input_output_aliases={0: 0},
                         interpret=_params())(x)
    np.testing.assert_array_equal(out, x)


def ring_then_read(x_ref, o_ref, recv, send_sem, recv_sem, *, n, bug):
    me = jax.lax.axis_index("x")
    copy = pltpu.make_async_remote_copy(x_ref.at[0:4] if bug else x_ref, recv.at[0:4] if bug
                                        else recv, send_sem, recv_sem,
                                        device_id=((me + 1) % n,),
                                        device_id_type=pl.DeviceIdType.MESH)
    copy.start()
    copy.wait()
    o_ref[...] = recv[...]


@RACES
@pytest.mark.parametrize("bug", [False, True], ids=["clean", "half-received"])
def test_multi_device_a_remote_dma_writes_the_peers_buffer(detect_races, bug):
    n = 2

    def f(x):
        return pl.pallas_call(
            functools.partial(ring_then_read, n=n, bug=bug),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA,
                            pltpu.SemaphoreType.DMA],
            interpret=_params(detect_races=detect_races))(x)

    g = on_devices(f, n)
    x = jnp.arange(n * 8 * 128, dtype=F32).reshape(n * 8, 128)
    xs = sharded(x, mesh(n))
    if not bug:
        np.testing.assert_array_equal(g(xs), np.roll(np.asarray(x).reshape(n, 8, 128), 1, 0)
                                      .reshape(n * 8, 128))
        return
    with pytest.raises(UninitializedReadError) as e, errors_as_raised():
        np.asarray(g(xs))
    assert "read of never-written memory: 'recv' (VMEM, device " in str(e.value)
    assert "region [4:8, 0:128] (512 of the 1024" in str(e.value)


def transposed_store(x_ref, o_ref):
    o_ref.T[...] = x_ref.T[...] * 2.0  # a store through a view: o_ref's old value is not read


def test_a_store_through_a_transposed_view_is_not_a_read():
    x = jnp.arange(8 * 128, dtype=F32).reshape(8, 128)
    out = pl.pallas_call(transposed_store, out_shape=jax.ShapeDtypeStruct(x.shape, F32),
                         interpret=_params(check_lowering=False))(x)
    np.testing.assert_array_equal(out, x * 2)
