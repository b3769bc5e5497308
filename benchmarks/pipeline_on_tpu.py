"""palladium.pipeline's emitter against jax's ``pltpu.emit_pipeline`` on a real TPU.

Each case is one kernel written once with the emitter as a parameter; both versions are
compiled by Mosaic and timed on the chip by device time from the jax profiler's trace
(``palladium.interpret.measure``: median of 20 calls), and their outputs compared with each
other and with a numpy reference. Then the features jax 0.10.2's emitter lacks, each in a
kernel where it should win, against the best way to write that kernel with jax's emitter.

Needs a TPU as jax's default backend. Run on a TPU VM (PYTHONPATH with packages/*/src):

    python benchmarks/pipeline_on_tpu.py --out results.json

The numbers are in benchmarks/README.md ("The pipeline on a TPU v5e").
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.pipeline as pp
from palladium.interpret import measure

ANY = pl.BlockSpec(memory_space=pl.ANY)
JAX = (pltpu.emit_pipeline, pl.Buffered)
OURS = (pp.emit_pipeline, pp.Buffered)


def hbm_call(kernel, out_shape, *, num_scalar_prefetch=0, n_in=1, aliases=None):
    spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=num_scalar_prefetch, grid=(),
                                        in_specs=[ANY] * n_in, out_specs=ANY)
    return pl.pallas_call(kernel, out_shape=out_shape, grid_spec=spec,
                          input_output_aliases=aliases or {})


# --- kernels written once, emitter as a parameter --------------------------------------

def affine(shape, block, counts, impl):
    emit, buffered = impl
    steps = shape[0] // block[0]

    def kernel(x_hbm, o_hbm):
        def body(x, o):
            o[...] = x[...] * 2.0 + 1.0

        emit(body, grid=(steps,),
             in_specs=[pl.BlockSpec(block, lambda i: (i, 0), pipeline_mode=buffered(counts[0]))],
             out_specs=[pl.BlockSpec(block, lambda i: (i, 0),
                                     pipeline_mode=buffered(counts[1]))])(x_hbm, o_hbm)

    return hbm_call(kernel, jax.ShapeDtypeStruct(shape, jnp.float32))


def matmul(m, n, k, bm, bn, bk, impl):
    emit, _ = impl

    def kernel(x_hbm, y_hbm, o_hbm):
        def body(x, y, o):
            @pl.when(pl.program_id(2) == 0)
            def _():
                o[...] = jnp.zeros_like(o)

            o[...] += jnp.dot(x[...], y[...], preferred_element_type=jnp.float32)

        emit(body, grid=(m // bm, n // bn, k // bk),
             in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                       pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
             out_specs=[pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j))])(x_hbm, y_hbm, o_hbm)

    return hbm_call(kernel, jax.ShapeDtypeStruct((m, n), jnp.float32), n_in=2)


def gather(shape, block_rows, impl):
    """Scalar prefetch: block i of the output is block order[i] of the input."""
    emit, _ = impl

    def kernel(order_ref, x_hbm, o_hbm):
        def body(x, o):
            o[...] = x[...] + 1.0

        emit(body, grid=(shape[0] // block_rows,),
             in_specs=[pl.BlockSpec((block_rows, shape[1]), lambda i: (order_ref[i], 0))],
             out_specs=[pl.BlockSpec((block_rows, shape[1]), lambda i: (i, 0))])(x_hbm, o_hbm)

    return hbm_call(kernel, jax.ShapeDtypeStruct(shape, jnp.float32), num_scalar_prefetch=1)


def dynamic(shape, block_rows, impl):
    """A dynamic grid: the step count is read from SMEM at run time."""
    emit, _ = impl

    def kernel(n_ref, x_hbm, o_hbm):
        def body(x, o):
            o[...] = x[...] + 1.0

        spec = pl.BlockSpec((block_rows, shape[1]), lambda i: (i, 0))
        emit(body, grid=(n_ref[0],), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

    return hbm_call(kernel, jax.ShapeDtypeStruct(shape, jnp.float32), num_scalar_prefetch=1,
                    aliases={1: 0})


def nested(shape, outer_rows, inner_rows, impl):
    emit, _ = impl

    def kernel(x_hbm, o_hbm):
        def outer_body(x_slice, o_slice):
            inner = pl.BlockSpec((inner_rows, shape[1]), lambda i: (i, 0))

            def body(x, o):
                o[...] = x[...] + 1.0

            emit(body, grid=(outer_rows // inner_rows,), in_specs=[inner],
                 out_specs=[inner])(x_slice, o_slice)

        outer = pl.BlockSpec((outer_rows, shape[1]), lambda i: (i, 0),
                             memory_space=pltpu.HBM)
        emit(outer_body, grid=(shape[0] // outer_rows,), in_specs=[outer],
             out_specs=[outer])(x_hbm, o_hbm)

    return hbm_call(kernel, jax.ShapeDtypeStruct(shape, jnp.float32))


def accumulate_jax(shape, block):
    """acc += x with jax's emitter: acc is an input and an output (aliased buffers)."""

    def kernel(x_hbm, acc_in, acc_out):
        def body(x, a_in, a_out):
            a_out[...] = a_in[...] + x[...]

        spec = pl.BlockSpec(block, lambda i: (i, 0))
        pltpu.emit_pipeline(body, grid=(shape[0] // block[0],), in_specs=[spec, spec],
                            out_specs=[spec])(x_hbm, acc_in, acc_out)

    return hbm_call(kernel, jax.ShapeDtypeStruct(shape, jnp.float32), n_in=2,
                    aliases={1: 0})


def accumulate_ours(shape, block, counts=(2, 2)):
    """acc += x with palladium's input-output ref (one buffer pair for read and write)."""

    def kernel(x_hbm, acc_in, acc_hbm):
        del acc_in  # aliased with acc_hbm

        def body(x, acc):
            acc[...] += x[...]

        spec = pl.BlockSpec(block, lambda i: (i, 0))

        def with_buffers(allocs):
            pp.emit_pipeline(body, grid=(shape[0] // block[0],))(x_hbm, acc_hbm,
                                                                  allocations=allocs)

        pl.run_scoped(with_buffers, [
            pp.BufferedRef.input(spec, jnp.float32, buffer_count=2),
            pp.BufferedRef.input_output(spec, jnp.float32, buffer_count=counts)])

    return hbm_call(kernel, jax.ShapeDtypeStruct(shape, jnp.float32), n_in=2,
                    aliases={1: 0})


def ragged_ours(shape, block):
    """A last block with fewer rows than the block: palladium clamps its DMA."""
    steps = -(-shape[0] // block[0])

    def kernel(x_hbm, o_hbm):
        def body(x, o):
            o[...] = x[...] * 2.0 + 1.0

        spec = pl.BlockSpec(block, lambda i: (i, 0))
        pp.emit_pipeline(body, grid=(steps,), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

    return hbm_call(kernel, jax.ShapeDtypeStruct(shape, jnp.float32))


def ragged_jax(shape, block):
    """jax's emitter needs whole blocks: pad to a multiple, run, slice."""
    rows = -(-shape[0] // block[0]) * block[0]
    call = affine((rows, shape[1]), block, (2, 2), JAX)

    def f(x):
        return call(jnp.pad(x, ((0, rows - shape[0]), (0, 0))))[: shape[0]]

    return f


# --- the runs -----------------------------------------------------------------------

def timed(name, fn, *args):
    """``fn``'s output and its device time on the chip (``name``: for the log)."""
    out = np.asarray(jax.block_until_ready(jax.jit(fn)(*args)))
    return measure(fn, *args).seconds, out


def compare(rows, case, make_ours, make_jax, args, reference, tol=1e-6):
    timings = {}
    for impl, make in (("palladium", make_ours), ("jax", make_jax)):
        try:
            timings[impl] = timed(f"{case}_{impl}", make, *args)
        except Exception as e:  # a kernel that does not compile is a result too
            timings[impl] = f"{type(e).__name__}: {str(e)[:400]}"
    if any(isinstance(t, str) for t in timings.values()):
        rows.append({"case": case, **{f"{impl}_error": t for impl, t in timings.items()
                                      if isinstance(t, str)}})
        if not isinstance(timings["palladium"], str):
            t_ours, out_ours = timings["palladium"]
            rows[-1].update(palladium_us=t_ours * 1e6,
                            ok=bool(np.allclose(out_ours, reference, rtol=tol)))
        print(json.dumps(rows[-1]), flush=True)
        return
    (t_ours, out_ours), (t_jax, out_jax) = timings["palladium"], timings["jax"]
    err = float(np.max(np.abs(out_ours - reference)) / max(1.0, np.max(np.abs(reference))))
    rows.append({"case": case, "palladium_us": t_ours * 1e6, "jax_us": t_jax * 1e6,
                 "ratio": t_ours / t_jax, "equal_to_jax": bool(np.array_equal(out_ours, out_jax)),
                 "max_rel_err_vs_numpy": err, "ok": err <= tol})
    print(json.dumps(rows[-1]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="pipeline_on_tpu.json")
    args = parser.parse_args()
    if jax.default_backend() != "tpu":
        sys.exit("pipeline_on_tpu.py needs a TPU as jax's default backend")
    rng = np.random.default_rng(0)
    rows: list[dict] = []
    x = rng.standard_normal((8192, 1024), np.float32)
    for block in [(256, 1024), (1024, 1024)]:
        for counts in [(1, 1), (2, 2)]:
            compare(rows, f"affine_{block[0]}x{block[1]}_buf{counts[0]}{counts[1]}",
                    affine(x.shape, block, counts, OURS), affine(x.shape, block, counts, JAX),
                    (x,), x * 2 + 1)
    a = rng.standard_normal((4096, 2048), np.float32).astype(jnp.bfloat16)
    b = rng.standard_normal((2048, 4096), np.float32).astype(jnp.bfloat16)
    ref = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
    for blocks in [(512, 512, 2048), (512, 512, 512), (1024, 1024, 512)]:
        compare(rows, "matmul_bf16_{}x{}x{}".format(*blocks), matmul(4096, 4096, 2048, *blocks, OURS),
                matmul(4096, 4096, 2048, *blocks, JAX), (a, b), ref, tol=2e-2)
    order = rng.permutation(8192 // 256).astype(np.int32)
    expected = x.reshape(32, 256, 1024)[order].reshape(8192, 1024) + 1
    compare(rows, "scalar_prefetch_gather", gather(x.shape, 256, OURS),
            gather(x.shape, 256, JAX), (order, x), expected)
    n = np.array([24], np.int32)
    expected = x.copy()
    expected[: 24 * 256] += 1
    compare(rows, "dynamic_grid", dynamic(x.shape, 256, OURS), dynamic(x.shape, 256, JAX),
            (n, x), expected)
    compare(rows, "nested", nested(x.shape, 1024, 256, OURS), nested(x.shape, 1024, 256, JAX),
            (x,), x + 1)
    # Features jax 0.10.2's emitter lacks, each against the best jax-emitter equivalent.
    small = rng.standard_normal((8192, 128), np.float32)
    for block in [(64, 128), (128, 128)]:
        compare(rows, f"lacking_buffered3_in_{block[0]}", affine(small.shape, block, (3, 2), OURS),
                affine(small.shape, block, (2, 2), JAX), (small,), small * 2 + 1)
    acc = rng.standard_normal(x.shape, np.float32)
    compare(rows, "lacking_in_out_pair", accumulate_ours(x.shape, (512, 1024)),
            accumulate_jax(x.shape, (512, 1024)), (x, acc), acc + x)
    xr = x[:8000]
    compare(rows, "lacking_ragged_last_block", ragged_ours(xr.shape, (512, 1024)),
            ragged_jax(xr.shape, (512, 1024)), (xr,), xr * 2 + 1)
    meta = {"chip": jax.devices()[0].device_kind, "jax": jax.__version__,
            "date": datetime.date.today().isoformat(), "host": platform.node(),
            "script": "benchmarks/pipeline_on_tpu.py", "timing": "device time, jax profiler"}
    try:
        import libtpu
        meta["libtpu"] = getattr(libtpu, "__version__", "?")
    except ImportError:
        meta["libtpu"] = None
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
