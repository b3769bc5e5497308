"""The VMEM/SMEM count follows what the TPU compiler does on the chips it was measured on
(``chip.CompilerFacts``): bool buffers in VMEM are 32-bit words, SMEM is allocated in
512-byte units and a 2-D SMEM buffer of words in rows of 128, and the compiler keeps part
of SMEM (2 KiB, 512 bytes on v4) and of VMEM (60 KiB on v5p and v6e). Each kernel over a
limit raises ``TpuResourceError`` naming the count; its twin under the limit runs.

Every rejection here is the TPU compiler's (libtpu 0.0.42.1) on that chip; no libtpu
needed (``compile_check="approximate"``).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams, TpuResourceError
from palladium.interpret.fidelity.lowering_check import APPROXIMATION_NOTE

MiB, KiB = 2**20, 2**10
X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)


def _live_scratch(scratch, chip, *, vmem_limit=None, as_mask=False):
    """8 rows of ``scratch`` written and read back at indices the compiler cannot know
    (scalar prefetch), so that it allocates all of it."""

    def kernel(idx_ref, x_ref, o_ref, s_ref):
        write = pl.ds(pl.multiple_of(idx_ref[0] * 8, 8), 8)
        read = pl.ds(pl.multiple_of(idx_ref[1] * 8, 8), 8)
        if as_mask:
            s_ref[write, :] = x_ref[...] > 100
            o_ref[...] = jnp.where(s_ref[read, :], 1.0, 0.0)
        else:
            s_ref[write, :] = x_ref[...]
            o_ref[...] = s_ref[read, :]

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(1,),
        in_specs=[pl.BlockSpec((8, 128), lambda i, idx: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, idx: (0, 0)), scratch_shapes=[scratch])
    params = None if vmem_limit is None else pltpu.CompilerParams(vmem_limit_bytes=vmem_limit)
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          grid_spec=grid_spec, compiler_params=params,
                          interpret=InterpretParams(chip=chip, compile_check="approximate"))
    return call(jnp.array([0, 0], jnp.int32), X)


def _smem_scratch(shape, chip):
    def kernel(idx_ref, x_ref, o_ref, s_ref):
        s_ref[(idx_ref[0],) + (0,) * (len(shape) - 1)] = x_ref[0]
        o_ref[0] = s_ref[(idx_ref[1],) + (0,) * (len(shape) - 1)] + 1

    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(1,), in_specs=[smem], out_specs=smem,
        scratch_shapes=[pltpu.SMEM(shape, jnp.int32)])
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
                          grid_spec=grid_spec,
                          interpret=InterpretParams(chip=chip, compile_check="approximate"))
    return call(jnp.array([0, 0], jnp.int32), jnp.array([7], jnp.int32))


def _head(chip, needed, space):
    return (rf"kernel 'kernel' \(pallas_call at test_approx_memory\.py:\d+\) needs "
            rf"{re.escape(needed)} of {space} per core on TPU {chip}, more than ")


SMEM_SMALL = ("  input 'x_ref' block (1,) int32: 512 bytes\n"
              "  output 'o_ref' block (1,) int32: 512 bytes\n"
              "  scalar prefetch 'idx_ref' (2,) int32: 512 bytes\n")


def test_a_2d_smem_buffer_takes_rows_of_128_words():
    with pytest.raises(TpuResourceError) as info:
        _smem_scratch((2048, 2), "v5e")
    assert re.fullmatch(
        _head("v5e", "1.00 MiB (1050112 bytes)", "SMEM") + re.escape(
            "the core's SMEM capacity of 1.00 MiB less the 2048 bytes the TPU compiler keeps "
            "(1046528 bytes for the kernel). A TPU fails to compile it: \"Ran out of memory "
            "in memory space smem\". Counted per core:\n" + SMEM_SMALL
            + "  scratch 's_ref' (2048, 2) int32: 1.00 MiB\n"
            "Use smaller scalar-prefetch operands, SMEM blocks or SMEM scratch.\n"
            + APPROXIMATION_NOTE),
        str(info.value)), str(info.value)
    assert int(_smem_scratch((1024, 2), "v5e")[0]) == 8


@pytest.mark.parametrize(("chip", "kept"), [("v6e", 2048), ("v4", 512)])
def test_the_compiler_keeps_part_of_smem(chip, kept):
    words = (MiB - 1024) // 4  # fits 1 MiB, not what the compiler leaves
    with pytest.raises(TpuResourceError) as info:
        _smem_scratch((words,), chip)
    assert (f"more than the core's SMEM capacity of 1.00 MiB less the {kept} bytes the TPU "
            f"compiler keeps ({MiB - kept} bytes for the kernel)") in str(info.value)
    assert f"  scratch 's_ref' ({words},) int32: 1.00 MiB\n" in str(info.value)
    assert int(_smem_scratch(((MiB - 4 * KiB) // 4,), chip)[0]) == 8


def test_bool_scratch_in_vmem_takes_32_bit_words():
    rows = 40960  # 5 MiB as bytes, 20 MiB as words
    with pytest.raises(TpuResourceError) as info:
        _live_scratch(pltpu.VMEM((rows, 128), jnp.bool_), "v5e", as_mask=True)
    assert re.fullmatch(
        _head("v5e", "20.01 MiB (20979712 bytes)", "VMEM") + re.escape(
            "its scoped VMEM limit of 16.00 MiB (XLA's default on v5e). A TPU fails to "
            "compile it: \"Ran out of memory in memory space vmem\". Counted per core, "
            "tile-padded:\n"
            "  input 'x_ref' block (8, 128) float32: 4096 bytes\n"
            "  output 'o_ref' block (8, 128) float32: 4096 bytes\n"
            "  scratch 's_ref' (40960, 128) bool (as 32-bit words): 20.00 MiB\n"
            "Raise pltpu.CompilerParams(vmem_limit_bytes=...) to at least 20979712 (up to the "
            "core's 128.00 MiB), or use fewer buffers (pipeline_mode=pl.Buffered(1) for a "
            "block whose index rarely changes) or smaller blocks.\n" + APPROXIMATION_NOTE),
        str(info.value)), str(info.value)
    # v6e's default scoped limit is 32 MiB.
    out = _live_scratch(pltpu.VMEM((rows, 128), jnp.bool_), "v6e", as_mask=True)
    np.testing.assert_array_equal(out, (np.asarray(X) > 100).astype(np.float32))


def test_v6e_keeps_60_kib_of_its_vmem():
    rows = (128 * MiB - 64 * KiB) // 512
    with pytest.raises(TpuResourceError) as info:
        _live_scratch(pltpu.VMEM((rows, 128), jnp.float32), "v6e", vmem_limit=128 * MiB)
    assert ("more than the core's VMEM capacity of 128.00 MiB less the 61440 bytes the TPU "
            "compiler keeps (134156288 bytes for the kernel) (vmem_limit_bytes=134217728 is "
            "more than there is)") in str(info.value)
    text, doubt = str(info.value).rsplit("\n", 1)
    assert text.endswith(
        "Even the core's whole VMEM (128.00 MiB less the 61440 bytes the TPU compiler keeps "
        "(134156288 bytes for the kernel)) is too small: use smaller blocks or fewer buffers "
        "(pipeline_mode=pl.Buffered(1)).\n" + APPROXIMATION_NOTE)
    # 4 KiB over: within 10% of the limit, the approximation's verdict is uncertain
    assert doubt == f"This verdict is {info.value.uncertain}."
    assert doubt.startswith("This verdict is uncertain: palladium's approximation counts "
                            "127.95 MiB of 127.94 MiB VMEM, within 10% of the limit")
    # v5e keeps none of its 128 MiB.
    out = _live_scratch(pltpu.VMEM((rows, 128), jnp.float32), "v5e", vmem_limit=128 * MiB)
    np.testing.assert_array_equal(out, X)
