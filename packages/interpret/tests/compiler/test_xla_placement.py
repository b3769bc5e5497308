"""XLA's placement of a ``pallas_call``'s operands in the whole program, from libtpu
without a TPU (issue 40): inside ``jax.grad`` of a kernel with a custom VJP XLA keeps
the forward's residuals in VMEM for the backward kernel, a kernel on the program's own
arguments reads HBM, and ``predict`` costs the first's block copies as VMEM -> VMEM."""

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

import palladium.interpret as pi
from palladium.interpret.fidelity import tpu_compiler
from palladium.interpret.fidelity.compiler_protocol import custom_call_placement

pytestmark = pytest.mark.skipif(tpu_compiler.compiler_version() is None,
                                reason="needs libtpu (palladium-interpret[compiler])")

ROWS, BLOCK = 1024, 128


def _scale(x, factor):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * factor

    spec = pl.BlockSpec((BLOCK, 128), lambda i: (i, 0))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(x.shape[0] // BLOCK,), in_specs=[spec], out_specs=spec)(x)


@functools.partial(jax.custom_vjp)
def _double(x):
    return _scale(x, 2.0)


def _fwd(x):
    return _scale(x, 2.0), None


def _bwd(_, g):
    return (_scale(g, 2.0),)


_double.defvjp(_fwd, _bwd)


def _loss(x):
    return jnp.sum(jnp.sin(_double(jnp.cos(x))))


@pytest.mark.timeout(300)
def test_predict_reads_xla_placement_and_costs_vmem_operands_locally():
    arg = jax.ShapeDtypeStruct((ROWS, 128), jnp.float32)
    auto = pi.predict(jax.grad(_loss), arg, chip="v5e", compile_check="off")
    hbm = pi.predict(jax.grad(_loss), arg, chip="v5e", compile_check="off", placement="hbm")
    assert len(auto.launches) == len(hbm.launches) == 2
    assert auto.placement.startswith("XLA's placement (libtpu ")
    local = [s for r in auto.launches for s in r.spans
             if s.cat == "dma" and "VMEM" in (s.args["src"], s.args["dst"])]
    assert local  # the operands XLA put in VMEM were copied VMEM -> VMEM
    assert auto.predicted_seconds < hbm.predicted_seconds


@pytest.mark.timeout(300)
def test_a_kernel_on_the_programs_arguments_reads_hbm():
    arg = jax.ShapeDtypeStruct((ROWS, 128), jnp.float32)
    p = pi.predict(lambda x: _scale(x, 3.0), arg, chip="v5e", compile_check="off")
    assert p.placement.startswith("every operand in HBM (XLA's placement, libtpu ")
    assert all(s.args["src"] != "VMEM" and s.args["dst"] != "VMEM"
               for r in p.launches for s in r.spans if s.cat == "dma")


def test_the_reader_finds_each_custom_calls_memory_spaces():
    text = "\n".join([
        "HloModule m, is_scheduled=true",
        "ENTRY %main (p: f32[8,128]) -> f32[8,128] {",
        "  %p = f32[8,128]{1,0:T(8,128)} parameter(0)",
        "  %c = f32[8,128]{1,0:T(8,128)S(1)} copy(%p)",
        "  %i = s32[2]{0:T(128)S(1)} constant({1, 2})",
        '  %k.1 = (f32[8,128]{1,0:T(8,128)S(1)}, bf16[8,128]{1,0:T(8,128)(2,1)}) '
        'custom-call(%i, %c, %p), custom_call_target="tpu_custom_call", '
        'backend_config={"custom_call_config":{"body":"x(y)"}}',
        "  ROOT %g = f32[8,128]{1,0:T(8,128)} get-tuple-element(%k.1), index=0",
        "}",
    ])
    (call,) = custom_call_placement(text)
    assert call.name == "k.1"
    assert call.operands == (("s32[2]", 1), ("f32[8,128]", 1), ("f32[8,128]", 0))
    assert call.results == (("f32[8,128]", 1), ("bf16[8,128]", 0))
