"""Shared helpers of palladium.pipeline's tests: run, export and count DMAs of kernels.

Every kernel is a ``pallas_call`` over HBM (``pl.ANY``) operands whose body calls an
emitter; the emitter is a parameter so that the same kernel runs with palladium's and
jax's ``emit_pipeline``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

#: Why a ``tpu`` test did not run here.
NO_TPU = ("needs a TPU as jax's default backend (here it is the CPU); on a TPU VM run "
          "`nox -s tpu` or `pytest -m tpu packages/pipeline/tests`")

#: device_kind strings of the TPUs every kernel is exported for.
TPU_KINDS = {"v5e": "TPU v5 lite", "v6e": "TPU v6 lite", "v7x": "TPU7x"}


def tpu_mesh(kind: str = "TPU v5 lite"):
    """An abstract mesh whose abstract device is the TPU ``kind``."""
    # jax 0.10.0's AbstractDevice has no ``platform`` (the kind alone names the TPU).
    has_platform = "platform" in inspect.signature(AbstractDevice).parameters
    platform = {"platform": "tpu"} if has_platform else {}
    device = AbstractDevice(device_kind=kind, num_cores=1, **platform)
    return AbstractMesh((1,), ("x",), abstract_device=device)


@contextlib.contextmanager
def on_tpu(kind: str = "TPU v5 lite"):
    """Trace as for a TPU (jax's own helpers read the generation from the mesh)."""
    with use_abstract_mesh(tpu_mesh(kind)):
        yield


def hbm_call(kernel, out_shape, *, interpret=False, grid=(), scratch_shapes=(),
             in_specs=None, out_specs=None, input_output_aliases=None,
             dimension_semantics=None, num_scalar_prefetch=0):
    """``pallas_call(kernel)`` with every operand in HBM unless specs say otherwise."""
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    outs = out_shape if isinstance(out_shape, (list, tuple)) else [out_shape]

    def call(*args):
        n_in = len(args) - num_scalar_prefetch
        params = None
        if dimension_semantics is not None:
            params = pltpu.CompilerParams(dimension_semantics=dimension_semantics)
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=num_scalar_prefetch,
            grid=grid,
            in_specs=in_specs if in_specs is not None else [any_spec] * n_in,
            out_specs=out_specs if out_specs is not None
            else ([any_spec] * len(outs) if isinstance(out_shape, (list, tuple)) else any_spec),
            scratch_shapes=scratch_shapes,
        )
        return pl.pallas_call(
            kernel, out_shape=out_shape, grid_spec=grid_spec, interpret=interpret,
            input_output_aliases=input_output_aliases or {}, compiler_params=params,
        )(*args)

    return call


#: jax 0.10.0's ``pltpu.InterpretParams`` has no ``buffer_bounds`` (no padded buffers).
needs_padded_buffer_bounds = pytest.mark.skipif(
    "buffer_bounds" not in {f.name for f in dataclasses.fields(pltpu.InterpretParams)},
    reason="jax 0.10.0: pltpu.InterpretParams has no buffer_bounds='padded'",
)

#: The two interpreters every feature is checked under.
MODES = ("tpu_interpret", "interpret_true")
#: The kernel compiled by Mosaic and run on the TPU: a test parametrized with this mode is
#: marked ``tpu`` (conftest.py) and skipped where jax's default backend is not a TPU.
CHIP = "chip"
#: The interpreters and the chip.
ALL_MODES = (*MODES, CHIP)


@functools.cache
def on_a_tpu_host() -> bool:
    """Whether jax's default backend is a TPU (the chip mode runs there only)."""
    return jax.default_backend() == "tpu"


def run(make_call, mode: str, *args, padded: bool = False, num_cores: int = 1):
    """Run ``make_call(interpret=...)(*args)`` under one of :data:`ALL_MODES`.

    On a TPU host the interpreters run on the CPU device (conftest.py makes it the default
    device of every test not marked ``tpu``); :data:`CHIP` compiles for the TPU and runs
    there."""
    if mode == CHIP:
        if not on_a_tpu_host():
            pytest.skip(NO_TPU)
        tpu = jax.devices()[0]
        args = tuple(jax.device_put(a, tpu) for a in args)
        return jax.block_until_ready(jax.jit(make_call(interpret=False))(*args))
    if mode == "tpu_interpret":
        bounds = {"buffer_bounds": "padded"} if padded else {}
        params = pltpu.InterpretParams(num_cores_or_threads=num_cores, **bounds)
        # jax 0.10.2's interpreter asks the TPU generation for padded buffers and
        # crashes on a CPU device kind; an abstract TPU device answers it.
        with on_tpu():
            return jax.block_until_ready(make_call(interpret=params)(*args))
    return jax.block_until_ready(jax.jit(make_call(interpret=True))(*args))


def export_mlir(make_call, *args, kind: str) -> str:
    """Export for TPU ``kind`` and return the module text (proves Mosaic lowering)."""
    structs = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in args]
    with on_tpu(kind):
        exported = jax.export.export(jax.jit(make_call(interpret=False)),
                                     platforms=["tpu"])(*structs)
    return exported.mlir_module()


def assert_exports(make_call, *args):
    for kind in TPU_KINDS.values():
        text = export_mlir(make_call, *args, kind=kind)
        assert "tpu_custom_call" in text, kind


def count_dma_starts(make_call, *args, kind: str = "TPU v5 lite") -> int:
    """The number of ``dma_start`` equations in the traced kernel (all sub-jaxprs)."""
    with on_tpu(kind):
        jaxpr = jax.make_jaxpr(make_call(interpret=False))(*args)
    return str(jaxpr).count("dma_start[")


def call_maker(kernel, shape, **hbm_kwargs):
    """``make_call(interpret)``: :func:`hbm_call` of ``kernel`` with one float32 output of
    ``shape`` (``hbm_kwargs`` as for :func:`hbm_call`), the form :func:`run`,
    :func:`assert_exports` and :func:`count_dma_starts` take."""

    def make_call(interpret):
        return hbm_call(kernel, jax.ShapeDtypeStruct(shape, jnp.float32), interpret=interpret,
                        **hbm_kwargs)

    return make_call


def accumulating_matmul_body(x, y, o):
    """``o += x @ y`` over the k axis (grid axis 2), zeroing ``o`` at the first k step."""

    @pl.when(pl.program_id(2) == 0)
    def _():
        o[...] = jnp.zeros_like(o)

    o[...] += jnp.dot(x[...], y[...], preferred_element_type=jnp.float32)
