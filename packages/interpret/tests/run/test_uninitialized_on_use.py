"""``InterpretParams()`` (``uninitialized_reads="on_use"``, the default): uninitialised
memory reported where it is used, as MemorySanitizer does. The bugs that gave garbage on
a TPU v5e (issue 41) are reported with the kernel lines where the value was read and
used, operand, region, grid point, core and what to fix, on calls 1, 2 and 3+ (the
compiled paths start at call 3); the idioms that discard uninitialised data (masked
selects, masked padding, overwritten rows) and jax's shipped kernels are silent."""

import functools
import re

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
    UninitializedUseError,
    errors_as_raised,
)
from palladium.interpret.compiled import compiled_launch
from palladium.interpret.run.execution_plan import WHOLE_LAUNCH

pytestmark = pytest.mark.timeout(300)

F32 = jnp.float32
CALLS = 4  # the compiled paths (segments hot from call 3, whole launches) start at call 3
RACES = pytest.mark.parametrize("detect_races", [False, True], ids=["races-off", "races-on"])


def _line(fn, offset):
    """``test_uninitialized_on_use.py:N``: line ``offset`` of ``fn``'s body."""
    return f"test_uninitialized_on_use.py:{fn.__code__.co_firstlineno + offset}"


def _reported_every_call(f, *args):
    """The messages of ``CALLS`` calls, each of which must raise UninitializedUseError."""
    messages = []
    for _ in range(CALLS):
        with pytest.raises(UninitializedUseError) as e, errors_as_raised():
            jax.block_until_ready(f(*args))
        messages.append(str(e.value))
    assert len(set(messages)) == 1, messages  # the same report every call
    return messages[0]


# --- the four bugs of issue 41, and the partial edge block ---------------------------------

def matmul_not_zeroed(x_ref, y_ref, o_ref, acc):
    acc[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=F32)  # BUG: no k == 0 zeroing

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc[...]


