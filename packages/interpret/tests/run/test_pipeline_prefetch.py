"""Issue 42, item 3: the BlockSpec pipeline's timing. On a TPU the next step's input
blocks are copied in while the current step computes, before its outputs are written
back. An in-place kernel (``input_output_aliases={0: 0}``) whose output block runs one
ahead of its input (input block i, output block i + 1) therefore reads the OLD block
i + 1 at step i + 1 (measured on a v5e: 4 of 5 runs read old rows only, 1 of 5 raced:
``benchmarks/chip/compiled_semantics.py``): it is a race, and its common-case result
is the old block's, not a cascade of the steps' outputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from palladium.interpret import DataRaceError, InterpretParams, errors_as_raised
from palladium.interpret.compiled import compiled_launch
from palladium.interpret.run.execution_plan import WHOLE_LAUNCH

pytestmark = pytest.mark.timeout(300)

NB, BR, C = 8, 16, 128
MARK = 1000.0


def _ahead(params):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + MARK

    return jax.jit(lambda x: pl.pallas_call(
        kernel, grid=(NB - 1,), in_specs=[pl.BlockSpec((BR, C), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BR, C), lambda i: (i + 1, 0)), input_output_aliases={0: 0},
        out_shape=jax.ShapeDtypeStruct((NB * BR, C), jnp.float32), interpret=params)(x))


def _x():
    return np.broadcast_to(np.arange(NB * BR, dtype=np.float32)[:, None], (NB * BR, C)).copy()


def _pipelined(x):
    """What the pipeline computes in the common case: step i reads the old block i."""
    out = x.copy()
    out[BR:] = x[:-BR] + MARK
    return out


@pytest.mark.parametrize("whole", [True, False])
def test_an_output_running_ahead_of_its_aliased_input_reads_the_old_block(monkeypatch, whole):
    """Calls 1-4 (from call 2 the whole-launch executable, when allowed to compile the
    kernel, or its flagged fallback): every step reads the old block, none a cascade."""
    monkeypatch.setattr(compiled_launch, "MIN_EQUATIONS_PER_LAUNCH", 0 if whole else 1 << 60)
    x = _x()
    call = _ahead(InterpretParams(random_seed=4230 + whole))
    flag = "an input block prefetched before its write-back"
    before = compiled_launch.STATS.copy()
    for n in range(4):
        np.testing.assert_array_equal(np.asarray(call(x)), _pipelined(x), err_msg=f"call {n + 1}")
    # (the whole-launch executable copies blocks between steps: flagged, run simulated)
    assert compiled_launch.STATS[flag] - before[flag] == (5 - WHOLE_LAUNCH if whole else 0)
    assert compiled_launch.STATS["compiled"] == before["compiled"]
    simulated = _ahead(InterpretParams(compile_segments=False))
    np.testing.assert_array_equal(np.asarray(simulated(x)), _pipelined(x))


def test_an_output_running_ahead_of_its_aliased_input_is_a_race():
    with pytest.raises(DataRaceError) as race, errors_as_raised():
        _ahead(InterpretParams(detect_races=True))(_x()).block_until_ready()
    text = str(race.value)
    assert "write-back of block (1, 0) of output" in text
    assert "copy of block (1, 0) of input" in text


def test_an_in_place_kernel_on_the_same_block_is_no_race():
    """Input block i, output block i (the usual in-place kernel): each write-back is of
    the block the step read, after the next block was copied in: no race, no cascade."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + 1.0

    x = _x()
    call = jax.jit(lambda x: pl.pallas_call(
        kernel, grid=(NB,), in_specs=[pl.BlockSpec((BR, C), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BR, C), lambda i: (i, 0)), input_output_aliases={0: 0},
        out_shape=jax.ShapeDtypeStruct((NB * BR, C), jnp.float32),
        interpret=InterpretParams(detect_races=True))(x))
    with errors_as_raised():
        for _ in range(4):
            np.testing.assert_array_equal(np.asarray(call(x)), x * 2.0 + 1.0)


def test_an_output_behind_its_aliased_input_reads_what_the_step_before_wrote_back():
    """Input block i + 1, output block i: step i writes back block i, which no later
    step reads; step i reads block i + 1, which no earlier step wrote: no race."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + MARK

    x = _x()
    call = jax.jit(lambda x: pl.pallas_call(
        kernel, grid=(NB - 1,), in_specs=[pl.BlockSpec((BR, C), lambda i: (i + 1, 0))],
        out_specs=pl.BlockSpec((BR, C), lambda i: (i, 0)), input_output_aliases={0: 0},
        out_shape=jax.ShapeDtypeStruct((NB * BR, C), jnp.float32),
        interpret=InterpretParams(detect_races=True))(x))
    expected = x.copy()
    expected[:-BR] = x[BR:] + MARK
    with errors_as_raised():
        np.testing.assert_array_equal(np.asarray(call(x)), expected)
