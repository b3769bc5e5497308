"""What the TPU compiler says of ``pl.HOST`` operands (host operands are placed in pinned
host memory for it, as a TPU program places them): DMAs host -> HBM and VMEM -> host
compile, host -> VMEM does not; palladium's simulation refuses what it refuses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi
from palladium.interpret import TpuCompilerError
from palladium.interpret.fidelity import tpu_compiler

CHECKER = f"libtpu {tpu_compiler.compiler_version()} (jax {jax.__version__})"
S = (8, 128)
X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(S)


def host_to_hbm(x_host, y_hbm):
    def body(sem):
        pltpu.async_copy(x_host, y_hbm, sem).wait()

    pl.run_scoped(body, pltpu.SemaphoreType.DMA)


def vmem_to_host(x_ref, o_host):
    def body(buf, sem):
        buf[...] = x_ref[...] + 1
        pltpu.async_copy(buf, o_host, sem).wait()

    pl.run_scoped(body, pltpu.VMEM(S, jnp.float32), pltpu.SemaphoreType.DMA)


def host_to_vmem(x_host, o_ref):
    def body(sem):
        pltpu.async_copy(x_host, o_ref, sem).wait()

    pl.run_scoped(body, pltpu.SemaphoreType.DMA)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("chip", ["v5e", "v6e", "v7x"])
def test_the_compiler_accepts_host_to_hbm_and_vmem_to_host(chip):
    params = pi.InterpretParams(chip=chip, compile_check="compiler")
    with pi.timeline() as tl:
        out = pl.pallas_call(host_to_hbm, out_shape=jax.ShapeDtypeStruct(S, jnp.float32),
                             in_specs=[pl.BlockSpec(memory_space=pl.HOST)],
                             out_specs=pl.BlockSpec(memory_space=pl.ANY), interpret=params)(X)
        np.testing.assert_array_equal(out, X)
        out = pl.pallas_call(vmem_to_host, out_shape=pl.HOST(S, jnp.float32),
                             out_specs=pl.BlockSpec(memory_space=pl.HOST), interpret=params)(X)
        np.testing.assert_array_equal(out, np.asarray(X) + 1)
    assert [launch.info.memory.checker for launch in tl.launches] == [CHECKER, CHECKER]


@pytest.mark.timeout(300)
def test_the_compiler_rejects_host_to_vmem():
    call = pl.pallas_call(host_to_vmem, out_shape=jax.ShapeDtypeStruct(S, jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pl.HOST)],
                          interpret=pi.InterpretParams(compile_check="compiler"))
    with pytest.raises(TpuCompilerError) as info:
        call(X)
    assert "Unimplemented DMA from host to vmem." in str(info.value)
