"""Operands XLA placed in VMEM (issue 40): their pipeline block copies are VMEM -> VMEM
DMAs at the chip's measured local rate and latency, a kernel's own DMAs between on-core
memories are local too, and ``predict`` says which placement it used. Without libtpu the
placement is every operand in HBM (tests/compiler/test_xla_placement.py asks libtpu)."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi
from palladium.interpret import InterpretParams
from palladium.interpret.errors import ConfigError
from palladium.interpret.fidelity.compiler_protocol import CallPlacement
from palladium.interpret.fidelity.xla_placement import ProgramPlacement, hlo_type
from palladium.interpret.perf import chip_model

V5E = chip_model("v5e")
BLOCK = (128, 128)  # f32: 64 KiB a block
STEPS = 32


def _copy_kernel():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    spec = pl.BlockSpec(BLOCK, lambda i: (i, 0))
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128 * STEPS, 128), jnp.float32),
                          grid=(STEPS,), in_specs=[spec], out_specs=spec,
                          interpret=InterpretParams(chip="v5e", skip_floating_point_ops=True))
    x = jnp.ones((128 * STEPS, 128), jnp.float32)
    return lambda: call(x)


class _Placed:
    """A placement that puts the named operands in VMEM."""

    def __init__(self, local):
        self.local = frozenset(local)
        self.asked = []

    def local_operands(self, kernel):
        self.asked.append(kernel.name)
        return self.local


def _record(placement):
    with pi.timeline(placement=placement) as tl:
        jax.block_until_ready(_copy_kernel()())
    (rec,) = tl.launches
    return rec


@pytest.mark.timeout(120)
def test_block_copies_of_operands_in_vmem_are_local_dmas():
    hbm = _record(None)
    placed = _Placed({("in", "x_ref"), ("out", "o_ref")})
    local = _record(placed)
    assert placed.asked == ["kernel"]
    copies = [s for s in local.spans if s.cat == "dma"]
    assert len(copies) == 2 * STEPS == len([s for s in hbm.spans if s.cat == "dma"])
    ins = [s for s in copies if s.args["dst"] == "x_ref"]
    outs = [s for s in copies if s.args["src"] == "o_ref"]
    assert len(ins) == len(outs) == STEPS
    assert {s.args["src"] for s in ins} == {"VMEM"} and {s.args["dst"] for s in outs} == {"VMEM"}
    assert {s.args["src"] for s in hbm.spans if s.cat == "dma" and s.args["dst"] == "x_ref"} == {
        "HBM"}
    # a local copy takes the measured local latency and rate (r7/dma-local on a v5e: 25.5
    # ns and 3.3 TB/s), not an HBM read's (349 ns and 749 GB/s)
    nbytes = 128 * 128 * 4
    alone = V5E.dma_latency("local") + nbytes / V5E.local_bytes_per_second()
    assert V5E.dma_latency("local") < V5E.dma_latency("in") / 10
    first = min(ins, key=lambda s: s.start)
    assert first.end - first.start == pytest.approx(alone, rel=1e-6)
    # the kernel is HBM-bound with its operands in HBM, bound by its steps in VMEM
    assert hbm.bound == "HBM"
    assert local.predicted_seconds < 0.5 * hbm.predicted_seconds
    assert local.dma_bytes == hbm.dma_bytes


@pytest.mark.timeout(120)
def test_a_placement_that_names_no_operand_changes_nothing():
    assert _record(_Placed(())).predicted_seconds == _record(None).predicted_seconds


def _step_overhead(placement) -> float:
    spans = {s.end - s.start for s in _record(placement).spans if s.name == "step overhead"}
    (seconds,) = {round(x, 15) for x in spans}
    return seconds


@pytest.mark.timeout(120)
def test_a_kernel_with_every_operand_in_vmem_does_not_check_its_blocks_each_step():
    # jax's flash backward kernels on a v5e (every operand in VMEM): a grid step as fast as
    # round 6's step on resident blocks (437 against 440 ns at 128-blocks); gated-delta
    # (four of six operands in VMEM) pays its index maps' block checks all the same
    fixed = V5E.step_overhead_s + 2 * V5E.operand_step_seconds
    checks = 2 * V5E.dynamic_operand_step_seconds  # x and o: their block moves each step
    assert checks > 10e-9
    assert _step_overhead(None) == pytest.approx(fixed + checks)
    assert _step_overhead(_Placed({("in", "x_ref")})) == pytest.approx(fixed + checks)
    assert _step_overhead(_Placed({("in", "x_ref"), ("out", "o_ref")})) == pytest.approx(fixed)


def _local_dma_kernel(chunks, nbytes_rows):
    def kernel(x_ref, o_ref, src, dst, sem):
        src[...] = jnp.broadcast_to(x_ref[...], src.shape)

        def body(i, c):
            copy = pltpu.make_async_copy(src, dst, sem)
            copy.start()
            copy.wait()
            return c

        jax.lax.fori_loop(0, chunks, body, 0)
        o_ref[...] = dst[pl.ds(0, 8), :]

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 512), jnp.float32),
                          scratch_shapes=[pltpu.VMEM((nbytes_rows, 512), jnp.float32),
                                          pltpu.VMEM((nbytes_rows, 512), jnp.float32),
                                          pltpu.SemaphoreType.DMA(())],
                          interpret=InterpretParams(chip="v5e", skip_floating_point_ops=True))
    x = jnp.ones((nbytes_rows, 512), jnp.float32)
    return lambda: call(x)


@pytest.mark.timeout(120)
def test_a_kernels_own_vmem_to_vmem_dma_is_local():
    with pi.timeline() as tl:
        jax.block_until_ready(_local_dma_kernel(16, 32)())
    (rec,) = tl.launches
    dmas = [s for s in rec.spans if s.cat == "dma" and s.args["src"].startswith("'src'")]
    assert len(dmas) == 16
    nbytes = 32 * 512 * 4
    each = V5E.dma_latency("local") + nbytes / V5E.local_bytes_per_second()
    for s in dmas:
        assert s.end - s.start == pytest.approx(each, rel=1e-6)
    assert rec.resource_bytes[("local", 0)] == 16 * nbytes


def test_a_chip_without_local_dma_measurements_costs_them_as_hbm_reads():
    bare = dataclasses.replace(V5E, dma_latency_local_s=None, local_dma_bytes_per_second=None)
    assert bare.dma_latency("local") == bare.dma_latency("in")
    assert bare.local_bytes_per_second() == pytest.approx(1 / bare.hbm_byte_seconds("in"))
    # an unmeasured chip gets the v5e's at its own clock
    v6e = chip_model("v6e")
    assert v6e.dma_latency_local_s == V5E.dma_latency_local_s
    assert v6e.local_dma_bytes_per_second == pytest.approx(
        V5E.local_dma_bytes_per_second * v6e.clock_hz / V5E.clock_hz)
    assert "local_dma_bytes_per_second" in V5E.measured
    assert "local_dma_bytes_per_second" not in v6e.measured


class _Info:
    def __init__(self, shape, dtype, name):
        self.array_shape, self.dtype, self.name = shape, dtype, name


class _Kernel:
    def __init__(self, ins, outs):
        self.inputs, self.outputs = ins, outs


def test_launches_take_the_compiled_calls_that_match_their_types_in_order():
    f32 = "f32[4,128]"
    calls = (
        CallPlacement("fwd", (("s32[2]", 1), (f32, 0), (f32, 0)), ((f32, 1),)),
        CallPlacement("bwd", ((f32, 1), (f32, 1)), ((f32, 1), ("bf16[4,128]", 0))),
        CallPlacement("again", ((f32, 0), (f32, 1)), ((f32, 0),)),
    )
    placement = ProgramPlacement(calls=calls, checker="libtpu test")
    two_in = _Kernel([_Info((4, 128), jnp.float32, "a"), _Info((4, 128), jnp.float32, "b")],
                     [_Info((4, 128), jnp.float32, "o")])
    # the first call's scalar-prefetch operand comes first: its last two are the inputs
    assert placement.local_operands(two_in) == {("out", "o")}
    assert placement.local_operands(two_in) == {("in", "b")}  # the next of that type
    assert placement.local_operands(two_in) == frozenset()  # none left: HBM
    bwd = _Kernel([_Info((4, 128), jnp.float32, "x"), _Info((4, 128), jnp.float32, "y")],
                  [_Info((4, 128), jnp.float32, "dx"), _Info((4, 128), jnp.bfloat16, "dy")])
    assert placement.local_operands(bwd) == {("in", "x"), ("in", "y"), ("out", "dx")}
    assert placement.describe() == ("XLA's placement (libtpu test): operands or results in "
                                    "VMEM for fwd, bwd, again")
    assert ProgramPlacement(reason="why").describe() == "every operand in HBM (why)"


def test_hlo_types_are_written_as_xla_writes_them():
    assert hlo_type((1, 2, 1024, 128), jnp.float32) == "f32[1,2,1024,128]"
    assert hlo_type((8,), jnp.bfloat16) == "bf16[8]"
    assert hlo_type((), jnp.int32) == "s32[]"
    assert hlo_type((3, 4), jnp.uint8) == "u8[3,4]"
    assert hlo_type((2,), jnp.bool_) == "pred[2]"
    assert hlo_type((2,), jnp.int8) == "s8[2]"


@pytest.mark.timeout(120)
def test_predict_says_which_placement_it_used():
    def fn(x):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2

        spec = pl.BlockSpec(BLOCK, lambda i: (i, 0))
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              grid=(4,), in_specs=[spec], out_specs=spec)(x)

    arg = jax.ShapeDtypeStruct((512, 128), jnp.float32)
    hbm = pi.predict(fn, arg, chip="v5e", compile_check="off", placement="hbm")
    assert hbm.placement == "every operand in HBM (placement='hbm')"
    auto = pi.predict(fn, arg, chip="v5e", compile_check="off")
    assert auto.placement.startswith(("every operand in HBM", "XLA's placement"))
    assert auto.predicted_seconds == pytest.approx(hbm.predicted_seconds)
    with pytest.raises(ConfigError, match=r"predict\(placement=...\) must be 'auto' or 'hbm', "
                                          r"got 'vmem'"):
        pi.predict(fn, arg, chip="v5e", placement="vmem")


def test_a_block_is_strided_when_it_is_pieces_of_its_array():
    from palladium.interpret.kernel.blocks import BlockDim, BlockSpecInfo

    def info(block, array):
        return BlockSpecInfo("x", tuple(BlockDim("squeezed", 1) if b is None
                                        else BlockDim("blocked", b) for b in block),
                             array, jnp.dtype(jnp.float32), None, None)

    assert info((128, 128), (2048, 2048)).strided
    assert not info((8, 2048), (4096, 2048)).strided  # whole rows
    assert not info((1, 1, 128, 128), (1, 4, 2048, 128)).strided  # one run
    assert not info((None, 128, 128), (4, 2048, 128)).strided
    assert info((1, 128, 128), (4, 512, 512)).strided
    assert not info((2048, 2048), (2048, 2048)).strided
