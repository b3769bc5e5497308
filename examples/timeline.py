"""A kernel's predicted TPU timeline: the Pallas matmul guide's kernel on a simulated
TPU v5e, with one and with two input buffers, summarised and drawn.

    python examples/timeline.py [out.png]    writes docs/timeline.png by default

The picture (one row per core and DMA engine) shows the double-buffered run hiding its
block fetches behind the MXU work while the single-buffered one waits for each. Drawing
needs matplotlib (``pip install 'palladium-interpret[timeline]'``); without it the
example says so before it simulates anything and writes the Chrome trace (``out.json``,
for https://ui.perfetto.dev) instead.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi


def matmul(x, y, *, bm, bk, bn, buffers, interpret):
    def kernel(x_ref, y_ref, z_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            z_ref[...] = acc_ref[...].astype(z_ref.dtype)

    (m, k), (_, n) = x.shape, y.shape
    mode = pl.Buffered(buffers)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk), pipeline_mode=mode),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j), pipeline_mode=mode)],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
    )(x, y)


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def main(path: str, plot: bool | None = None) -> str:
    """Simulate both runs and draw them to ``path`` (``plot``), else save their Chrome
    trace next to it (``.json``); returns the file written."""
    if plot is None:
        plot = have_matplotlib()
    if not plot:
        path = os.path.splitext(path)[0] + ".json"
        print("matplotlib is not installed (pip install 'palladium-interpret[timeline]' "
              f"draws the picture): writing the Chrome trace {path} instead")
    x = jnp.ones((512, 2048), jnp.bfloat16)
    y = jnp.ones((2048, 512), jnp.bfloat16)
    params = pi.InterpretParams(chip="v5e", skip_floating_point_ops=True)
    with pi.timeline() as tl:
        for buffers in (1, 2):
            jax.block_until_ready(matmul(x, y, bm=256, bk=512, bn=512, buffers=buffers,
                                         interpret=params))
    one, two = tl.launches
    print(one.summary())
    print()
    print(two.summary())
    if plot:
        tl.plot(path, title=f"matmul 512x2048x512 bf16 on TPU v5e: Buffered(1) "
                            f"{one.predicted_seconds * 1e6:.1f} us, then Buffered(2) "
                            f"{two.predicted_seconds * 1e6:.1f} us")
    else:
        tl.save(path)
    print(f"\nwrote {path}")
    return path


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "docs", "timeline.png"))
