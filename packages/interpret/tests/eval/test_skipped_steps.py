"""Issue 40, item 4: a launch that skips steps runs each program without them
(``eval/skipped_steps.py``): the same prediction, spans and equations told as the program
with every step run; and ``predict``'s zero operands (``tune/zero_operands.py``)."""

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

import palladium.interpret as pi
from palladium.interpret.eval.program import compile_jaxpr
from palladium.interpret.eval.skipped_steps import skipping
from palladium.interpret.perf.recorder import TimelineRecorder
from palladium.interpret.tune.zero_operands import concrete_operand

evaluator_module = importlib.import_module("palladium.interpret.eval.evaluator")

S = jax.ShapeDtypeStruct


def _paged():
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    rng = np.random.default_rng(1)
    lengths = jnp.asarray([37, 100], jnp.int32)
    indices = jnp.asarray(rng.permutation(16).reshape(2, 8), jnp.int32)
    return (functools.partial(paged_attention, pages_per_compute_block=4),
            (S((2, 2, 128), jnp.float32), S((2, 16, 16, 128), jnp.float32),
             S((2, 16, 16, 128), jnp.float32), lengths, indices))


def _flash():
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    sizes = fa.BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1)
    return (functools.partial(fa.flash_attention, causal=True, block_sizes=sizes),
            tuple(S((1, 2, 512, 128), jnp.float32) for _ in range(3)))


def _told(monkeypatch):
    """Every equation the timeline's recorders are told, in order (by primitive)."""
    told: list[str] = []
    compute, compute_run = TimelineRecorder.compute, TimelineRecorder.compute_run

    def one(self, core, op):
        told.append(str(op.primitive))
        compute(self, core, op)

    def run(self, core, ops):
        told.extend(str(op.primitive) for op in ops)
        compute_run(self, core, ops)

    monkeypatch.setattr(TimelineRecorder, "compute", one)
    monkeypatch.setattr(TimelineRecorder, "compute_run", run)
    return told


@pytest.mark.timeout(300)
@pytest.mark.parametrize("make", [_paged, _flash], ids=["paged attention", "flash causal"])
def test_a_launch_without_its_skipped_steps_predicts_exactly_what_every_step_does(
        monkeypatch, make):
    fn, args = make()
    with monkeypatch.context() as m:
        told = _told(m)
        skipping_ = pi.predict(fn, *args, compile_check="off")
        told_skipping = list(told)
    with monkeypatch.context() as m:
        m.setattr(evaluator_module, "skipping", lambda prog, skip_float, unused: None)
        told = _told(m)
        every = pi.predict(fn, *args, compile_check="off")
    assert skipping_.predicted_seconds == every.predicted_seconds
    assert skipping_.launches[0].spans == every.launches[0].spans
    assert skipping_.launches[0].by_primitive == every.launches[0].by_primitive
    assert told_skipping == told and told


def test_a_programs_variant_leaves_out_the_float_steps_and_keeps_their_results():
    def body(x, i):
        y = jnp.exp(x) * 2.0  # two float equations
        return y, i + 1  # an integer one, computed

    jaxpr = jax.make_jaxpr(body)(jnp.ones((8, 128), jnp.float32), 3).jaxpr
    prog = compile_jaxpr(jaxpr, segments=False)
    assert skipping(prog, False, None) is None  # nothing skipped: the program itself
    variant = skipping(prog, True, None)
    assert variant is skipping(prog, True, None)  # made once
    assert len(prog.fast) == 3 and len(variant.fast) == 1
    assert [e[0] is None for e in variant.observed] == [True, True, False]
    assert variant.positions == (2,)
    y = variant.template[prog.out_slots[0]]
    assert y.shape == (8, 128) and np.isinf(y).all() and not y.flags.writeable


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32, jnp.bool_])
def test_predicts_zero_operands_are_zeros_jax_takes_without_a_copy(dtype):
    x = concrete_operand(S((64, 1024), dtype))
    assert x.shape == (64, 1024) and x.dtype == dtype and x.weak_type is False
    assert not np.asarray(x).any()
    assert x.unsafe_buffer_pointer() % 64 == 0
    assert concrete_operand(3) == 3  # not an abstract operand: as it is


def test_a_kernel_on_zero_operands_computes_with_them():
    def double(x):
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1.0),
                              out_shape=S(x.shape, x.dtype),
                              interpret=pi.InterpretParams())(x)

    out = double(concrete_operand(S((8, 128), jnp.float32)))
    assert (np.asarray(out) == 1.0).all()