def matmul_zeroed(x_ref, y_ref, o_ref, acc):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc[...] = jnp.zeros_like(acc)

    acc[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=F32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc[...]


def _matmul(kernel, cores=1, **kw):
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((256, 256), F32), grid=(2, 2, 2),
        in_specs=[pl.BlockSpec((128, 128), lambda i, j, k: (i, k)),
                  pl.BlockSpec((128, 128), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((128, 128), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((128, 128), F32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=InterpretParams(num_cores_or_threads=cores, **kw))


@RACES
def test_an_accumulator_never_zeroed_is_reported_at_the_output_it_reaches(detect_races):
    x = jax.random.normal(jax.random.key(0), (256, 256), F32)
    message = _reported_every_call(_matmul(matmul_not_zeroed, detect_races=detect_races), x, x)
    assert message.startswith("kernel 'matmul_not_zeroed' (")
    # (the parallel dimensions run in a seeded order: which block is named varies)
    assert re.search(
        r": output 'o_ref' \(HBM, device 0\) holds data derived from uninitialised memory in "
        r"region \[0:256, 0:256\] \(65536 of its 65536 elements\) when the launch ends: "
        r"stored into 'o_ref' \(VMEM, device 0 core 0\) at kernel 'matmul_not_zeroed', grid "
        r"point \(\d, \d, 1\), device 0 core 0 \(" + re.escape(_line(matmul_not_zeroed, 5))
        + r"\), derived from 'acc' \(VMEM, device 0 core 0\) region \[0:128, 0:128\] read at "
        r"kernel 'matmul_not_zeroed', grid point \(\d, \d, 0\), device 0 core 0 \("
        + re.escape(_line(matmul_not_zeroed, 1)) + r"\) before anything wrote it", message)
    assert "zero an accumulator" in message and "@pl.when(pl.program_id(k) == 0)" in message
    assert "InterpretParams(uninitialized_reads='off')" in message


@pytest.mark.parametrize("cores", [1, 2])
def test_an_accumulator_zeroed_at_the_first_step_is_silent_on_every_call(cores, monkeypatch):
    monkeypatch.setattr(compiled_launch, "MIN_EQUATIONS_PER_LAUNCH", 0)  # compile it whole
    x = jax.random.normal(jax.random.key(0), (256, 256), F32)
    y = jax.random.normal(jax.random.key(1), (256, 256), F32)
    f = _matmul(matmul_zeroed, cores)
    before = compiled_launch.STATS["compiled"]
    for _ in range(CALLS):
        np.testing.assert_allclose(f(x, y), x @ y, rtol=1e-4, atol=1e-3)
    if cores == 1:  # a clean kernel keeps its compiled launches
        assert compiled_launch.STATS["compiled"] - before == CALLS + 1 - WHOLE_LAUNCH


def test_two_cores_report_the_never_zeroed_accumulator_of_the_second_core():
    x = jax.random.normal(jax.random.key(0), (256, 256), F32)
    message = _reported_every_call(_matmul(matmul_not_zeroed, cores=2), x, x)
    assert "derived from 'acc' (VMEM, device 0 core " in message


def even_steps_only(x_ref, o_ref):
    @pl.when(pl.program_id(0) % 2 == 0)
    def _():
        o_ref[...] = x_ref[...] * 2.0  # BUG: odd grid steps leave their block unwritten


def test_an_output_block_written_only_on_even_steps_is_reported():
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    f = pl.pallas_call(even_steps_only, out_shape=jax.ShapeDtypeStruct((32, 128), F32),
                       grid=(4,), in_specs=[spec], out_specs=spec, interpret=InterpretParams())
    message = _reported_every_call(f, jnp.ones((32, 128), F32))
    assert message.startswith("kernel 'even_steps_only' (test_uninitialized_on_use.py:")
    assert (": output 'o_ref' (HBM, device 0) was never written in region [8:32, 0:128] "
            "(2048 of its 4096 elements) by the end of the launch: the caller receives "
            "uninitialised memory (on a TPU, garbage). Write every output block the grid "
            "visits") in message


def scratch_before_write(x_ref, o_ref, s):
    o_ref[...] = x_ref[...] + s[...]  # BUG: s was never written
    s[...] = x_ref[...]


def test_a_scratch_read_before_its_first_write_is_reported():
    f = pl.pallas_call(scratch_before_write, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                       scratch_shapes=[pltpu.VMEM((8, 128), F32)], interpret=InterpretParams())
    message = _reported_every_call(f, jnp.ones((8, 128), F32))
    assert ("derived from 's' (VMEM, device 0 core 0) region [0:8, 0:128] read at kernel "
            f"'scratch_before_write', grid point (), device 0 core 0 "
            f"({_line(scratch_before_write, 1)}) before anything wrote it (on a TPU: "
            "whatever an earlier kernel left there)") in message


def running_max(s_ref, o_ref, m_sc, l_sc):
    s = s_ref[...]
    m_prev = m_sc[...]  # BUG: m_sc is initialised nowhere (no -inf at kv step 0)
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    first = pl.program_id(0) == 0
    l_prev = jnp.where(first, 0.0, l_sc[...])
    l_sc[...] = jnp.exp(m_prev - m_new) * l_prev + jnp.exp(s - m_new).sum(axis=1, keepdims=True)
    m_sc[...] = m_new
    o_ref[...] = jnp.broadcast_to(l_sc[...], o_ref.shape)


def running_max_initialised(s_ref, o_ref, m_sc, l_sc):
    @pl.when(pl.program_id(0) == 0)
    def _():
        m_sc[...] = jnp.full_like(m_sc, -jnp.inf)
        l_sc[...] = jnp.zeros_like(l_sc)

    s = s_ref[...]
    m_prev = m_sc[...]
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    l_sc[...] = jnp.exp(m_prev - m_new) * l_sc[...] + jnp.exp(s - m_new).sum(axis=1, keepdims=True)
    m_sc[...] = m_new
    o_ref[...] = jnp.broadcast_to(l_sc[...], o_ref.shape)


def _running(kernel):
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32), grid=(2,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (0, i))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        scratch_shapes=[pltpu.VMEM((8, 1), F32), pltpu.VMEM((8, 1), F32)],
        interpret=InterpretParams())


def test_a_flash_style_running_max_read_before_it_is_initialised_is_reported():
    s = jax.random.normal(jax.random.key(2), (8, 256), F32)
    message = _reported_every_call(_running(running_max), s)
    assert ("derived from 'm_sc' (VMEM, device 0 core 0) region [0:8, 0:1] read at kernel "
            f"'running_max', grid point (0,), device 0 core 0 ({_line(running_max, 2)}) before "
            "anything wrote it") in message


def test_a_running_max_initialised_at_the_first_step_is_silent():
    s = jax.random.normal(jax.random.key(2), (8, 256), F32)
    ref = np.exp(np.asarray(s) - np.asarray(s).max(axis=1, keepdims=True)).sum(axis=1)
    for _ in range(CALLS):
        out = _running(running_max_initialised)(s)
        np.testing.assert_allclose(np.asarray(out)[:, 0], ref, rtol=1e-5)


def sum_positive(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    x = x_ref[...]
    o_ref[...] += jnp.sum(jnp.where(x > 0, x, 0.0), axis=0, keepdims=True)  # BUG: padding rows


def sum_positive_masked(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    x = x_ref[...]
    row = pl.program_id(0) * 64 + jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
    o_ref[...] += jnp.sum(jnp.where((row < 100) & (x > 0), x, 0.0), axis=0, keepdims=True)


def _row_sum(kernel):
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((1, 128), F32), grid=(2,),
        in_specs=[pl.BlockSpec((64, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((1, 128), lambda i: (0, 0)), interpret=InterpretParams())


def test_a_reduction_over_the_padding_of_a_partial_edge_block_is_reported():
    """On a v5e this returned garbage 5 of 5 times (the padding holds whatever VMEM held);
    the ``where`` drops a NaN fill, so only the shadow sees it."""
    x = jax.random.normal(jax.random.key(3), (100, 128), F32)
    message = _reported_every_call(_row_sum(sum_positive), x)
    assert ("derived from 'x_ref' (VMEM, device 0 core 0) region [36:64, 0:128] read at "
            f"kernel 'sum_positive', grid point (1,), device 0 core 0 ({_line(sum_positive, 5)}) "
            "(the padding of a partial edge block: on a TPU, whatever VMEM held)") in message
    assert "Mask the elements past the array's end" in message


def test_the_padding_masked_before_the_reduction_is_silent():
    x = jax.random.normal(jax.random.key(3), (100, 128), F32)
    for _ in range(CALLS):
        out = _row_sum(sum_positive_masked)(x)
        np.testing.assert_allclose(out, np.where(x > 0, x, 0).sum(0, keepdims=True), rtol=1e-5)


# --- uses: a branch, a loop bound, an index, a DMA, a semaphore -----------------------------

def branch_on_scratch(x_ref, o_ref, flag):
    o_ref[...] = x_ref[...]

    @pl.when(flag[0] > 0)  # BUG: flag was never written
    def _():
        o_ref[...] = x_ref[...] * 2.0


def loop_bound_from_scratch(x_ref, o_ref, n):
    o_ref[...] = x_ref[...]

    def body(i, c):
        o_ref[...] += 1.0
        return c

    jax.lax.fori_loop(0, n[0], body, 0)  # BUG: n was never written


def index_from_scratch(x_ref, o_ref, idx):
    o_ref[...] = x_ref[pl.ds(idx[0], 8), :]  # BUG: idx was never written


def _smem_kernel(kernel, dtype=jnp.int32):
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
        scratch_shapes=[pltpu.SMEM((1,), dtype)], interpret=InterpretParams())


@pytest.mark.parametrize("kernel, used, offset", [
    (branch_on_scratch, "a branch (lax.cond / pl.when)", 3),
    (loop_bound_from_scratch, "a loop's condition (lax.while_loop / lax.fori_loop bound)", 7),
    (index_from_scratch, "an index of a ref access", 1),
], ids=["branch", "loop-bound", "index"])
def test_a_value_from_never_written_smem_that_decides_something_is_reported(kernel, used, offset):
    x = jnp.ones((16, 128), F32) if kernel is index_from_scratch else jnp.ones((8, 128), F32)
    message = _reported_every_call(_smem_kernel(kernel), x)
    assert message.startswith(f"device 0 core 0: {used}")
    assert f"({_line(kernel, offset)}) is decided by a value derived from uninitialised memory: " \
        in message
    read_line = 3 if kernel is branch_on_scratch else offset
    assert f"region [0:1] read at kernel '{kernel.__name__}', grid point (), device 0 core 0 " \
        f"({_line(kernel, read_line)}) before anything wrote it" in message


def dma_offset_from_scratch(x_hbm, o_ref, idx, sem):
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(idx[0], 8)], o_ref, sem)  # BUG: idx unwritten
    copy.start()
    copy.wait()


def test_a_dma_offset_from_never_written_smem_is_reported():
    f = pl.pallas_call(
        dma_offset_from_scratch, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.SMEM((1,), jnp.int32), pltpu.SemaphoreType.DMA],
        interpret=InterpretParams())
    message = _reported_every_call(f, jnp.ones((16, 128), F32))
    assert message.startswith("device 0 core 0: an operand of a DMA (dma_start)")
    assert "derived from uninitialised memory: 'idx' (SMEM, device 0 core 0) region [0:1]" in message


def semaphore_count_from_scratch(x_ref, o_ref, n, sem):
    pl.semaphore_signal(sem, n[0])  # BUG: n was never written
    pl.semaphore_wait(sem, 1)
    o_ref[...] = x_ref[...]


def test_a_semaphore_count_from_never_written_smem_is_reported():
    f = pl.pallas_call(
        semaphore_count_from_scratch, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
        scratch_shapes=[pltpu.SMEM((1,), jnp.int32), pltpu.SemaphoreType.REGULAR],
        interpret=InterpretParams())
    message = _reported_every_call(f, jnp.ones((8, 128), F32))
    assert message.startswith("device 0 core 0: a semaphore operand (semaphore_signal)")


def test_the_use_error_is_an_uninitialized_read_error_and_off_opts_out():
    assert issubclass(UninitializedUseError, UninitializedReadError)
    assert InterpretParams().uninitialized_reads == "on_use"
    f = pl.pallas_call(scratch_before_write, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
                       scratch_shapes=[pltpu.VMEM((8, 128), F32)],
                       interpret=InterpretParams(uninitialized_reads="off"))
    assert np.isnan(np.asarray(f(jnp.ones((8, 128), F32)))).all()


# --- idioms that discard uninitialised data ------------------------------------------------

def masked_select_into_output(x_ref, o_ref):
    """megablox gmm's pattern: rows of the output block outside this step's mask keep
    what the block held (nothing, on the first visit); the other step writes them."""
    rows = jax.lax.broadcasted_iota(jnp.int32, o_ref.shape, 0)
    mask = (rows < 4) == (pl.program_id(1) == 0)
    o_ref[...] = jnp.where(mask, x_ref[...] * 2.0, o_ref[...])


def test_a_masked_select_of_rows_written_later_is_silent():
    x = jax.random.normal(jax.random.key(4), (16, 128), F32)
    f = pl.pallas_call(
        masked_select_into_output, out_shape=jax.ShapeDtypeStruct((16, 128), F32),
        grid=(2, 2), in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, 0)), interpret=InterpretParams())
    for _ in range(CALLS):
        np.testing.assert_array_equal(f(x), x * 2)


