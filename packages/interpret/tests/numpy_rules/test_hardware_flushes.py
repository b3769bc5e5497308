"""The rules' hardware path: where the FP environment flushes f32 subnormals as XLA CPU
does (DAZ and FTZ: a launch runs inside XLA's execution, which sets both), the rules of
IEEE arithmetic (add, sub, mul, square, div, reduce_sum, reduce_prod) skip their own
flushes. They must give exactly the bits of the flushing path, on every operand: checked
inside a host callback on operands full of subnormals, signed zeros, infinities and NaNs,
and across a kernel launch against jax's own jit."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl

from palladium.interpret import InterpretParams
from palladium.interpret.numpy_rules import NUMPY_RULES, PREFLUSHED_RULES
from palladium.interpret.numpy_rules.common import HARDWARE_FLUSHES, hardware_flushes

F32 = np.float32
BINARY = (lax.add_p, lax.sub_p, lax.mul_p, lax.div_p)
UNARY = (lax.square_p,)
REDUCTIONS = (lax.reduce_sum_p, lax.reduce_prod_p)


def _operands(seed: int, shape=(16, 32), nans: bool = True) -> np.ndarray:
    """f32 values drawn from every class: subnormals of both signs, signed zeros, the
    smallest normals, values whose products and differences underflow, infinities,
    NaNs and ordinary numbers."""
    rng = np.random.default_rng(seed)
    classes = [
        rng.integers(1, 0x800000, shape, dtype=np.uint32),  # subnormal
        np.zeros(shape, np.uint32),  # zero
        rng.integers(0x800000, 0x1000000, shape, dtype=np.uint32),  # tiny normal
        rng.integers(0x0C000000, 0x20000000, shape, dtype=np.uint32),  # ~1e-31..1e-19
        rng.integers(0x3C000000, 0x44000000, shape, dtype=np.uint32),  # ordinary
        np.full(shape, 0x7F800000, np.uint32),  # infinity (not drawn without nans)
        rng.integers(0x7F800001, 0x7FFFFFFF, shape, dtype=np.uint32),  # NaN
    ]
    pick = rng.integers(0, len(classes) if nans else len(classes) - 2, shape)
    bits = np.choose(pick, classes).astype(np.uint32)
    bits |= (rng.integers(0, 2, shape, dtype=np.uint32) << 31).astype(np.uint32)
    return bits.view(F32)


@contextlib.contextmanager
def _flag(value: bool):
    token = HARDWARE_FLUSHES.set(value)
    try:
        yield
    finally:
        HARDWARE_FLUSHES.reset(token)


def _both_paths(rule, *args, **params):
    with np.errstate(all="ignore"):
        with _flag(False):
            flushing = rule(*args, **params)
        with _flag(True):
            hardware = rule(*args, **params)
    return np.asarray(flushing), np.asarray(hardware)


def _compare_all(seed: int) -> np.ndarray:
    """Inside XLA's FP environment: 1 where both paths agree bit for bit (or the
    environment does not flush, where the hardware path is never taken), per check."""
    if not hardware_flushes():
        return np.array([-1], np.int32)
    x, y = _operands(seed), _operands(seed + 1000)
    results = []
    for table in (NUMPY_RULES, PREFLUSHED_RULES):
        for prim in BINARY:
            for a, b in ((x, y), (x, y[:1, :1].reshape(())), (x[:1], y)):
                results.append(_both_paths(table[prim], a, b))
        for prim in UNARY:
            results.append(_both_paths(table[prim], x, accuracy=None))
        for prim in REDUCTIONS:
            for axes in ((0,), (1,), (0, 1)):
                results.append(_both_paths(table[prim], x, axes=axes))
    same = [np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in results]
    return np.array(same, np.int32)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(6))
def test_the_hardware_path_gives_the_flushing_paths_bits_inside_xla(seed):
    expected = 2 * (len(BINARY) * 3 + len(UNARY) + len(REDUCTIONS) * 3)
    out = jax.ShapeDtypeStruct((expected,), np.int32)
    got = np.asarray(jax.jit(lambda: jax.pure_callback(
        lambda: np.resize(_compare_all(seed), expected), out))())
    # -1: XLA's environment does not flush on this machine, so no launch takes the path
    assert got.tolist() == [1] * expected or got.tolist() == [-1] * expected


def test_the_probe_reads_the_environment():
    """Outside XLA (the main thread's default environment) subnormals are kept."""
    sub = np.array([1e-40], F32)
    keeps = bool(np.multiply(sub, F32(2.0**64)).view(np.uint32)[0] & 0x7FFFFFFF)
    assert hardware_flushes() is not keeps


def test_a_launch_gives_the_same_bits_with_the_hardware_path_and_without(monkeypatch):
    """Each kernel body runs with the flag read from its thread's environment; the same
    launch with the flag forced off (every rule flushing) gives the same bits."""
    from palladium.interpret.eval import evaluator

    def body(x, y):
        return (x * y + x - y) / (y + 1.0), jnp.sum(x * x, axis=0, keepdims=True)

    def kernel(x_ref, y_ref, o_ref, s_ref):
        o_ref[...], s_ref[...] = body(x_ref[...], y_ref[...])

    x, y = _operands(7, (8, 128)), _operands(8, (8, 128))
    call = pl.pallas_call(kernel, out_shape=jax.eval_shape(body, x, y),
                          interpret=InterpretParams(check_lowering=False))
    probes = []
    probe = evaluator.hardware_flushes
    monkeypatch.setattr(evaluator, "hardware_flushes", lambda: probes.append(probe()) or probes[-1])
    fast = call(x, y)
    monkeypatch.setattr(evaluator, "hardware_flushes", lambda: False)
    slow = call(x, y)
    for f, s in zip(fast, slow):
        np.testing.assert_array_equal(np.asarray(f).view(np.uint32), np.asarray(s).view(np.uint32))
    assert len(probes) == 1  # one core's run, one probe


def test_a_cores_run_probes_its_environment_once(monkeypatch):
    """Probed once for a core's whole grid (the thread of one host callback), not per
    grid step; the bits are those of the software flushes."""
    from palladium.interpret.eval import evaluator

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] * y_ref[...] - x_ref[...]

    x, y = _operands(9, (64, 128)), _operands(10, (64, 128))
    call = pl.pallas_call(
        kernel, grid=(8,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))] * 2,
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((64, 128), F32),
        interpret=InterpretParams(check_lowering=False, compile_segments=False))
    probes = []
    probe = evaluator.hardware_flushes
    monkeypatch.setattr(evaluator, "hardware_flushes", lambda: probes.append(probe()) or probes[-1])
    fast = np.asarray(call(x, y))
    assert len(probes) == 1
    monkeypatch.setattr(evaluator, "hardware_flushes", lambda: False)
    slow = np.asarray(call(x, y))
    np.testing.assert_array_equal(fast.view(np.uint32), slow.view(np.uint32))
