"""Kernel launch semantics: block copies happen only when a block index changes (and on
each core's first/last grid point), and launch-level errors name the pallas_call line."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _launch_harness import out_of_bounds_block_call, revisit_call
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import (
    InterpretParams,
    LoggingMode,
    OutOfBoundsError,
    RevisitError,
    errors_as_raised,
)

A = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
B = jnp.arange(8 * 384, dtype=jnp.float32).reshape(8, 384) / 7
C = jnp.full((8, 128), 3.0, jnp.float32)


def abc_kernel(a_ref, b_ref, c_ref, o_ref):
    o_ref[...] = a_ref[...] + b_ref[...] * c_ref[...]


def _abc(params, semantics):
    return pl.pallas_call(
        abc_kernel,
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        grid=(2, 3),
        in_specs=[
            pl.BlockSpec((8, 128), lambda i, j: (i, 0)),  # changes with i
            pl.BlockSpec((8, 128), lambda i, j: (0, j)),  # changes every step
            pl.BlockSpec((8, 128), lambda i, j: (0, 0)),  # never changes
        ],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
        interpret=params,
    )(A, B, C)


def _copies(caplog, params, semantics):
    caplog.clear()
    with caplog.at_level("DEBUG", logger="palladium.interpret"):
        out = _abc(params, semantics)
    # The output block (i, 0) is revisited for j = 0..2 and accumulates nothing: the
    # last write (j = 2) wins.
    np.testing.assert_array_equal(out, A + np.concatenate([B[:, 256:]] * 2) * 3.0)
    counts = {}
    for r in caplog.records:
        msg = r.getMessage()
        if "copy block" in msg:
            name = msg.split("'")[1]
            counts[name] = counts.get(name, 0) + 1
    return counts


@pytest.mark.parametrize(
    "cores, semantics, expected",
    [
        # one core: a when i changes (2), b every step (6), c once, o when i changes (2)
        (1, ("arbitrary", "arbitrary"), {"a_ref": 2, "b_ref": 6, "c_ref": 1, "o_ref": 2}),
        # two cores, one i each: every core copies on its first and last grid point
        (2, ("parallel", "arbitrary"), {"a_ref": 2, "b_ref": 6, "c_ref": 2, "o_ref": 2}),
    ],
)
def test_block_copies_only_when_the_block_index_changes(caplog, cores, semantics, expected):
    params = InterpretParams(num_cores_or_threads=cores, logging_mode=LoggingMode.MEMORY)
    assert _copies(caplog, params, semantics) == expected


def test_block_copy_errors_name_the_pallas_call_line():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    f = out_of_bounds_block_call(kernel, InterpretParams())
    with pytest.raises(OutOfBoundsError) as info, errors_as_raised():
        line = inspect.currentframe().f_lineno + 1
        f(A)
    msg = str(info.value)
    assert f"(test_launch.py:{line})" in msg, msg
    for part in ("copy of block (5, 0) of input 'x_ref'", "kernel 'kernel'", "grid point (0,)",
                 "core 0"):
        assert part in msg, (part, msg)


def test_revisit_error_names_the_pallas_call_line_under_jit():
    def revisit_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    @jax.jit
    def f(x):
        return revisit_call(revisit_kernel, InterpretParams())(x)  # the line the error names

    line = inspect.getsourcelines(f.__wrapped__)[1] + 2
    with pytest.raises(RevisitError) as info, errors_as_raised():
        f(A)
    msg = str(info.value)
    assert f"(test_launch.py:{line})." in msg, msg
    assert "output 'o_ref' block (0, 0)" in msg and "grid point (1, 0)" in msg


def test_parallel_grid_points_split_across_cores_in_seeded_order():
    seen = []
    params = InterpretParams(num_cores_or_threads=2, random_seed=7,
                             grid_point_recorder=lambda p, c: seen.append((p, c)))
    _abc(params, ("parallel", "arbitrary"))
    by_core = {c: [p for p, cc in seen if cc == c] for c in (0, 1)}
    # each core runs one i (a permutation of range(2)), j in order within it
    assert {by_core[0][0][0], by_core[1][0][0]} == {0, 1}
    for c in (0, 1):
        i = by_core[c][0][0]
        assert by_core[c] == [(i, j) for j in range(3)]


def test_kernel_preprocessing_is_cached_across_launches(monkeypatch):
    from palladium.interpret.eval import program

    compiled = []
    original = program.compile_jaxpr
    monkeypatch.setattr(program, "compile_jaxpr",
                        lambda jaxpr, **kw: compiled.append(jaxpr) or original(jaxpr, **kw))
    f = jax.jit(lambda a, b, c: _abc_call(a, b, c))
    np.testing.assert_array_equal(f(A, B, C), _expected_abc())
    first = len(compiled)
    assert first >= 1
    for scale in (2.0, 3.0):
        np.testing.assert_array_equal(f(A * scale, B, C), _expected_abc(scale))
    assert len(compiled) == first  # later launches reuse the compiled programs


def _abc_call(a, b, c):
    return pl.pallas_call(
        abc_kernel,
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        grid=(2,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0)),
                  pl.BlockSpec((8, 128), lambda i: (0, 0)),
                  pl.BlockSpec((8, 128), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        interpret=InterpretParams(),
    )(a, b[:, :128], c)


def _expected_abc(scale=1.0):
    return A * scale + np.concatenate([B[:, :128]] * 2) * 3.0
