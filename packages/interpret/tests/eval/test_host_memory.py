"""``pl.HOST`` operands: the host's memory is a space of its own (per device, not tiled,
not counted against VMEM); a TPU DMAs from it only into HBM and into it from HBM or VMEM,
and a kernel cannot load or store it (what libtpu says: tests/compiler/test_host_memory.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi
from palladium.interpret import InvalidKernelError, TpuLoweringError
from palladium.interpret.perf.model import HOST_BYTES_PER_S

S = (8, 128)
X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(S)
P = pi.InterpretParams(compile_check="approximate", detect_races=True)


def host_to_hbm_to_vmem(x_host, o_ref):
    def body(hbm, sem):
        pltpu.async_copy(x_host, hbm, sem).wait()
        pltpu.async_copy(hbm, o_ref, sem).wait()

    pl.run_scoped(body, pltpu.HBM(S, jnp.float32), pltpu.SemaphoreType.DMA)


def vmem_to_host(x_ref, o_host):
    def body(buf, sem):
        buf[...] = x_ref[...] * 2
        pltpu.async_copy(buf, o_host, sem).wait()

    pl.run_scoped(body, pltpu.VMEM(S, jnp.float32), pltpu.SemaphoreType.DMA)


def host_to_vmem(x_host, o_ref):
    def body(sem):
        pltpu.async_copy(x_host, o_ref, sem).wait()

    pl.run_scoped(body, pltpu.SemaphoreType.DMA)


@pytest.mark.timeout(120)
def test_a_host_input_is_dma_d_into_hbm_then_vmem():
    params = pi.InterpretParams(compile_check="approximate", detect_races=True,
                                allow_hbm_allocation_in_run_scoped=True)
    out = pl.pallas_call(host_to_hbm_to_vmem, out_shape=jax.ShapeDtypeStruct(S, jnp.float32),
                         in_specs=[pl.BlockSpec(memory_space=pl.HOST)], interpret=params)(X)
    np.testing.assert_array_equal(out, X)


@pytest.mark.timeout(120)
def test_a_host_output_is_written_by_a_dma_from_vmem():
    out = pl.pallas_call(vmem_to_host, out_shape=pl.HOST(S, jnp.float32),
                         out_specs=pl.BlockSpec(memory_space=pl.HOST), interpret=P)(X)
    np.testing.assert_array_equal(out, np.asarray(X) * 2)


@pytest.mark.timeout(120)
def test_host_operands_take_no_vmem_and_their_dmas_cross_the_host_link():
    rows = 24 * 2**20 // (128 * 4)  # 24 MiB: more than v5e's 16 MiB scoped VMEM
    big = jnp.ones((rows, 128), jnp.float32)

    def head_to_hbm(x_host, y_hbm):
        def body(sem):
            pltpu.async_copy(x_host.at[pl.ds(0, 64)], y_hbm, sem).wait()

        pl.run_scoped(body, pltpu.SemaphoreType.DMA)

    with pi.timeline() as tl:
        out = pl.pallas_call(head_to_hbm, out_shape=jax.ShapeDtypeStruct((64, 128), jnp.float32),
                             in_specs=[pl.BlockSpec(memory_space=pl.HOST)],
                             out_specs=pl.BlockSpec(memory_space=pl.ANY), interpret=P)(big)
    np.testing.assert_array_equal(out, np.ones((64, 128), np.float32))
    launch = tl.launches[-1]
    assert launch.info.memory.vmem.peak_bytes == 0
    assert launch.busy_seconds("host") == pytest.approx(64 * 128 * 4 / HOST_BYTES_PER_S)
    assert launch.busy_seconds("hbm") == 0


@pytest.mark.timeout(120)
def test_a_dma_from_host_memory_to_vmem_is_refused_as_the_tpu_compiler_does():
    call = pl.pallas_call(host_to_vmem, out_shape=jax.ShapeDtypeStruct(S, jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pl.HOST)], interpret=P)
    with pytest.raises(TpuLoweringError) as info, pi.errors_as_raised():
        call(X)
    msg = str(info.value)
    assert msg.startswith(
        "DMA from 'x_host' (HOST) to 'o_ref' (VMEM): the TPU compiler rejects a DMA from the "
        "host's memory to VMEM (\"Unimplemented DMA from host to vmem\"): a DMA reads the "
        "host's memory only into HBM. Copy it into an HBM ref (memory space pl.ANY) first "
        "(kernel 'host_to_vmem', grid point (), device 0 core 0 (test_host_memory.py:")


@pytest.mark.timeout(120)
def test_a_dma_from_vmem_to_host_memory_is_refused_on_v4():
    call = pl.pallas_call(vmem_to_host, out_shape=pl.HOST(S, jnp.float32),
                          out_specs=pl.BlockSpec(memory_space=pl.HOST),
                          interpret=pi.InterpretParams(chip="v4", compile_check="approximate"))
    with pytest.raises(TpuLoweringError, match="kDmaVmemToHost"), pi.errors_as_raised():
        call(X)


@pytest.mark.timeout(120)
def test_a_load_of_a_host_ref_is_refused():
    def load(x_host, o_ref):
        o_ref[...] = x_host[...]

    call = pl.pallas_call(load, out_shape=jax.ShapeDtypeStruct(S, jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pl.HOST)], interpret=P)
    with pytest.raises(InvalidKernelError) as info, pi.errors_as_raised():
        call(X)
    assert "read of 'x_host', which lives in the host's memory (memory space" in str(info.value)
    assert "a TPU kernel cannot read or write the host's memory directly" in str(info.value)


@pytest.mark.timeout(120)
def test_smem_to_host_runs_from_v5e_and_is_refused_on_v4():
    def smem_to_host(x_ref, o_host):
        def body(s, sem):
            for i in range(4):
                s[i] = x_ref[i] * 3.0
            pltpu.async_copy(s, o_host, sem).wait()

        pl.run_scoped(body, pltpu.SMEM((4,), jnp.float32), pltpu.SemaphoreType.DMA)

    def call(chip):
        return pl.pallas_call(
            smem_to_host, out_shape=pl.HOST((4,), jnp.float32),
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
            out_specs=pl.BlockSpec(memory_space=pl.HOST),
            interpret=pi.InterpretParams(chip=chip, compile_check="approximate"))

    x = jnp.arange(4, dtype=jnp.float32)
    np.testing.assert_array_equal(call("v5e")(x), np.asarray(x) * 3.0)
    with pytest.raises(TpuLoweringError, match="Unimplemented DMA from smem to host"), \
            pi.errors_as_raised():
        call("v4")(x)