def masked_store(x_ref, o_ref):
    rows = pl.program_id(0) * 8 + jax.lax.broadcasted_iota(jnp.int32, x_ref.shape, 0)
    pltpu.store(o_ref, x_ref[...] + 1.0, mask=rows < 20)


def test_masked_stores_over_a_partial_edge_block_are_silent():
    x = jax.random.normal(jax.random.key(5), (20, 128), F32)
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    f = pl.pallas_call(masked_store, out_shape=jax.ShapeDtypeStruct((20, 128), F32),
                       grid=(3,), in_specs=[spec], out_specs=spec, interpret=InterpretParams())
    for _ in range(CALLS):
        np.testing.assert_array_equal(f(x), x + 1)


def scaled(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0  # the padding rows go to padding rows, never returned


@pytest.mark.parametrize("cores", [1, 2])
def test_elementwise_over_a_partial_edge_block_is_silent(cores):
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    x = jnp.arange(20 * 128, dtype=F32).reshape(20, 128)
    f = pl.pallas_call(
        scaled, out_shape=jax.ShapeDtypeStruct(x.shape, F32), grid=(3,), in_specs=[spec],
        out_specs=spec, compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=InterpretParams(num_cores_or_threads=cores))
    for _ in range(CALLS):
        np.testing.assert_array_equal(f(x), x * 2)


def in_place_add(x_ref, y_ref, o_ref):
    # o_ref aliases y in HBM; its VMEM blocks are written back, never loaded: read y_ref
    o_ref[...] = y_ref[...] + x_ref[...]


def test_in_place_aliasing_is_silent():
    x = jnp.ones((16, 128), F32)
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))

    @jax.jit
    def f(x, y):
        return pl.pallas_call(in_place_add, out_shape=jax.ShapeDtypeStruct(x.shape, F32),
                              grid=(2,), in_specs=[spec, spec], out_specs=spec,
                              input_output_aliases={1: 0}, interpret=InterpretParams())(x, y)

    for _ in range(CALLS):
        np.testing.assert_array_equal(f(x, x * 3), x * 4)


