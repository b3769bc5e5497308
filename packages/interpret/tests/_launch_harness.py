"""Shared helpers of palladium.interpret's tests: the ``pallas_call`` set-ups that several
tests launch with different kernels, index maps and parameters.

The kernels stay in the tests: their names (and their source lines) are what the error
messages under test must name.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = (8, 128)


def blocked_call(kernel, *, rows, grid, in_map, out_map, interpret, semantics=None):
    """``pallas_call(kernel)`` of one float32 ``(rows, 128)`` input to one output of that
    shape, both in ``(8, 128)`` blocks chosen by ``in_map`` / ``out_map``."""
    params = None if semantics is None else pltpu.CompilerParams(dimension_semantics=semantics)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((rows, 128), jnp.float32),
        grid=grid,
        in_specs=[pl.BlockSpec(BLOCK, in_map)],
        out_specs=pl.BlockSpec(BLOCK, out_map),
        compiler_params=params,
        interpret=interpret,
    )


def out_of_bounds_block_call(kernel, interpret):
    """One grid point whose input block index (5, 0) is past the (8, 128) input."""
    return blocked_call(kernel, rows=8, grid=(1,), in_map=lambda i: (5, 0),
                        out_map=lambda i: (0, 0), interpret=interpret)


def revisit_call(kernel, interpret):
    """A (2, 2) grid whose output block (j, 0) is left at i = 0 and revisited at i = 1."""
    return blocked_call(kernel, rows=16, grid=(2, 2), in_map=lambda i, j: (j, 0),
                        out_map=lambda i, j: (j, 0), interpret=interpret)


def racy_call(interpret):
    """A kernel that reads its DMA's destination before waiting for the DMA (a race),
    on an (8, 128) f32 input in HBM."""
    def kernel(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm, buf, sem)
        copy.start()
        o_ref[...] = buf[...]  # reads the DMA's destination before the wait
        copy.wait()

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        interpret=interpret)


def core_map_call(kernel, params, num_cores=2):
    """``jit(f)``: ``f(x)`` runs ``kernel(x_ref, o_ref)`` on every core of a
    ``num_cores`` TensorCore mesh (``pl.core_map`` inside ``pl.run_state``, both refs in
    HBM, ``o`` starting as zeros) and returns ``o``. The kernel reads its core from
    ``jax.lax.axis_index("core")``; errors name it by its ``__name__``."""
    mesh = pltpu.create_tensorcore_mesh("core", num_cores=num_cores)

    @jax.jit
    def f(x):
        def body(refs):
            x_ref, o_ref = refs

            def per_core():
                kernel(x_ref, o_ref)

            per_core.__name__ = kernel.__name__  # what errors call the kernel
            pl.core_map(mesh, interpret=params)(per_core)

        _, out = pl.run_state(body)((x, jnp.zeros_like(x)))
        return out

    return f


def matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    """The Pallas TPU matmul guide's kernel body: an f32 accumulator in scratch over the
    third (reduction) grid dimension, written out at its last step."""

    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def four_launches(fn, *args):
    """Four calls of ``jax.jit(fn)`` on ``args`` after ``jax.clear_caches()`` (a new
    kernel each time): the first two simulated, the last two compiled whole (checked);
    their outputs as numpy arrays."""
    import numpy as np

    from palladium.interpret.compiled import compiled_launch
    from palladium.interpret.run.execution_plan import WHOLE_LAUNCH

    jax.clear_caches()
    call = jax.jit(fn)
    before = compiled_launch.STATS["compiled"]
    outs = [np.asarray(call(*args)) for _ in range(4)]
    assert compiled_launch.STATS["compiled"] - before == 5 - WHOLE_LAUNCH
    return outs
