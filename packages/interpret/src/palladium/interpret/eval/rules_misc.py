"""Rules for grid queries, axis indices, the hardware PRNG, ``pltpu.roll`` and no-op
annotations."""

from __future__ import annotations

import zlib

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import UnsupportedFeatureError
from palladium.interpret.eval.context import Equation, KernelContext, Value
from palladium.interpret.eval.refs import tpu_bitcast
from palladium.interpret.eval.registry import rule


@rule(jc.program_id_p)
def _program_id(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    return [np.int32(ev.program_ids()[eqn.params["axis"]])]


@rule(jc.num_programs_p)
def _num_programs(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    return [np.int32(ev.program_counts()[eqn.params["axis"]])]


@rule(jc.axis_index_p)
def _axis_index(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    name = eqn.params["axis_name"]
    names = name if isinstance(name, tuple) else (name,)
    index = 0
    for n in names:
        value, size = ev.axis_index(n, eqn)
        index = index * size + value
    return [np.int32(index)]


@rule(jc.multiple_of_p)
def _multiple_of(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    return [invals[0]]


@rule(jc.trace_value_p)
def _no_op(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    return []


@rule(jc.delay_p)
def _delay(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    # A core that waits lets the others run: a spin-wait loop makes progress.
    ev.sim.yield_point(ev.site(eqn))
    return []


@rule(jc.touch_p)
def _touch(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    # A scheduling dependency only; the first operand passes through.
    return [invals[0]] if eqn.outvars else []


@rule(jc.tpu_bitcast_p)
def _bitcast(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    return [tpu_bitcast(np.asarray(invals[0]), eqn.outvars[0].aval.dtype)]


def tpu_roll(x: np.ndarray, shift: int, axis: int, stride: int | None = None,
             stride_axis: int | None = None) -> np.ndarray:
    """``pltpu.roll``: ``np.roll(x, shift, axis)``; with ``stride``, slice ``i`` along
    ``stride_axis`` is rolled by ``shift + i * stride`` instead (the TPU's strided
    rotate): ``out[.., j, .., i, ..] = x[.., (j - shift - i * stride) mod n, .., i, ..]``."""
    if stride is None or stride_axis is None:
        return np.roll(x, shift, axis)
    n = x.shape[axis]
    view_j = [1] * x.ndim
    view_j[axis] = n
    view_i = [1] * x.ndim
    view_i[stride_axis] = x.shape[stride_axis]
    j = np.arange(n).reshape(view_j)
    i = np.arange(x.shape[stride_axis]).reshape(view_i)
    source = np.broadcast_to((j - shift - i * stride) % n, x.shape)
    return np.take_along_axis(x, source, axis)


@rule(jc.tpu_roll_p)
def _roll(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    x, shift = invals
    p = eqn.params
    return [tpu_roll(np.asarray(x), int(np.asarray(shift)), p["axis"], p["stride"],
                     p["stride_axis"])]


@rule(jc.reciprocal_p)
def _reciprocal(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    # pl.reciprocal(x, approx=...): the exact reciprocal is a valid approximation; bf16
    # and f16 are computed in f32 and rounded once.
    x = np.asarray(invals[0])
    dtype = eqn.outvars[0].aval.dtype
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.float32(1) / x.astype(np.float32) if x.dtype.itemsize < 4 else 1 / x
    return [np.asarray(out).astype(dtype)]


# The TPU's hardware PRNG is not reproducible bit for bit; palladium models it as a
# Philox stream per core, keyed by the kernel's seeds and InterpretParams.random_seed,
# so the same seeds give the same bits on every run and every core.
@rule(jc.prng_seed_p)
def _prng_seed(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    seeds = [int(np.asarray(s).astype(np.int64)) & 0xFFFFFFFF for s in invals]
    material = np.array([ev.params.seed & 0xFFFFFFFF, *seeds], dtype=np.uint64)
    key = zlib.crc32(material.tobytes())
    ev.state.prng = np.random.Generator(np.random.Philox(key=[key, len(seeds)]))
    return []


@rule(jc.prng_random_bits_p)
def _prng_random_bits(ev: KernelContext, eqn: Equation, invals: list[Value]) -> list[Value]:
    if ev.state.prng is None:
        raise UnsupportedFeatureError(
            f"pltpu.prng_random_bits before pltpu.prng_seed ({ev.site(eqn)})"
        )
    aval = eqn.outvars[0].aval
    bits = ev.state.prng.integers(0, 2**32, size=aval.shape, dtype=np.uint64).astype(np.uint32)
    return [bits.view(np.int32).astype(aval.dtype, copy=False)]