def test_an_output_aliased_in_hbm_and_never_written_returns_its_input_silently():
    def nothing(x_ref, o_ref):
        del x_ref, o_ref

    any_space = pl.BlockSpec(memory_space=pl.ANY)
    x = jnp.arange(8 * 128, dtype=F32).reshape(8, 128)
    f = pl.pallas_call(nothing, out_shape=jax.ShapeDtypeStruct(x.shape, F32),
                       in_specs=[any_space], out_specs=any_space, input_output_aliases={0: 0},
                       interpret=InterpretParams())
    for _ in range(CALLS):
        np.testing.assert_array_equal(f(x), x)


def revisited_sum(x_ref, o_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += x_ref[...]


def test_a_revisited_output_zeroed_at_its_first_visit_is_silent():
    x = jax.random.normal(jax.random.key(6), (16, 512), F32)
    f = pl.pallas_call(
        revisited_sum, out_shape=jax.ShapeDtypeStruct((16, 128), F32), grid=(2, 4),
        in_specs=[pl.BlockSpec((8, 128), lambda i, k: (i, k))],
        out_specs=pl.BlockSpec((8, 128), lambda i, k: (i, 0)), interpret=InterpretParams())
    ref = np.asarray(x).reshape(16, 4, 128).sum(1)
    for _ in range(CALLS):
        np.testing.assert_allclose(f(x), ref, rtol=1e-5, atol=1e-5)


# --- several devices -----------------------------------------------------------------------

def remote_then_read(x_ref, o_ref, recv, send_sem, recv_sem, *, n, bug):
    me = jax.lax.axis_index("x")
    copy = pltpu.make_async_remote_copy(x_ref.at[0:4] if bug else x_ref,
                                        recv.at[0:4] if bug else recv, send_sem, recv_sem,
                                        device_id=((me + 1) % n,),
                                        device_id_type=pl.DeviceIdType.MESH)
    copy.start()
    copy.wait()
    o_ref[...] = recv[...] * 2.0


@pytest.mark.parametrize("bug", [False, True], ids=["clean", "half-received"])
def test_two_devices_report_only_what_reaches_the_output(bug):
    n = 2

    def f(x):
        return pl.pallas_call(
            functools.partial(remote_then_read, n=n, bug=bug),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA,
                            pltpu.SemaphoreType.DMA], interpret=InterpretParams())(x)

    g = on_devices(f, n)
    x = jnp.arange(n * 8 * 128, dtype=F32).reshape(n * 8, 128)
    xs = sharded(x, mesh(n))
    if not bug:
        np.testing.assert_array_equal(
            g(xs), 2 * np.roll(np.asarray(x).reshape(n, 8, 128), 1, 0).reshape(n * 8, 128))
        return
    with pytest.raises(UninitializedUseError) as e, errors_as_raised():
        np.asarray(g(xs))
    assert "holds data derived from uninitialised memory in region [4:8, 0:128]" in str(e.value)
    assert "'recv' (VMEM, device " in str(e.value)


# --- compiled launches ---------------------------------------------------------------------

def test_a_kernel_that_discards_uninitialised_rows_runs_compiled_for_scalars_seen_clean(
        monkeypatch):
    monkeypatch.setattr(compiled_launch, "MIN_EQUATIONS_PER_LAUNCH", 0)

    def gmm_like(n_ref, x_ref, o_ref):
        rows = jax.lax.broadcasted_iota(jnp.int32, o_ref.shape, 0)
        step = pl.program_id(0)
        # step 0 writes the rows below n, step 1 the rows from n to 8 - skip
        mine = jnp.where(step == 0, rows < n_ref[0], (rows >= n_ref[0]) & (rows < 8 - n_ref[1]))
        o_ref[...] = jnp.where(mine, x_ref[...] * 2.0, o_ref[...])

    x = jax.random.normal(jax.random.key(7), (8, 128), F32)
    f = jax.jit(pl.pallas_call(
        gmm_like, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(2,),
            in_specs=[pl.BlockSpec((8, 128), lambda i, n: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, n: (0, 0))),
        interpret=InterpretParams()))
    clean = jnp.array([3, 0], jnp.int32)
    before = compiled_launch.STATS["compiled"]
    for _ in range(CALLS):
        np.testing.assert_array_equal(f(clean, x), x * 2)
    assert compiled_launch.STATS["compiled"] - before == CALLS + 1 - WHOLE_LAUNCH  # hot ones
    # other scalars: simulated (where values carry shadows), and two rows never written
    with pytest.raises(UninitializedUseError, match=r"output 'o_ref' \(HBM, device 0\) holds "
                       r"data derived from uninitialised memory in region \[6:8, 0:128\]"), \
            errors_as_raised():
        jax.block_until_ready(f(jnp.array([3, 2], jnp.int32), x))
    assert compiled_launch.STATS["compiled"] - before == CALLS + 1 - WHOLE_LAUNCH
