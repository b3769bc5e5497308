"""The kernels the performance model is calibrated and checked on (issue 40).

Three groups, each entry ``name -> Entry(group, make, meta)`` with ``make() -> (fn,
args)``; ``fn(*args)`` builds its ``pallas_call`` when called, so the same entry runs on
the chip (``calibrate_on_chip.py``) and under ``palladium.interpret.predict`` on a CPU
(``model_check.py``):

- ``micro``: microbenchmarks, one cost each (vector ALU ops per dtype, EUP
  transcendentals, dependent-loop latency, VMEM loads and stores, MXU by shape and dtype,
  DMAs by size, direction, stride and count in flight, grid-step overhead, revisited
  blocks, ``pl.when``-skipped steps). The model's measured constants come from these only
  (``fit_constants.py``).
- ``heldout``: real kernels the constants were not fitted on: jax's shipped kernels and
  kernels of each class the issue names, at several sizes.
- ``sweep:<family>``: block-size sweeps whose predicted order must match the chip's.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernel_cases as kc  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Entry:
    group: str
    make: Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]
    meta: dict[str, Any]


ENTRIES: dict[str, Entry] = {}


def _add(name: str, group: str, make: Callable[[], tuple[Any, tuple[Any, ...]]],
         **meta: Any) -> None:
    assert name not in ENTRIES, name
    ENTRIES[name] = Entry(group, make, meta)


def _arr(shape, dtype=jnp.float32, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        lo, hi = max(int(info.min), -100), min(int(info.max), 100)
        return jnp.asarray(rng.integers(lo, hi, shape), dtype)
    return jnp.asarray(rng.uniform(-1, 1, shape) * scale, dtype)


def _lazy(body, **kw):
    """A function that builds its pallas_call when called (predict sets the mode first)."""
    return lambda *xs: pl.pallas_call(body, **kw)(*xs)


def _whole(body, args_shapes, out_shape, scratch=()):
    """A grid-less pallas_call over whole VMEM blocks."""
    return pl.pallas_call(body, out_shape=out_shape, scratch_shapes=list(scratch))


# --- vector ALU / EUP: a chain of n ops over a (512, 1024) block in VMEM -----------------

VPU_SHAPE = (512, 1024)
_VPU_OPS: dict[str, Callable[[Any, int], Any]] = {
    "add": lambda x, i: x + (0.5 + i * 1e-3),
    "mul": lambda x, i: x * (0.999 - i * 1e-4),
    "max": lambda x, i: jnp.maximum(x, x * 0.5 - 1e-3 * i),
    "select": lambda x, i: jnp.where(x > 1e-3 * i, x, x * 0.5),
    "int_xor_shift": lambda x, i: (x ^ (x >> 3)) + i,
    "exp": lambda x, i: jnp.exp(x) * 0.25,
    "tanh": lambda x, i: jnp.tanh(x),
    "log": lambda x, i: jnp.log(x + 2.0),
    "sin": lambda x, i: jnp.sin(x),
    "logistic": lambda x, i: jax.nn.sigmoid(x),
    "rsqrt": lambda x, i: jax.lax.rsqrt(x * x + 1.0),
    "div": lambda x, i: 1.0 / (x + 2.0),
    "sqrt": lambda x, i: jnp.sqrt(x * x + 1.0),
}


def _chain(op: str, dtype: Any, n: int, ops: dict[str, Any] | None = None,
           shape: tuple[int, int] = VPU_SHAPE):
    """n of ``ops[op]`` one after the other over a block of ``shape`` in VMEM."""
    fn = (ops or _VPU_OPS)[op]

    def body(x_ref, o_ref):
        x = x_ref[...]
        for i in range(n):
            x = fn(x, i)
        o_ref[...] = x

    def make():
        x = _arr(shape, dtype)
        return (lambda x: _whole(body, None, jax.ShapeDtypeStruct(x.shape, x.dtype))(x),
                (x,))
    return make


for _op in _VPU_OPS:
    _dtypes = [jnp.int32] if _op.startswith("int") else [jnp.float32]
    if _op in ("add", "mul", "exp", "tanh"):
        _dtypes.append(jnp.bfloat16)
    for _dt in _dtypes:
        _valu = _op in ("add", "mul", "max", "select", "int_xor_shift")
        for _n in (0, 16, 64) if _valu else (4, 16) if _op != "sin" else (2, 8):
            _dn = jnp.dtype(_dt).name
            if _n == 0 and (_op != "add"):
                continue  # one copy baseline per dtype, under "add"
            _add(f"vpu/{_op}/{_dn}/n{_n}", "micro", _chain(_op, _dt, _n), kind="vector",
                 op=_op, dtype=_dn, n=_n, shape=VPU_SHAPE)


# --- dependent-loop latency: a carry of one (8, 128) vreg through n iterations -----------

def _latency(k: int, steps: int, with_rows: bool):
    def body(x_ref, o_ref):
        a = x_ref[pl.ds(0, 8), :] * 0.5

        def step(i, h):
            if with_rows:
                r = pl.multiple_of((i % 64) * 8, 8)
                h = h + x_ref[pl.ds(r, 8), :]
            for j in range(k):
                h = h * a + (1e-3 * (j + 1))
            if with_rows:
                o_ref[pl.ds(r, 8), :] = h
            return h

        h = jax.lax.fori_loop(0, steps, step, jnp.zeros((8, 128), jnp.float32))
        o_ref[pl.ds(0, 8), :] = h

    def make():
        x = _arr((512, 128))
        return (lambda x: _whole(body, None, jax.ShapeDtypeStruct(x.shape, x.dtype))(x), (x,))
    return make


for _k in (1, 4, 16):
    for _steps in (512, 4096):
        for _rows in (False, True):
            _add(f"loop/k{_k}/steps{_steps}/{'rows' if _rows else 'reg'}", "micro",
                 _latency(_k, _steps, _rows), kind="loop", k=_k, steps=_steps, rows=_rows)


# --- VMEM loads and stores: o += x over a (512, 1024) block, n times in a loop -----------

def _vmem(n: int, pattern: str):
    def body(x_ref, o_ref):
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

        def step(i, c):
            if pattern == "full":
                o_ref[...] += x_ref[...]
            elif pattern == "strided":  # every other row
                o_ref[pl.ds(0, 256), :] += x_ref[pl.ds(0, 256, stride=2), :]
            elif pattern == "masked":  # half the lanes of each vreg
                o_ref[:, pl.ds(0, 64)] += x_ref[:, pl.ds(0, 64)]
            return c
        jax.lax.fori_loop(0, n, step, 0)

    def make():
        x = _arr(VPU_SHAPE)
        return (lambda x: _whole(body, None, jax.ShapeDtypeStruct(x.shape, x.dtype))(x), (x,))
    return make


for _pat in ("full", "masked"):  # (strided loads need a 128-lane base ref: Mosaic)
    for _n in (1, 16, 64):
        _add(f"vmem/{_pat}/n{_n}", "micro", _vmem(_n, _pat), kind="vmem", pattern=_pat, n=_n,
             shape=VPU_SHAPE)


# --- MXU: acc += x @ y, n times in a loop ------------------------------------------------

def _mxu(m: int, k: int, n: int, dtype: Any, reps: int, precision: Any = None):
    acc_dtype = jnp.int32 if jnp.issubdtype(dtype, jnp.integer) else jnp.float32

    def body(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

        def step(i, c):
            o_ref[...] += jax.lax.dot(x_ref[...], y_ref[...], precision=precision,
                                      preferred_element_type=acc_dtype)
            return c
        jax.lax.fori_loop(0, reps, step, 0)

    def make():
        x, y = _arr((m, k), dtype, 1), _arr((k, n), dtype, 2)
        out = jax.ShapeDtypeStruct((m, n), acc_dtype)
        return (lambda x, y: _whole(body, None, out)(x, y), (x, y))
    return make


for (_m, _k, _n) in ((128, 128, 128), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024),
                     (8, 512, 512), (512, 128, 512), (128, 2048, 128)):
    for _dt, _prec in ((jnp.bfloat16, None), (jnp.float32, None),
                       (jnp.float32, jax.lax.Precision.HIGHEST), (jnp.int8, None)):
        if _prec is not None and _m not in (256, 512):
            continue
        if _dt == jnp.int8 and (_m, _k, _n) not in ((256, 256, 256), (512, 512, 512),
                                                   (1024, 1024, 1024)):
            continue
        _flops = 2 * _m * _k * _n
        _reps = int(max(4, min(4096, 4e9 // _flops)))
        for _r in (_reps, 4 * _reps):
            _name = f"mxu/{_m}x{_k}x{_n}/{jnp.dtype(_dt).name}{'/highest' if _prec else ''}"
            _add(f"{_name}/r{_r}", "micro", _mxu(_m, _k, _n, _dt, _r, _prec), kind="mxu",
                 m=_m, k=_k, n=_n, dtype=jnp.dtype(_dt).name,
                 precision="HIGHEST" if _prec else "DEFAULT", reps=_r)


# --- DMAs: chunk copies HBM <-> VMEM / HBM -> HBM, k in flight ---------------------------

def _copies_in_flight(copy, chunks: int, in_flight: int) -> None:
    """Start ``copy(i)`` for ``i`` in ``range(chunks)``, at most ``in_flight`` outstanding
    (each waited for ``in_flight`` starts later), then wait for the last ones."""
    def step(i, c):
        @pl.when(i >= in_flight)
        def _():
            copy(i - in_flight).wait()
        copy(i).start()
        return c
    jax.lax.fori_loop(0, chunks, step, 0)

    def drain(i, c):
        copy(i).wait()
        return c
    jax.lax.fori_loop(max(chunks - in_flight, 0), chunks, drain, 0)


def _dma(chunk_rows: int, width: int, chunks: int, in_flight: int, direction: str,
         strided: bool = False):
    """``chunks`` copies of (chunk_rows, width) f32, ``in_flight`` outstanding at once;
    ``strided``: each chunk is (chunk_rows, 128) taken out of (chunk_rows, width) rows."""
    cw = 128 if strided else width

    def body(src, dst, o_ref, buf, sems):
        def copy(i):
            slot = i % in_flight
            if direction == "in":
                s = src.at[i, :, pl.ds(0, cw)] if strided else src.at[i]
                return pltpu.make_async_copy(s, buf.at[slot], sems.at[slot])
            if direction == "out":
                return pltpu.make_async_copy(buf.at[slot], dst.at[i], sems.at[slot])
            return pltpu.make_async_copy(src.at[i], dst.at[i], sems.at[slot])

        if direction == "out":
            buf[...] = jnp.ones(buf.shape, buf.dtype)
        _copies_in_flight(copy, chunks, in_flight)
        o_ref[...] = buf[0, pl.ds(0, 8), pl.ds(0, 128)]

    def make():
        src = _arr((chunks, chunk_rows, width))
        dst_shape = (chunks, chunk_rows, cw)
        any_spec = pl.BlockSpec(memory_space=pl.ANY)
        fn = _lazy(
            body,
            out_shape=(jax.ShapeDtypeStruct(dst_shape, jnp.float32),
                       jax.ShapeDtypeStruct((8, 128), jnp.float32)),
            in_specs=[any_spec],
            out_specs=(any_spec, pl.BlockSpec(memory_space=pltpu.VMEM)),
            scratch_shapes=[pltpu.VMEM((in_flight, chunk_rows, cw), jnp.float32),
                            pltpu.SemaphoreType.DMA((in_flight,))],
        )
        return (lambda s: fn(s)), (src,)
    return make


for _rows, _width in ((8, 128), (8, 512), (32, 512), (64, 1024), (256, 1024), (1024, 1024)):
    _bytes = _rows * _width * 4
    _chunks = int(max(16, min(512, (64 << 20) // _bytes)))
    for _k in (1, 2, 4, 8):
        if _bytes * _k > (8 << 20):
            continue
        for _dir in ("in", "out", "hbm"):
            if _dir != "in" and _k not in (1, 4):
                continue
            _add(f"dma/{_dir}/{_bytes}B/k{_k}", "micro",
                 _dma(_rows, _width, _chunks, _k, _dir), kind="dma", direction=_dir,
                 bytes=_bytes, chunks=_chunks, in_flight=_k, strided=False)
for _rows in (64, 512):
    for _k in (1, 4):
        _add(f"dma/in-strided/{_rows * 512}B/k{_k}", "micro",
             _dma(_rows, 1024, 128, _k, "in", strided=True), kind="dma", direction="in",
             bytes=_rows * 512, chunks=128, in_flight=_k, strided=True)


# --- grid steps: overhead, revisited blocks, pl.when-skipped bodies ----------------------

def _grid(steps: int, mode: str, block=(8, 128)):
    rows = block[0]

    def body(x_ref, o_ref):
        if mode == "skip":
            @pl.when(pl.program_id(0) < 0)
            def _():
                o_ref[...] = x_ref[...] * 2.0
        elif mode == "compute-half":
            @pl.when(pl.program_id(0) % 2 == 0)
            def _():
                o_ref[...] = jnp.tanh(jnp.tanh(x_ref[...]))

            @pl.when(pl.program_id(0) % 2 == 1)
            def _():
                o_ref[...] = x_ref[...]
        else:
            o_ref[...] = x_ref[...] + 1.0

    def make():
        if mode == "revisit":  # the same block every step: copied once
            spec = pl.BlockSpec(block, lambda i: (0, 0))
            x = _arr(block)
            out = jax.ShapeDtypeStruct(block, jnp.float32)
        else:
            spec = pl.BlockSpec(block, lambda i: (i, 0))
            x = _arr((steps * rows, block[1]))
            out = jax.ShapeDtypeStruct(x.shape, jnp.float32)
        fn = _lazy(body, out_shape=out, grid=(steps,), in_specs=[spec],
                            out_specs=spec)
        return (lambda x: fn(x)), (x,)
    return make


for _steps in (256, 4096):
    for _mode in ("copy", "revisit", "skip"):
        _add(f"grid/{_mode}/s{_steps}", "micro", _grid(_steps, _mode), kind="grid", mode=_mode,
             steps=_steps, block=(8, 128))
for _steps in (64, 512):
    for _mode in ("copy", "skip", "compute-half"):
        _add(f"grid/{_mode}/s{_steps}/b256x1024", "micro", _grid(_steps, _mode, (256, 1024)),
             kind="grid", mode=_mode, steps=_steps, block=(256, 1024))


# --- held-out kernels --------------------------------------------------------------------

def _case(case: kc.Case):
    return case.make


def _elementwise(fn: Callable[[Any], Any], shape, block_rows: int, dtype=jnp.float32,
                 n_in: int = 1):
    def body(*refs):
        *ins, o_ref = refs
        vals = [r[...] for r in ins]
        o_ref[...] = fn(*vals).astype(o_ref.dtype)

    def make():
        spec = pl.BlockSpec((block_rows, shape[1]), lambda i: (i, 0))
        call = _lazy(body, out_shape=jax.ShapeDtypeStruct(shape, dtype),
                              grid=(shape[0] // block_rows,), in_specs=[spec] * n_in,
                              out_specs=spec)
        args = tuple(_arr(shape, dtype, seed=i) for i in range(n_in))
        return (lambda *xs: call(*xs)), args
    return make


_ELEMENTWISE: dict[str, tuple[Callable[..., Any], int]] = {
    "copy": (lambda x: x, 1),
    "add": (lambda x, y: x + y, 2),
    "axpy": (lambda x, y: 2.5 * x + y, 2),
    "tanh": (jnp.tanh, 1),
    "exp": (lambda x: jnp.exp(x), 1),
    "sin": (jnp.sin, 1),
    "gelu": (lambda x: jax.nn.gelu(x), 1),
    "softmax_rows": (lambda x: jax.nn.softmax(x, axis=-1), 1),
}

for _fname, (_fn, _nin) in _ELEMENTWISE.items():
    for _shape in ((1024, 1024), (4096, 4096)):
        for _dt in (jnp.float32, jnp.bfloat16) if _fname in ("copy", "add", "tanh") else (
                jnp.float32,):
            _add(f"elementwise/{_fname}/{jnp.dtype(_dt).name}/{_shape[0]}x{_shape[1]}",
                 "heldout", _elementwise(_fn, _shape, 128, _dt, _nin), kind="elementwise",
                 fn=_fname, shape=_shape, dtype=jnp.dtype(_dt).name)
for _br in (8, 32, 128, 256, 512):
    _add(f"sweep/elementwise-tanh/b{_br}", "sweep:elementwise", _elementwise(
        jnp.tanh, (4096, 2048), _br), kind="elementwise", fn="tanh", block_rows=_br)
    if _br > 256:
        continue  # (3 operands x 2 buffers of 4 MiB exceed the 16 MiB scoped VMEM)
    _add(f"sweep/elementwise-add/b{_br}", "sweep:elementwise-add", _elementwise(
        lambda x, y: x + y, (4096, 2048), _br, n_in=2), kind="elementwise", fn="add",
        block_rows=_br)


def _bf16_matmul(n: int, block: int, block_k: int):
    from jax.experimental.pallas.ops.tpu.matmul import matmul

    def make():
        x, y = _arr((n, n), jnp.bfloat16, 1), _arr((n, n), jnp.bfloat16, 2)
        return functools.partial(matmul, block_shape=(block, block), block_k=block_k), (x, y)
    return make


for _n in (1024, 2048):
    for _b in (128, 256, 512):
        _add(f"heldout/matmul-f32/{_n}/b{_b}", "heldout", _case(kc.matmul_case(_n, _b)),
             kind="matmul", dtype="float32", n=_n, block=_b)
for _b, _bk in ((128, 128), (256, 256), (256, 512), (512, 256), (512, 512), (512, 1024),
                (1024, 512)):
    _add(f"sweep/matmul-bf16/4096/b{_b}k{_bk}", "sweep:matmul", _bf16_matmul(4096, _b, _bk),
         kind="matmul", dtype="bfloat16", n=4096, block=_b, block_k=_bk)
_add("heldout/quantized-matmul", "heldout", _case(kc.quantized_matmul_case(1024, 2048, 1024)),
     kind="matmul-int8")


def _flash(heads: int, seq: int, block: int, causal: bool):
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    def make():
        sizes = kc._flash_sizes(block)
        args = tuple(_arr((1, heads, seq, 128), seed=i) for i in range(3))
        return (lambda q, k, v: fa.flash_attention(q, k, v, causal=causal,
                                                   block_sizes=sizes)), args
    return make


for _seq in (1024, 4096):
    for _causal in (False, True):
        _add(f"heldout/flash-{'causal' if _causal else 'full'}/h4/s{_seq}", "heldout",
             _flash(4, _seq, 256, _causal), kind="flash", causal=_causal, seq=_seq)
for _b in (128, 256, 512, 1024):
    _add(f"sweep/flash-causal/s2048/b{_b}", "sweep:flash", _flash(4, 2048, _b, True),
         kind="flash", causal=True, seq=2048, block=_b)
_add("heldout/flash-backward/h2/s1024", "heldout", _case(kc.flash_backward_case(2, 1024, 128)),
     kind="flash-bwd")
for _seq in (1024, 4096):
    _add(f"heldout/splash-causal/h4/s{_seq}", "heldout",
         _case(kc.splash_forward_case(4, _seq, 512)), kind="splash", seq=_seq)
_add("heldout/gmm/4096x512x512", "heldout", _case(kc.gmm_case(4096, 512, 512, 4)), kind="gmm")
for _pages in (32, 128):
    _add(f"heldout/paged/b8h8/p{_pages}", "heldout",
         _case(kc.paged_attention_case(8, 8, 16, _pages, 8)), kind="paged", pages=_pages)
for _pb in (1, 2, 4, 8, 16):
    _add(f"sweep/paged/b8h8/p64/pb{_pb}", "sweep:paged",
         _case(kc.paged_attention_case(8, 8, 16, 64, _pb)), kind="paged", per_block=_pb)


def _ragged_paged(seqs: int, q_len: int, kv_len: int, pages_per_block: int):
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

    def make():
        rng = np.random.default_rng(0)
        page = 16
        pages_per_seq = -(-kv_len // page)
        total_pages = seqs * pages_per_seq
        q_lens = np.full(seqs, q_len)
        q = jnp.asarray(rng.standard_normal((int(q_lens.sum()), 8, 128)), jnp.float32)
        kv = jnp.asarray(rng.standard_normal((total_pages, page, 4, 128)), jnp.float32)
        pages = jnp.asarray(rng.permutation(total_pages).reshape(seqs, pages_per_seq),
                            jnp.int32)
        cu_q = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32)
        kv_lens = jnp.full((seqs,), kv_len, jnp.int32)
        args = (q, kv, kv_lens, pages, cu_q, jnp.array([seqs], jnp.int32))
        fn = functools.partial(rpa.ragged_paged_attention,
                               num_kv_pages_per_block=pages_per_block,
                               num_queries_per_block=8)
        return fn, args
    return make


_add("heldout/ragged-paged/s8/q8/kv512", "heldout", _ragged_paged(8, 8, 512, 8),
     kind="ragged-paged")
for _seq in (512, 2048):
    _add(f"heldout/rglru/{_seq}x256", "heldout", _case(kc.rglru_scan_case(_seq, 256, 64, 128)),
         kind="rglru", seq=_seq)
_add("heldout/gated-delta/s1024", "heldout", _case(kc.gated_delta_chunk_case(1024, 2)),
     kind="gated-delta")


def _ring(chunks: int, rows: int, slots: int):
    """A manual multi-slot DMA ring: HBM chunks into VMEM slots, scaled, and back out."""
    def body(x_hbm, o_hbm, buf, obuf, isem, osem):
        def fetch(i):
            return pltpu.make_async_copy(x_hbm.at[i], buf.at[i % slots], isem.at[i % slots])

        def put(i):
            return pltpu.make_async_copy(obuf.at[i % slots], o_hbm.at[i], osem.at[i % slots])

        for i in range(min(slots, chunks)):
            fetch(i).start()

        def step(i, c):
            fetch(i).wait()

            @pl.when(i >= slots)
            def _():
                put(i - slots).wait()
            obuf[i % slots] = buf[i % slots] * 2.0 + 1.0
            put(i).start()

            @pl.when(i + slots < chunks)
            def _():
                fetch(i + slots).start()
            return c
        jax.lax.fori_loop(0, chunks, step, 0)
        for i in range(max(chunks - slots, 0), chunks):
            put(i).wait()

    def make():
        any_spec = pl.BlockSpec(memory_space=pl.ANY)
        x = _arr((chunks, rows, 1024))
        fn = _lazy(
            body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), in_specs=[any_spec],
            out_specs=any_spec,
            scratch_shapes=[pltpu.VMEM((slots, rows, 1024), jnp.float32),
                            pltpu.VMEM((slots, rows, 1024), jnp.float32),
                            pltpu.SemaphoreType.DMA((slots,)), pltpu.SemaphoreType.DMA((slots,))])
        return (lambda x: fn(x)), (x,)
    return make


for _rows in (64, 256):
    for _slots in (2, 4):
        _add(f"heldout/dma-ring/r{_rows}/slots{_slots}", "heldout", _ring(64, _rows, _slots),
             kind="ring", rows=_rows, slots=_slots)


def names(group_prefix: str = "") -> list[str]:
    return [n for n, e in ENTRIES.items() if e.group.startswith(group_prefix)]


# --- round 2 (2026-12-06): costs the first round's held-out errors pointed at ---------

_REDUCE_OPS: dict[str, Callable[[Any, int], Any]] = {
    "lane_max": lambda x, i: x - jnp.max(x, axis=-1, keepdims=True) * 0.5,
    "lane_sum": lambda x, i: x - jnp.sum(x, axis=-1, keepdims=True) * (1.0 / 1024),
    "sublane_sum": lambda x, i: x - jnp.sum(x, axis=0, keepdims=True) * (1.0 / 512),
    "transpose": lambda x, i: x.T * 0.5 + 0.25,
    "iota_mask": lambda x, i: jnp.where(
        jax.lax.broadcasted_iota(jnp.int32, x.shape, 0) + i
        >= jax.lax.broadcasted_iota(jnp.int32, x.shape, 1), x, x * 0.5),
}


def _reduce_chain(op: str, n: int):
    return _chain(op, jnp.float32, n, _REDUCE_OPS,
                  (512, 512) if op == "transpose" else VPU_SHAPE)


for _op in _REDUCE_OPS:
    for _n in (4, 16):
        _add(f"vpu2/{_op}/n{_n}", "micro", _reduce_chain(_op, _n), kind="vector2", op=_op, n=_n)


def _nt_dot(m: int, k: int, n: int, reps: int, transposed: bool):
    dims = (((1,), (1,)), ((), ())) if transposed else (((1,), (0,)), ((), ()))

    def body(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

        def step(i, c):
            o_ref[...] += jax.lax.dot_general(x_ref[...], y_ref[...], dims,
                                              preferred_element_type=jnp.float32)
            return c
        jax.lax.fori_loop(0, reps, step, 0)

    def make():
        x = _arr((m, k), jnp.float32, 1)
        y = _arr((n, k) if transposed else (k, n), jnp.float32, 2)
        out = jax.ShapeDtypeStruct((m, n), jnp.float32)
        return (lambda x, y: _whole(body, None, out)(x, y), (x, y))
    return make


for _r in (119, 476):
    for _t in (False, True):
        _add(f"mxu2/256x128x256/f32/{'nt' if _t else 'nn'}/r{_r}", "micro",
             _nt_dot(256, 128, 256, _r, _t), kind="mxu2", transposed=_t, reps=_r)


def _eup_latency(op: str, steps: int):
    fns = {"exp": lambda h: jnp.exp(h) * 0.25, "logistic": jax.nn.sigmoid,
           "div": lambda h: 1.0 / (h + 2.0), "tanh": jnp.tanh}
    return _carried(fns[op], steps)


def _carried(f: Callable[[Any], Any], steps: int):
    """``h = f(h)`` on one (8, 128) vreg for ``steps`` loop iterations: f's latency."""
    def body(x_ref, o_ref):
        def step(i, h):
            return f(h)
        o_ref[pl.ds(0, 8), :] = jax.lax.fori_loop(0, steps, step, x_ref[pl.ds(0, 8), :])

    def make():
        x = _arr((8, 128))
        return (lambda x: _whole(body, None, jax.ShapeDtypeStruct(x.shape, x.dtype))(x), (x,))
    return make


for _op in ("exp", "logistic", "div", "tanh"):
    for _steps in (512, 4096):
        _add(f"loop2/{_op}/steps{_steps}", "micro", _eup_latency(_op, _steps), kind="loop2",
             op=_op, steps=_steps)

# held out, round 2: other sizes of the same classes (never fitted on)
_add("heldout2/flash-full/h2/s2048/b128", "heldout2", _flash(2, 2048, 128, False), kind="flash")
_add("heldout2/flash-causal/h8/s1024/b512", "heldout2", _flash(8, 1024, 512, True),
     kind="flash")
_add("heldout2/paged/b16h4/p64/pb4", "heldout2",
     _case(kc.paged_attention_case(16, 4, 16, 64, 4)), kind="paged")
_add("heldout2/rglru/1024x512", "heldout2", _case(kc.rglru_scan_case(1024, 512, 64, 128)),
     kind="rglru")
_add("heldout2/matmul-f32/1536/b512", "heldout2", _case(kc.matmul_case(1536, 512)),
     kind="matmul")
_add("heldout2/matmul-bf16/2048/b256k1024", "heldout2", _bf16_matmul(2048, 256, 1024),
     kind="matmul")
_add("heldout2/gmm/2048x1024x256", "heldout2", _case(kc.gmm_case(2048, 1024, 256, 4)),
     kind="gmm")
_add("heldout2/splash-causal/h2/s2048", "heldout2", _case(kc.splash_forward_case(2, 2048, 256)),
     kind="splash")
_add("heldout2/elementwise-tanh/2048x2048/b64", "heldout2",
     _elementwise(jnp.tanh, (2048, 2048), 64), kind="elementwise")
_add("heldout2/elementwise-gelu-bf16/2048x4096/b128", "heldout2",
     _elementwise(jax.nn.gelu, (2048, 4096), 128, jnp.bfloat16), kind="elementwise")
_add("heldout2/dma-ring/r128/slots3", "heldout2", _ring(48, 128, 3), kind="ring")
_add("heldout2/gated-delta/s2048", "heldout2", _case(kc.gated_delta_chunk_case(2048, 2)),
     kind="gated-delta")
_add("heldout2/flash-backward/h2/s2048", "heldout2", _case(kc.flash_backward_case(2, 2048, 256)),
     kind="flash-bwd")
_add("heldout2/ragged-paged/s16/q4/kv1024", "heldout2", _ragged_paged(16, 4, 1024, 8),
     kind="ragged-paged")


# --- round 3 (2026-12-06, second session): the patterns the held-out errors pointed at --
# independent against dependent dots (is a dot's fixed cost the MXU's time or only its
# result's latency?), one flash-attention step on resident blocks (the softmax's
# bookkeeping between two dots), and a page-gather loop (paged attention's many small
# DMAs, each started from a page index read in SMEM)

def _dots(mode: str, n: int, m: int, k: int, reps: int, dtype: Any = jnp.float32):
    def body(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

        def step(i, c):
            if mode == "indep":
                for j in range(n):
                    o_ref[j] += jax.lax.dot(x_ref[j], w_ref[j],
                                            preferred_element_type=jnp.float32)
            else:
                h = x_ref[0]
                for j in range(n):
                    h = jax.lax.dot(h, w_ref[j], preferred_element_type=jnp.float32
                                    ).astype(dtype)
                o_ref[0] += h.astype(jnp.float32)
            return c
        jax.lax.fori_loop(0, reps, step, 0)

    def make():
        x, w = _arr((n, m, k), dtype, 1, 0.1), _arr((n, k, k), dtype, 2, 0.1)
        out = jax.ShapeDtypeStruct((n, m, k), jnp.float32)
        return (lambda x, w: _whole(body, None, out)(x, w), (x, w))
    return make


for _m, _k in ((128, 128), (256, 256)):
    for _mode, _n in (("indep", 1), ("indep", 4), ("dep", 4)):
        for _r in (64, 256):
            _add(f"r3/dots/{_mode}/n{_n}/{_m}x{_k}/r{_r}", "micro",
                 _dots(_mode, _n, _m, _k, _r), kind="dots", mode=_mode, n=_n, m=_m, k=_k,
                 reps=_r)


def _flash_scores(q_ref, k_ref, m_ref, l_ref, acc_ref):
    """A flash step's scores, q @ k.T (the state zeroed at the first step)."""
    @pl.when(pl.program_id(0) == 0)
    def _():
        m_ref[...] = jnp.full(m_ref.shape, -1e30, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    return jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                               preferred_element_type=jnp.float32)


def _flash_step_make(body: Callable[..., None], block: int, steps: int, state_lanes: int,
                     moving: bool = False):
    """``steps`` grid steps of ``body`` on the same (block, 128) q, k, v (copied once),
    m and l scratch of (block, state_lanes), acc of (block, 128); ``moving``: k and v a
    new (block, 128) block every step (copied as flash attention's are)."""
    def make():
        kv_rows = block * steps if moving else block
        q = _arr((block, 128), seed=0, scale=0.1)
        k, v = (_arr((kv_rows, 128), seed=i, scale=0.1) for i in (1, 2))
        spec = pl.BlockSpec((block, 128), lambda i: (0, 0))
        kv_spec = pl.BlockSpec((block, 128), lambda i: (i, 0)) if moving else spec
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((block, 128), jnp.float32),
                   grid=(steps,), in_specs=[spec, kv_spec, kv_spec], out_specs=spec,
                   scratch_shapes=[pltpu.VMEM((block, state_lanes), jnp.float32),
                                   pltpu.VMEM((block, state_lanes), jnp.float32),
                                   pltpu.VMEM((block, 128), jnp.float32)],
                   compiler_params=pltpu.CompilerParams(
                       dimension_semantics=("arbitrary",)))
        return (lambda q, k, v: fn(q, k, v)), (q, k, v)
    return make


def _flash_step(block: int, steps: int, part: str, moving: bool = False):
    """One online-softmax step per grid step on the same resident q, k, v blocks (no
    copies after the first): ``dot`` the scores only (added to acc), ``qk`` the scores
    and their row max, ``exp`` also p = exp(s - m) (added to acc), ``softmax`` p and the
    row sum instead, ``full`` also acc = acc * alpha + p @ v."""
    def body(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
        s = _flash_scores(q_ref, k_ref, m_ref, l_ref, acc_ref)
        if part == "dot":
            acc_ref[...] += s[:, :128]
        elif part == "copy":
            acc_ref[pl.ds(0, 128), :] += k_ref[pl.ds(0, 128), :] + v_ref[pl.ds(0, 128), :]
        elif part == "pv":
            acc_ref[...] += jnp.dot(s, v_ref[...], preferred_element_type=jnp.float32)
        else:
            m_prev = m_ref[...]
            m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
            m_ref[...] = m_new
            if part == "exp":
                acc_ref[...] += jnp.exp(s - m_new[:, :1])[:, :128]
            elif part != "qk":
                p = jnp.exp(s - m_new[:, :1])
                alpha = jnp.exp(m_prev - m_new)
                l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
                if part == "full":
                    acc_ref[...] = acc_ref[...] * alpha[:, :1] + jnp.dot(
                        p, v_ref[...], preferred_element_type=jnp.float32)
                elif part == "full-bf16p":
                    acc_ref[...] = acc_ref[...] * alpha[:, :1] + jnp.dot(
                        p.astype(jnp.bfloat16), v_ref[...].astype(jnp.bfloat16),
                        preferred_element_type=jnp.float32)
                elif part == "full-norescale":
                    acc_ref[...] += jnp.dot(p, v_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(0) == steps - 1)
        def _():
            o_ref[...] = acc_ref[...] + m_ref[:, :1] + l_ref[:, :1]

    return _flash_step_make(body, block, steps, 1, moving)


for _b in (128, 256):
    for _part in ("qk", "softmax", "full"):
        for _s in (256, 1024):
            _add(f"r3/flash-step/{_part}/b{_b}/s{_s}", "micro", _flash_step(_b, _s, _part),
                 kind="flash-step", part=_part, block=_b, steps=_s)


def _page_gather_make(body: Callable[..., None], pages_per_step: int, steps: int,
                      dtype: Any):
    """A page gather's call: (16, 128) pages in HBM, their shuffled indices prefetched
    into SMEM, ``body`` per grid step, a (16, 128) row sum out per step."""
    total = pages_per_step * steps

    def make():
        pages = _arr((total, 16, 128), dtype)
        idx = jnp.asarray(np.random.default_rng(3).permutation(total), jnp.int32)
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(steps,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((1, 16, 128), lambda i, idx: (i, 0, 0)),
            scratch_shapes=[pltpu.VMEM((pages_per_step, 16, 128), dtype),
                            pltpu.SemaphoreType.DMA(())])
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((steps, 16, 128), jnp.float32),
                   grid_spec=grid_spec)
        return (lambda idx, p: fn(idx, p)), (idx, pages)
    return make


def _page_gather(pages_per_step: int, steps: int, dtype: Any):
    """Per grid step, ``pages_per_step`` (16, 128) pages copied HBM -> VMEM one DMA each,
    started in a loop from page indices in SMEM (scalar prefetch), then waited in a loop,
    as jax's paged attention does; a row sum of the pages keeps them used."""
    def body(idx_ref, pages_hbm, o_ref, buf, sem):
        def copy(j):
            page = idx_ref[pl.program_id(0) * pages_per_step + j]
            return pltpu.make_async_copy(pages_hbm.at[page], buf.at[j], sem)

        def start(j, c):
            copy(j).start()
            return c

        def wait(j, c):
            copy(j).wait()
            return c
        jax.lax.fori_loop(0, pages_per_step, start, 0)
        jax.lax.fori_loop(0, pages_per_step, wait, 0)
        o_ref[...] = jnp.sum(buf[...].astype(jnp.float32), axis=0)[None]

    return _page_gather_make(body, pages_per_step, steps, dtype)


for _dt in (jnp.float32, jnp.bfloat16):
    for _pp in (4, 16):
        for _s in (64, 256):
            _add(f"r3/page-gather/{jnp.dtype(_dt).name}/p{_pp}/s{_s}", "micro",
                 _page_gather(_pp, _s, _dt), kind="page-gather", dtype=jnp.dtype(_dt).name,
                 pages=_pp, steps=_s)


# round 3b: the flash step's other parts, the latency of a row reduction and of a
# column's broadcast across lanes, and the page gather as jax's paged attention writes it
# (its starts and waits unrolled)
for _b in (128, 256):
    for _part in ("dot", "exp"):
        for _s in (256, 1024):
            _add(f"r3/flash-step/{_part}/b{_b}/s{_s}", "micro", _flash_step(_b, _s, _part),
                 kind="flash-step", part=_part, block=_b, steps=_s)

_ROW_LATENCY_OPS: dict[str, Callable[[Any], Any]] = {
    "lane_max": lambda h: h - jnp.max(h, axis=-1, keepdims=True) * 0.5,
    "lane_sum": lambda h: h - jnp.sum(h, axis=-1, keepdims=True) * (1.0 / 256),
    "lane_bcast": lambda h: h * 0.5 + h[:, :1],
    "sublane_sum": lambda h: h - jnp.sum(h, axis=0, keepdims=True) * (1.0 / 64),
}


def _row_latency(op: str, steps: int):
    return _carried(_ROW_LATENCY_OPS[op], steps)


for _op in _ROW_LATENCY_OPS:
    for _steps in (512, 4096):
        _add(f"r3/latency/{_op}/steps{_steps}", "micro", _row_latency(_op, _steps),
             kind="row-latency", op=_op, steps=_steps)


def _page_gather_unrolled(pages_per_step: int, steps: int, dtype: Any):
    def body(idx_ref, pages_hbm, o_ref, buf, sem):
        copies = [pltpu.make_async_copy(
            pages_hbm.at[idx_ref[pl.program_id(0) * pages_per_step + j]], buf.at[j], sem)
            for j in range(pages_per_step)]
        for c in copies:
            c.start()
        for c in copies:
            c.wait()
        o_ref[...] = jnp.sum(buf[...].astype(jnp.float32), axis=0)[None]

    return _page_gather_make(body, pages_per_step, steps, dtype)


for _dt in (jnp.float32, jnp.bfloat16):
    for _pp in (4, 16):
        for _s in (64, 256):
            _add(f"r3/page-gather-unrolled/{jnp.dtype(_dt).name}/p{_pp}/s{_s}", "micro",
                 _page_gather_unrolled(_pp, _s, _dt), kind="page-gather",
                 dtype=jnp.dtype(_dt).name, pages=_pp, steps=_s, unrolled=True)


# round 3c: what the step's second dot costs with and without the softmax before it
for _b in (128, 256):
    for _part in ("pv", "full-bf16p", "full-norescale"):
        for _s in (256, 1024):
            _add(f"r3/flash-step/{_part}/b{_b}/s{_s}", "micro", _flash_step(_b, _s, _part),
                 kind="flash-step", part=_part, block=_b, steps=_s)


# round 3d: a grid step's own cost by the number of operands (each revisited: no copies)
def _grid_operands(n_in: int, steps: int):
    def body(*refs):
        *ins, o_ref = refs
        acc = ins[0][...]
        for r in ins[1:]:
            acc = acc + r[...]
        o_ref[...] += acc

    def make():
        spec = pl.BlockSpec((8, 128), lambda i: (0, 0))
        xs = tuple(_arr((8, 128), seed=j) for j in range(n_in))
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                   grid=(steps,), in_specs=[spec] * n_in, out_specs=spec)
        return (lambda *xs: fn(*xs)), xs
    return make


for _n in (1, 3, 6):
    for _s in (256, 4096):
        _add(f"r3/grid-operands/in{_n}/s{_s}", "micro", _grid_operands(_n, _s),
             kind="grid-operands", inputs=_n, steps=_s)


# ... and a step whose values outgrow the 64 vregs (two (rows, 128) f32 values live)
def _live(rows: int, steps: int):
    def body(x_ref, o_ref):
        s = x_ref[...]
        p = jnp.exp(s)
        o_ref[...] += (p * s + s) + p

    def make():
        spec = pl.BlockSpec((rows, 128), lambda i: (0, 0))
        x = _arr((rows, 128), scale=0.1)
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((rows, 128), jnp.float32),
                   grid=(steps,), in_specs=[spec], out_specs=spec)
        return (lambda x: fn(x)), (x,)
    return make


for _rows in (128, 256, 512):
    for _s in (256, 1024):
        _add(f"r3/live/r{_rows}/s{_s}", "micro", _live(_rows, _s), kind="live", rows=_rows,
             steps=_s)


# round 3e: do short loops overlap their iterations (unrolled by the compiler)? A loop of
# `trip` rows a grid step, its bounds static (a scan) or read from SMEM (a while loop)
def _short_loop(trip: int, steps: int, dynamic: bool):
    def body(n_ref, x_ref, o_ref):
        def row(i, c):
            y = x_ref[pl.ds(i, 1), :]
            y = jax.nn.sigmoid(y * 2.0 + 1.0) * 3.0
            o_ref[pl.ds(i, 1), :] = y + o_ref[pl.ds(i, 1), :]
            return c
        upper = n_ref[0] if dynamic else trip
        jax.lax.fori_loop(0, upper, row, 0)

    def make():
        spec = pl.BlockSpec((16, 128), lambda i, n: (0, 0))
        x = _arr((16, 128))
        n = jnp.asarray([trip], jnp.int32)
        grid_spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(steps,),
                                                 in_specs=[spec], out_specs=spec)
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
                   grid_spec=grid_spec)
        return (lambda n, x: fn(n, x)), (n, x)
    return make


for _trip in (2, 4, 16):
    for _dyn in (False, True):
        for _s in (256, 1024):
            _add(f"r3/short-loop/{'dynamic' if _dyn else 'static'}/t{_trip}/s{_s}", "micro",
                 _short_loop(_trip, _s, _dyn), kind="short-loop", trip=_trip, dynamic=_dyn,
                 steps=_s)


# ... and the online-softmax step as jax's flash attention keeps its state: m and l
# replicated over 128 lanes, a causal mask on the scores
def _flash_step_jax(block: int, steps: int, causal: bool, moving: bool = False):
    def body(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
        s = _flash_scores(q_ref, k_ref, m_ref, l_ref, acc_ref)
        if causal:
            rows = jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
            cols = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = s + jnp.where(cols <= rows, 0.0, -1e30)
        m_prev, l_prev = m_ref[...], l_ref[...]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1)[:, None])
        reps = block // 128
        p = jnp.exp(s - (jnp.tile(m_next, (1, reps)) if reps > 1 else m_next))
        alpha = jnp.exp(m_prev - m_next)
        l_next = jnp.sum(p, axis=1)[:, None] + alpha * l_prev
        m_ref[...], l_ref[...] = m_next, l_next
        acc_ref[...] = acc_ref[...] * alpha + jnp.dot(p, v_ref[...],
                                                      preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(0) == steps - 1)
        def _():
            o_ref[...] = acc_ref[...] / l_ref[...]

    return _flash_step_make(body, block, steps, 128, moving)


for _b in (128, 256):
    for _causal in (False, True):
        for _s in (256, 1024):
            _add(f"r3/flash-step-jax/{'causal' if _causal else 'full'}/b{_b}/s{_s}", "micro",
                 _flash_step_jax(_b, _s, _causal), kind="flash-step-jax", block=_b,
                 causal=_causal, steps=_s)


# held out, round 3: measured after the third round's model was final (its predictions
# were committed before the chip ran them: results_tpu/heldout3_predicted.v5e.json)
def _held_out(group: str, kernels: tuple[tuple[str, Any, str], ...]) -> None:
    for name, make, kind in kernels:
        _add(f"{group}/{name}", group, make, kind=kind)


_held_out("heldout3", (
        ("flash-full/h2/s2048/b256", _flash(2, 2048, 256, False), "flash"),
        ("flash-causal/h4/s2048/b256", _flash(4, 2048, 256, True), "flash"),
        ("paged/b4h8/p64/pb8", _case(kc.paged_attention_case(4, 8, 16, 64, 8)), "paged"),
        ("paged/b16h8/p32/pb4", _case(kc.paged_attention_case(16, 8, 16, 32, 4)), "paged"),
        ("rglru/4096x256", _case(kc.rglru_scan_case(4096, 256, 64, 128)), "rglru"),
        ("rglru/512x1024/c128", _case(kc.rglru_scan_case(512, 1024, 128, 256)), "rglru"),
        ("gated-delta/h4/s1024", _case(kc.gated_delta_chunk_case(1024, 4)), "gated-delta"),
        ("matmul-bf16/2048/b512k512", _bf16_matmul(2048, 512, 512), "matmul"),
        ("matmul-f32/2048/b1024", _case(kc.matmul_case(2048, 1024)), "matmul"),
        ("gmm/8192x512x256", _case(kc.gmm_case(8192, 512, 256, 8)), "gmm"),
        ("splash-causal/h8/s2048", _case(kc.splash_forward_case(8, 2048, 512)), "splash"),
        ("ragged-paged/s4/q16/kv2048", _ragged_paged(4, 16, 2048, 8), "ragged-paged"),
        ("elementwise-exp-bf16/2048x2048/b256",
         _elementwise(jnp.exp, (2048, 2048), 256, jnp.bfloat16), "elementwise"),
        ("flash-backward/h4/s1024", _case(kc.flash_backward_case(4, 1024, 256)), "flash-bwd"),
        ("quantized-matmul/1024x2048x1024",
         _case(kc.quantized_matmul_case(1024, 2048, 1024, 256)), "quantized"),
        ("dma-ring/r512/slots2", _ring(32, 512, 2), "ring")))



# held out, round 4 (2026-12-06, eighth session): other sizes of every class, predicted
# and the predictions committed before the chip ran them
# (results_tpu/heldout4_predicted.v5e.json)
_held_out("heldout4", (
        ("flash-full/h4/s4096/b512", _flash(4, 4096, 512, False), "flash"),
        ("flash-causal/h2/s8192/b256", _flash(2, 8192, 256, True), "flash"),
        ("paged/b8h16/p128/pb16", _case(kc.paged_attention_case(8, 16, 16, 128, 16)), "paged"),
        ("paged/b32h4/p32/pb2", _case(kc.paged_attention_case(32, 4, 16, 32, 2)), "paged"),
        ("rglru/2048x1024/c128", _case(kc.rglru_scan_case(2048, 1024, 128, 256)), "rglru"),
        ("gated-delta/h2/s4096", _case(kc.gated_delta_chunk_case(4096, 2)), "gated-delta"),
        ("matmul-bf16/3072/b512k256", _bf16_matmul(3072, 512, 256), "matmul"),
        ("matmul-f32/4096/b512", _case(kc.matmul_case(4096, 512)), "matmul"),
        ("gmm/4096x1024x512", _case(kc.gmm_case(4096, 1024, 512, 8)), "gmm"),
        ("splash-causal/h2/s8192", _case(kc.splash_forward_case(2, 8192, 512)), "splash"),
        ("ragged-paged/s8/q32/kv1024", _ragged_paged(8, 32, 1024, 8), "ragged-paged"),
        ("elementwise-sin-bf16/2048x2048/b128",
         _elementwise(jnp.sin, (2048, 2048), 128, jnp.bfloat16), "elementwise"),
        ("elementwise-add-bf16/4096x2048/b512",
         _elementwise(lambda x, y: x + y, (4096, 2048), 512, jnp.bfloat16, 2), "elementwise"),
        ("flash-backward/h2/s4096/b128", _case(kc.flash_backward_case(2, 4096, 128)),
         "flash-bwd"),
        ("quantized-matmul/2048x2048x2048",
         _case(kc.quantized_matmul_case(2048, 2048, 2048, 256)), "quantized"),
        ("dma-ring/r256/slots3", _ring(64, 256, 3), "ring")))

# round 3f: do a step's block copies overlap its compute? 1 MiB in and out a step and a
# chain of n vector ops on the block (n = 0: copies only; the chain alone ~n x 55 ns)
def _overlap(n: int, steps: int):
    def body(x_ref, o_ref):
        x = x_ref[...]
        for i in range(n):
            x = x * (0.999 - i * 1e-4) + 1e-3
        o_ref[...] = x

    def make():
        spec = pl.BlockSpec((256, 1024), lambda i: (i, 0))
        x = _arr((256 * steps, 1024))
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(steps,),
                   in_specs=[spec], out_specs=spec)
        return (lambda x: fn(x)), (x,)
    return make


for _n in (0, 16, 32, 64):
    for _s in (16, 64):
        _add(f"r3/overlap/n{_n}/s{_s}", "micro", _overlap(_n, _s), kind="overlap", n=_n,
             steps=_s)


# round 4: why flash attention's copies and compute overlap less than the model says.
# jax's flash step with k and v a new block every step (against r3/flash-step-jax, the
# same step on resident blocks), its scores' dot alone and its copies alone
for _b in (128, 256):
    for _s in (256, 1024):
        _add(f"r4/flash-moving/full/b{_b}/s{_s}", "micro",
             _flash_step_jax(_b, _s, False, moving=True), kind="flash-moving", part="full",
             block=_b, steps=_s)
        for _part in ("dot", "copy"):
            _add(f"r4/flash-moving/{_part}/b{_b}/s{_s}", "micro",
                 _flash_step(_b, _s, _part, moving=True), kind="flash-moving", part=_part,
                 block=_b, steps=_s)


# ... do a step's copies overlap MXU work (m dependent 256^3 bf16 dots on resident
# operands) and load/store work (k passes of acc += x over a resident 1 MiB scratch)?
# 1 MiB in and out a step, as r3/overlap
def _overlap_unit(unit: str, n: int, steps: int):
    def body(x_ref, w_ref, o_ref, acc_ref):
        if unit == "mxu":
            a = w_ref[pl.ds(0, 256), pl.ds(0, 256)]
            for _ in range(n):
                a = jnp.dot(a, w_ref[pl.ds(0, 256), pl.ds(0, 256)],
                            preferred_element_type=jnp.float32).astype(jnp.bfloat16)
            o_ref[...] = x_ref[...]
            o_ref[pl.ds(0, 256), pl.ds(0, 256)] += a.astype(jnp.float32)
        else:
            for _ in range(n):
                acc_ref[...] += w_ref[...].astype(jnp.float32)
            o_ref[...] = x_ref[...] + acc_ref[pl.ds(0, 256), :]

    def make():
        spec = pl.BlockSpec((256, 1024), lambda i: (i, 0))
        x = _arr((256 * steps, 1024))
        w = _arr((256, 1024), jnp.bfloat16, seed=1, scale=0.05)
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(steps,),
                   in_specs=[spec, pl.BlockSpec((256, 1024), lambda i: (0, 0))],
                   out_specs=spec, scratch_shapes=[pltpu.VMEM((256, 1024), jnp.float32)])
        return (lambda x, w: fn(x, w)), (x, w)
    return make


for _unit, _ns in (("mxu", (8, 16, 32)), ("load", (4, 8, 16))):
    for _n in _ns:
        for _s in (16, 64):
            _add(f"r4/overlap-{_unit}/n{_n}/s{_s}", "micro", _overlap_unit(_unit, _n, _s),
                 kind="overlap-unit", unit=_unit, n=_n, steps=_s)


# ... a step's floor by the number of blocks copied into it: n inputs of (128, 128), each
# a new block every step, a trivial body
def _copies(n_in: int, dtype: Any, steps: int):
    def body(*refs):
        *ins, o_ref = refs
        acc = ins[0][pl.ds(0, 8), :].astype(jnp.float32)
        for r in ins[1:]:
            acc = acc + r[pl.ds(0, 8), :].astype(jnp.float32)
        o_ref[...] += acc

    def make():
        spec = pl.BlockSpec((128, 128), lambda i: (i, 0))
        xs = tuple(_arr((128 * steps, 128), dtype, seed=j) for j in range(n_in))
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                   grid=(steps,), in_specs=[spec] * n_in,
                   out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))
        return (lambda *xs: fn(*xs)), xs
    return make


for _dt in (jnp.bfloat16, jnp.float32):
    for _n in (1, 2, 4):
        _add(f"r4/copies/{jnp.dtype(_dt).name}/in{_n}/s1024", "micro", _copies(_n, _dt, 1024),
             kind="copies", dtype=jnp.dtype(_dt).name, inputs=_n, steps=1024)


# round 4b: does compute overlap small block copies? Per step, two (128, 128) f32 blocks or
# one (512, 128) f32 block copied in (a new one every step), and a chain of n dependent
# (128, 128) bf16 dots (a chain of vector ops whose rows are not all used is not a
# benchmark: Mosaic drops the unused rows' work, palladium counts it)
def _small_overlap(blocks: str, n: int, steps: int):
    rows, n_in = (128, 2) if blocks == "in2" else (512, 1)

    def body(*refs):
        *ins, w_ref, o_ref = refs
        a = w_ref[pl.ds(0, 128), :].astype(jnp.bfloat16)
        for _ in range(n):
            a = jnp.dot(a, a, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
        acc = a[:8].astype(jnp.float32)
        for r in ins:
            acc = acc + r[pl.ds(0, 8), :]
        o_ref[...] += acc

    def make():
        spec = pl.BlockSpec((rows, 128), lambda i: (i, 0))
        xs = tuple(_arr((rows * steps, 128), seed=j) for j in range(n_in))
        w = _arr((512, 128), seed=9, scale=0.05)
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                   grid=(steps,), in_specs=[spec] * n_in + [
                       pl.BlockSpec((512, 128), lambda i: (0, 0))],
                   out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))
        return (lambda *a: fn(*a)), (*xs, w)
    return make


for _blocks in ("in2", "in1x512"):
    for _n in (0, 1, 2, 4, 8):
        _add(f"r4/small-overlap/{_blocks}/mxu/n{_n}", "micro",
             _small_overlap(_blocks, _n, 1024), kind="small-overlap", unit="mxu",
             blocks=_blocks, n=_n, steps=1024)


# round 5: what an output block written back every step costs a pipeline of small blocks:
# inputs only (the output revisited), an output only (the input revisited), one input and
# one output, two inputs and one output; (rows, cols) f32 blocks of 8 to 128 KiB
def _in_out(n_in: int, out: bool, rows: int, cols: int, steps: int):
    def body(*refs):
        *ins, o_ref = refs
        acc = ins[0][pl.ds(0, 8), :]
        for r in ins[1:]:
            acc = acc + r[pl.ds(0, 8), :]
        if out:
            o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)
        o_ref[pl.ds(0, 8), :] = acc

    def make():
        moving = pl.BlockSpec((rows, cols), lambda i: (i, 0))
        fixed = pl.BlockSpec((rows, cols), lambda i: (0, 0))
        ins = [_arr((rows * steps, cols), seed=j) for j in range(max(n_in, 1))]
        in_specs = [moving if n_in else fixed] * len(ins)
        if out:
            out_shape, out_spec = (rows * steps, cols), moving
        else:
            out_shape, out_spec = (rows, cols), fixed
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct(out_shape, jnp.float32),
                   grid=(steps,), in_specs=in_specs, out_specs=out_spec)
        return (lambda *xs: fn(*xs)), tuple(ins)
    return make


for _rows, _cols in ((8, 256), (8, 1024), (16, 1024), (32, 1024)):
    for _n_in, _out in ((1, False), (0, True), (1, True), (2, True)):
        _kb = _rows * _cols * 4 // 1024
        _add(f"r5/in-out/in{_n_in}out{int(_out)}/{_kb}k/s1024", "micro",
             _in_out(_n_in, _out, _rows, _cols, 1024), kind="in-out", inputs=_n_in,
             output=_out, kib=_kb, steps=1024)


# round 6: a flash-attention backward step (written here from the math, f32 (128, 128)
# blocks, m, l and di replicated over 128 lanes): dkv (dv += p.T @ do, dk += ds.T @ q)
# and dq (dq += ds @ k), on resident blocks and with the blocks jax's backward kernels
# move every step moving (dkv: q, do, l, m, di; dq: k, v)
def _bwd_step(kind: str, moving: bool, steps: int, semantics: str = "arbitrary",
              b: int = 128):
    def body(q_ref, k_ref, v_ref, do_ref, l_ref, m_ref, di_ref, o1_ref, o2_ref):
        @pl.when(pl.program_id(len(grid) - 1) == 0)
        def _():
            o1_ref[...] = jnp.zeros(o1_ref.shape, jnp.float32)
            o2_ref[...] = jnp.zeros(o2_ref.shape, jnp.float32)

        def get(r):
            return r[...] if len(grid) < 4 else r[0, 0]

        q, k, v, do = get(q_ref), get(k_ref), get(v_ref), get(do_ref)
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
        def lanes(x):  # (b, 128) replicated over the lanes, as jax's kernels tile it
            return x if b == 128 else jnp.tile(x, (1, b // 128))
        p = jnp.exp(s - lanes(get(m_ref))) / lanes(get(l_ref))
        dp = jax.lax.dot_general(do, v, (((1,), (1,)), ((), ())),
                                 preferred_element_type=jnp.float32)
        ds = p * (dp - lanes(get(di_ref)))
        if kind == "dkv":
            o1_ref[...] += jax.lax.dot_general(p, do, (((0,), (0,)), ((), ())),
                                               preferred_element_type=jnp.float32)
            o2_ref[...] += jax.lax.dot_general(ds, q, (((0,), (0,)), ((), ())),
                                               preferred_element_type=jnp.float32)
        elif kind == "dkvT":  # the transposes written out, as jax's dkv kernel has them
            o1_ref[...] += jnp.dot(p.T, do, preferred_element_type=jnp.float32)
            o2_ref[...] += jnp.dot(ds.T, q, preferred_element_type=jnp.float32)
        else:
            o1_ref[...] += jnp.dot(ds, k, preferred_element_type=jnp.float32)
            o2_ref[...] += ds[:, :128] * 0.5

    # semantics "parallel": a 2-D grid (8, steps / 8), the first axis parallel, as jax's
    # backward kernels have it (their outputs are per first-axis index)
    grid = ((steps,) if semantics == "arbitrary" else (8, steps // 8) if semantics == "parallel"
            else (1, 1, 1, steps))

    def make():
        rows = b * steps if moving else b
        if len(grid) == 1:
            fixed = pl.BlockSpec((b, 128), lambda i: (0, 0))
            move = pl.BlockSpec((b, 128), lambda i: (i, 0)) if moving else fixed
            out = fixed
            dims: tuple[str, ...] = ("arbitrary",)
        elif len(grid) == 4:  # jax's form: 4-D arrays and blocks, a scalar-prefetch spec
            fixed = pl.BlockSpec((1, 1, b, 128), lambda x, y, z, i: (0, 0, 0, 0))
            move = (pl.BlockSpec((1, 1, b, 128), lambda x, y, z, i: (0, 0, i, 0)) if moving
                    else fixed)
            out = fixed
            dims = ("parallel", "parallel", "parallel", "arbitrary")
        else:
            fixed = pl.BlockSpec((b, 128), lambda o, i: (0, 0))
            move = (pl.BlockSpec((b, 128), lambda o, i: (o * grid[1] + i, 0)) if moving
                    else fixed)
            out = pl.BlockSpec((b, 128), lambda o, i: (o, 0))
            dims = ("parallel", "arbitrary")
        names = ("q", "k", "v", "do", "l", "m", "di")
        moved = {"q", "do", "l", "m", "di"} if kind.startswith("dkv") else {"k", "v"}
        args = []
        for j, n in enumerate(names):
            r = rows if n in moved else b
            if n == "l":
                args.append(_arr((r, 128), seed=j, scale=0.5) + 2.0)
            else:
                args.append(_arr((r, 128), seed=j, scale=0.1))
        four = len(grid) == 4
        if four:
            args = [a.reshape(1, 1, *a.shape) for a in args]
        out_rows = b * grid[0] if len(grid) == 2 else b
        out_shape = (1, 1, b, 128) if four else (out_rows, 128)
        specs = dict(grid=grid, in_specs=[move if n in moved else fixed for n in names],
                     out_specs=(out, out))
        fn = _lazy(body, out_shape=(jax.ShapeDtypeStruct(out_shape, jnp.float32),) * 2,
                   **({"grid_spec": pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=0, **specs)}
                      if four else specs),
                   compiler_params=pltpu.CompilerParams(dimension_semantics=dims))
        return (lambda *xs: fn(*xs)), tuple(args)
    return make


for _kind in ("dkv", "dq"):
    for _moving in (False, True):
        for _s in (256, 1024):
            _add(f"r6/bwd-step/{_kind}/{'moving' if _moving else 'resident'}/s{_s}", "micro",
                 _bwd_step(_kind, _moving, _s), kind="bwd-step", step=_kind, moving=_moving,
                 steps=_s)
        _add(f"r6/bwd-step/{_kind}/{'moving' if _moving else 'resident'}/grid8x128",
             "micro", _bwd_step(_kind, _moving, 1024, "parallel"), kind="bwd-step",
             step=_kind, moving=_moving, steps=1024, semantics="parallel")
        _add(f"r6/bwd-step/{_kind}/{'moving' if _moving else 'resident'}/jax-form",
             "micro", _bwd_step(_kind, _moving, 1024, "jax"), kind="bwd-step",
             step=_kind, moving=_moving, steps=1024, semantics="jax")


# round 7 (2026-12-06, fourth session): what a block copy costs when XLA has placed the
# operand in VMEM (a local DMA, VMEM -> VMEM: its latency and bandwidth by size and count
# in flight), and a blocked matmul's parts (its copies alone, its dots alone on resident
# blocks, both) to see how far copies and MXU work overlap at small blocks
def _dma_local(chunk_rows: int, width: int, chunks: int, in_flight: int):
    def body(x_ref, o_ref, src, dst, sems):
        src[...] = jnp.broadcast_to(x_ref[...], src.shape)

        def copy(i):
            slot = i % in_flight
            return pltpu.make_async_copy(src.at[slot], dst.at[slot], sems.at[slot])
        _copies_in_flight(copy, chunks, in_flight)
        o_ref[...] = dst[0, pl.ds(0, 8), pl.ds(0, 128)]

    def make():
        x = _arr((chunk_rows, width))
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                   scratch_shapes=[pltpu.VMEM((in_flight, chunk_rows, width), jnp.float32),
                                   pltpu.VMEM((in_flight, chunk_rows, width), jnp.float32),
                                   pltpu.SemaphoreType.DMA((in_flight,))])
        return (lambda s: fn(s)), (x,)
    return make


for _rows, _width in ((8, 512), (32, 512), (64, 1024), (256, 1024), (1024, 1024)):
    _bytes = _rows * _width * 4
    _chunks = int(max(16, min(512, (64 << 20) // _bytes)))
    for _k in (1, 2, 4):
        if _bytes * _k * 2 > (8 << 20):
            continue
        _add(f"r7/dma-local/{_bytes}B/k{_k}", "micro", _dma_local(_rows, _width, _chunks, _k),
             kind="dma", direction="local", bytes=_bytes, chunks=_chunks, in_flight=_k)


def _matmul_parts(n: int, bm: int, bk: int, part: str, dtype: Any = jnp.float32):
    """jax's blocked matmul's structure (grid (n/bm, n/bm, n/bk), an f32 accumulator,
    zeroed at k == 0 and stored at the last k): ``full``; ``copy`` (the same copies, no
    dot: the accumulator takes the blocks' first rows); ``dot`` (the same dots on
    blocks that never move: no copies)."""
    steps_k = n // bk

    def body(x_ref, y_ref, o_ref, acc):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc[...] = jnp.zeros(acc.shape, acc.dtype)

        if part == "copy":
            acc[pl.ds(0, 8), :] += (x_ref[pl.ds(0, 8), pl.ds(0, bm)].astype(jnp.float32)
                                    + y_ref[pl.ds(0, 8), :].astype(jnp.float32))
        else:
            acc[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == steps_k - 1)
        def _():
            o_ref[...] = acc[...].astype(o_ref.dtype)

    def make():
        x, y = _arr((n, n), dtype, 1, 0.1), _arr((n, n), dtype, 2, 0.1)
        if part == "dot":
            xs = pl.BlockSpec((bm, bk), lambda i, j, k: (0, 0))
            ys = pl.BlockSpec((bk, bm), lambda i, j, k: (0, 0))
        else:
            xs = pl.BlockSpec((bm, bk), lambda i, j, k: (i, k))
            ys = pl.BlockSpec((bk, bm), lambda i, j, k: (k, j))
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((n, n), dtype),
                   grid=(n // bm, n // bm, steps_k), in_specs=[xs, ys],
                   out_specs=pl.BlockSpec((bm, bm), lambda i, j, k: (i, j)),
                   scratch_shapes=[pltpu.VMEM((bm, bm), jnp.float32)],
                   compiler_params=pltpu.CompilerParams(
                       dimension_semantics=("parallel", "parallel", "arbitrary")))
        return (lambda a, b: fn(a, b)), (x, y)
    return make


for _n, _bm, _bk, _dt in ((2048, 128, 128, jnp.float32), (2048, 256, 256, jnp.float32),
                          (4096, 256, 256, jnp.bfloat16), (2048, 128, 128, jnp.bfloat16)):
    for _part in ("full", "copy", "dot"):
        _add(f"r7/matmul-parts/{jnp.dtype(_dt).name}/{_n}/b{_bm}k{_bk}/{_part}", "micro",
             _matmul_parts(_n, _bm, _bk, _part, _dt), kind="matmul-parts", part=_part,
             n=_n, block=_bm, block_k=_bk, dtype=jnp.dtype(_dt).name)


# round 8: where a blocked matmul's copies lose time over a 1-D pipeline's (r7: jax's
# matmul form copies two (128, 128) f32 blocks a step in 340 ns, a 1-D grid of two
# contiguous blocks in 292, r4): the same two blocks a step, contiguous or as (rows,
# 512-byte) strided pieces of wider arrays, over a 1-D or a 3-D grid, with the output
# written back every 16 steps or once
def _copy_forms(form: str, rows: int, steps: int = 4096):
    n16 = 16  # the 3-D grid's sides: (steps // 256, 16, 16)
    cols_wide = 128 * n16

    def body(x_ref, y_ref, o_ref, acc):
        acc[pl.ds(0, 8), :] += x_ref[pl.ds(0, 8), :] + y_ref[pl.ds(0, 8), :]

        @pl.when(pl.program_id(len(grid) - 1) == n16 - 1)
        def _():
            o_ref[...] = acc[...]

    if form.startswith("grid1d"):
        grid = (steps,)
    else:
        grid = (steps // (n16 * n16), n16, n16)

    def make():
        strided = "strided" in form
        if strided:
            shape = (rows * steps // n16, cols_wide)
        else:
            shape = (rows * steps, 128)
        x, y = _arr(shape, seed=1), _arr(shape, seed=2)
        if form == "grid1d-contig":
            xs = ys = pl.BlockSpec((rows, 128), lambda i: (i, 0))
        elif form == "grid1d-strided":
            xs = ys = pl.BlockSpec((rows, 128), lambda i: (i // n16, i % n16))
        elif form == "grid3d-contig":
            xs = pl.BlockSpec((rows, 128), lambda a, i, k: ((a * n16 + i) * n16 + k, 0))
            ys = pl.BlockSpec((rows, 128), lambda a, j, k: ((a * n16 + k) * n16 + j, 0))
        else:  # grid3d-strided (jax's matmul: x (i, k), y (k, j)), -once: output at the end
            xs = pl.BlockSpec((rows, 128), lambda a, i, k: (a * n16 + i, k))
            ys = pl.BlockSpec((rows, 128), lambda a, j, k: (a * n16 + k, j))
        if form.endswith("once"):
            out_rows = rows
            os_ = pl.BlockSpec((rows, 128), (lambda *g: (0, 0)))
        else:
            out_rows = rows * steps // n16
            os_ = pl.BlockSpec((rows, 128), (lambda i: (i // n16, 0)) if len(grid) == 1
                               else (lambda a, i, k: (a * n16 + i, 0)))
        sem = ("arbitrary",) * len(grid)
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((out_rows, 128), jnp.float32),
                   grid=grid, in_specs=[xs, ys], out_specs=os_,
                   scratch_shapes=[pltpu.VMEM((rows, 128), jnp.float32)],
                   compiler_params=pltpu.CompilerParams(dimension_semantics=sem))
        return (lambda a, b: fn(a, b)), (x, y)
    return make


for _rows in (128, 256):
    for _form in ("grid1d-contig", "grid1d-strided", "grid3d-contig", "grid3d-strided",
                  "grid3d-strided-once"):
        _add(f"r8/copy-forms/{_form}/b{_rows}", "micro", _copy_forms(_form, _rows),
             kind="copy-forms", form=_form, rows=_rows, steps=4096)


# ... and local (VMEM -> VMEM) copies of a pipeline's block shapes, 128 lanes wide (r7's
# 512- and 1024-wide copies: 64 KiB slower than 256 KiB)
for _rows in (64, 128, 256, 512):
    for _k in (1, 2):
        _add(f"r8/dma-local/{_rows}x128/k{_k}", "micro", _dma_local(_rows, 128, 512, _k),
             kind="dma", direction="local", bytes=_rows * 128 * 4, chunks=512, in_flight=_k)


# round 9: what a grid step costs beside a small dot (r7: a blocked matmul's dots alone,
# (128, 128) f32 on resident blocks, 173 ns a step on a 3-D grid with pl.when at the
# first and last k, where the same dot in a fori_loop iteration takes 131 ns, r3): the
# same accumulation over a 1-D or a 3-D grid, with and without the two pl.when, with a
# dot or with one vector add
def _step_forms(grid_form: str, when: bool, work: str, steps: int = 4096):
    n16 = 16
    grid = (steps,) if grid_form == "grid1d" else (steps // (n16 * n16), n16, n16)

    def body(x_ref, y_ref, o_ref, acc):
        k = pl.program_id(len(grid) - 1) if len(grid) == 3 else pl.program_id(0) % n16
        if when:
            @pl.when(k == 0)
            def _():
                acc[...] = jnp.zeros(acc.shape, acc.dtype)

        if work == "dot":
            acc[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
        else:
            acc[...] += x_ref[...]
        if when:
            @pl.when(k == n16 - 1)
            def _():
                o_ref[...] = acc[...]

    def make():
        x, y = _arr((128, 128), seed=1, scale=0.1), _arr((128, 128), seed=2, scale=0.1)
        fixed = pl.BlockSpec((128, 128), (lambda i: (0, 0)) if len(grid) == 1
                             else (lambda a, b, c: (0, 0)))
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32),
                   grid=grid, in_specs=[fixed, fixed], out_specs=fixed,
                   scratch_shapes=[pltpu.VMEM((128, 128), jnp.float32)],
                   compiler_params=pltpu.CompilerParams(
                       dimension_semantics=("arbitrary",) * len(grid)))
        return (lambda a, b: fn(a, b)), (x, y)
    return make


for _g in ("grid1d", "grid3d"):
    for _w in (False, True):
        for _work in ("dot", "add"):
            _add(f"r9/step-forms/{_g}/{'when' if _w else 'plain'}/{_work}", "micro",
                 _step_forms(_g, _w, _work), kind="step-forms", grid=_g, when=_w, work=_work,
                 steps=4096)


# round 10: does the chip hoist loop-invariant work out of a loop (ragged paged
# attention's masks, iota // heads, computed in every iteration of its kv loop, cost the
# model a third of the kernel), and what an int32 vector division costs: 512 iterations
# of h = h + f(...) on a (32, 128) f32 carry, f invariant or depending on the iteration
def _licm(kind: str, steps: int = 512):
    def body(d_ref, x_ref, o_ref):
        d = d_ref[0]
        x = x_ref[...]

        def step(i, h):
            if kind == "plain":
                return h + 1.0
            if kind == "div-invariant":
                q = jax.lax.broadcasted_iota(jnp.int32, (32, 128), 1) // d
                return h + q.astype(jnp.float32)
            if kind == "div-variant":
                q = (jax.lax.broadcasted_iota(jnp.int32, (32, 128), 1) + i) // d
                return h + q.astype(jnp.float32)
            if kind == "exp-invariant":
                return h + jnp.exp(x)
            return h + jnp.exp(x + i.astype(jnp.float32))  # exp-variant

        o_ref[...] = jax.lax.fori_loop(0, steps, step, jnp.zeros((32, 128), jnp.float32))

    def make():
        d = jnp.array([3], jnp.int32)
        x = _arr((32, 128), scale=0.1)
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
                   in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM),
                             pl.BlockSpec(memory_space=pltpu.VMEM)])
        return (lambda a, b: fn(a, b)), (d, x)
    return make


for _kind in ("plain", "div-invariant", "div-variant", "exp-invariant", "exp-variant"):
    for _s in (512, 4096):
        _add(f"r10/licm/{_kind}/steps{_s}", "micro", _licm(_kind, _s), kind="licm",
             variant=_kind, steps=_s)


# round 11: integer division by a constant the compiler knows (ragged paged attention's
# iota // heads: Mosaic folds it into multiplies and shifts) against round 10's by a
# value read at run time (43 ns per vreg)
def _const_div(kind: str, steps: int = 512):
    def body(x_ref, o_ref):
        def step(i, h):
            iota = jax.lax.broadcasted_iota(jnp.int32, (32, 128), 1) + i
            if kind == "floordiv3":
                q = iota // 3
            elif kind == "floordiv4":
                q = iota // 4
            elif kind == "rem3":
                q = iota % 3
            else:  # lax.div: truncating, no floor fix-up
                q = jax.lax.div(iota, jnp.int32(3))
            return h + q.astype(jnp.float32)

        o_ref[...] = jax.lax.fori_loop(0, steps, step, x_ref[...])

    def make():
        x = _arr((32, 128), scale=0.1)
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32))
        return (lambda a: fn(a)), (x,)
    return make


for _kind in ("floordiv3", "floordiv4", "rem3", "laxdiv3"):
    for _s in (512, 4096):
        _add(f"r11/const-div/{_kind}/steps{_s}", "micro", _const_div(_kind, _s),
             kind="const-div", variant=_kind, steps=_s)


# round 12: what an index map's scalar work costs a grid step (jax's causal flash
# attention's maps compare and select at every step; the model charged a blocked operand
# one constant): two revisited (8, 128) inputs whose index maps run 1 + n dependent
# scalar ops that come to block 0
def _index_map_ops(n_ops: int, steps: int = 4096):
    def imap(i):
        x = jnp.minimum(i, 0)
        for _ in range(n_ops // 2):
            x = jnp.minimum(x * 3, 0)
        return (x, 0)

    def body(x_ref, y_ref, o_ref):
        o_ref[...] += x_ref[...] + y_ref[...]

    def make():
        xs = (_arr((8, 128), seed=1), _arr((8, 128), seed=2))
        spec = pl.BlockSpec((8, 128), imap)
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                   grid=(steps,), in_specs=[spec, spec],
                   out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))
        return (lambda a, b: fn(a, b)), xs
    return make


for _n in (0, 8, 32):
    for _s in (256, 4096):
        _add(f"r12/index-map/ops{_n}/s{_s}", "micro", _index_map_ops(_n, _s), kind="index-map",
             ops=_n, steps=_s)


# round 13 (2026-12-06, fifth session): jax's paged attention taken apart by its lengths
# (the sweep over pages per block: the chip's time per computed block is flat from 4 to 8
# pages, the model's is not): every sequence at its full 1024 tokens (every block
# computed), at 16 tokens (one block computed, the rest of the loop skipped by its
# pl.when) and at 512
def _paged_fixed(per_block: int, length: int, batch: int = 8, heads: int = 8,
                 pages: int = 64):
    def make():
        from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
        rng = np.random.default_rng(0)
        total = batch * pages
        q = jnp.asarray(rng.standard_normal((batch, heads, 128)), jnp.float32)
        k = jnp.asarray(rng.standard_normal((heads, total, 16, 128)), jnp.float32)
        v = jnp.asarray(rng.standard_normal((heads, total, 16, 128)), jnp.float32)
        lengths = jnp.full((batch,), length, jnp.int32)
        table = jnp.asarray(rng.permutation(total).reshape(batch, pages), jnp.int32)
        fn = functools.partial(paged_attention, pages_per_compute_block=per_block)
        return fn, (q, k, v, lengths, table)
    return make


for _pb in (1, 2, 4, 8, 16):
    for _len in (16, 512, 1024):
        _add(f"r13/paged/pb{_pb}/len{_len}", "micro", _paged_fixed(_pb, _len), kind="paged-parts",
             per_block=_pb, length=_len)


# round 13b: the manual DMA ring at smaller chunks (its 64-row, 2-slot form is 12% faster
# on the chip than the model has it; 128 to 512 rows are within 4%)
for _rows, _slots in ((16, 2), (32, 2), (64, 3), (32, 4)):
    _add(f"r13/dma-ring/r{_rows}/slots{_slots}", "micro", _ring(64, _rows, _slots),
         kind="ring-parts", rows=_rows, slots=_slots)


# round 14: a paged-attention block's compute, written here from the math (one query
# row; r13: the chip takes 555 ns a computed block at 4 and 8 pages, the model 470), and
# what a transposed right operand costs a chain of dots: 256 loop iterations, each on the
# next of 8 (kr, 128) blocks of a VMEM input (i % 8: read at every iteration)
def _dot_chain(transposed: bool, rows: int, kr: int, iters: int = 256):
    def body(q_ref, k_ref, kt_ref, o_ref):
        def step(i, q):
            k = k_ref[i % 8]
            if transposed:  # q @ k.T, then s @ k
                s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                                        preferred_element_type=jnp.float32)
            else:  # the same values, the block stored transposed
                s = jnp.dot(q, kt_ref[i % 8], preferred_element_type=jnp.float32)
            return jnp.dot(s * 0.01, k, preferred_element_type=jnp.float32)
        o_ref[...] = jax.lax.fori_loop(0, iters, step, q_ref[...])

    def make():
        q = _arr((rows, 128), seed=1, scale=0.1)
        k = _arr((8, kr, 128), seed=2, scale=0.1)
        kt = jnp.swapaxes(k, 1, 2)
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((rows, 128), jnp.float32))
        return (lambda a, b, c: fn(a, b, c)), (q, k, kt)
    return make


def _online_scores(q, k, m_ref, l_ref, first, limit):
    """One block of keys' online-softmax scores (keys from ``first`` on, those from
    ``limit`` on masked), ``m_ref`` and ``l_ref`` updated: (s, l_prev, alpha, beta,
    l_next) for ``_online_output``."""
    qk = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                             preferred_element_type=jnp.float32)
    mask = first + jax.lax.broadcasted_iota(jnp.int32, qk.shape, 1) < limit
    qk = qk + jnp.where(mask, 0.0, -1e30)
    m_curr = qk.max(axis=-1)
    s = jnp.exp(qk - m_curr[..., None])
    m_prev, l_prev = m_ref[...], l_ref[...]
    l_curr = jax.lax.broadcast_in_dim(s.sum(axis=-1), l_prev.shape, (0,))
    m_curr = jax.lax.broadcast_in_dim(m_curr, m_prev.shape, (0,))
    m_next = jnp.maximum(m_prev, m_curr)
    alpha, beta = jnp.exp(m_prev - m_next), jnp.exp(m_curr - m_next)
    l_next = alpha * l_prev + beta * l_curr
    m_ref[...], l_ref[...] = m_next, l_next
    return s, l_prev, alpha, beta, l_next


def _online_output(o_ref, v, scores):
    """``o_ref`` rescaled and the block's values added, by ``_online_scores``'s scores."""
    s, l_prev, alpha, beta, l_next = scores
    o = jnp.dot(s, v, preferred_element_type=jnp.float32)
    o_ref[...] = (l_prev * alpha * o_ref[...] + beta * o) / l_next


def _paged_block(kr: int, iters: int = 256):
    """A paged-attention block's online-softmax update on resident blocks, one row."""
    def body(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref):
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        o_ref[...] = jnp.zeros_like(o_ref)

        def step(i, c):
            q = q_ref[...]
            k, v = k_ref[i % 8], v_ref[i % 8]
            _online_output(o_ref, v, _online_scores(q, k, m_ref, l_ref, i * kr, 100000))
            return c
        jax.lax.fori_loop(0, iters, step, 0)

    def make():
        q = _arr((1, 128), seed=1, scale=0.1)
        k = _arr((8, kr, 128), seed=2, scale=0.1)
        v = _arr((8, kr, 128), seed=3, scale=0.1)
        fn = _lazy(body, out_shape=(jax.ShapeDtypeStruct((1, 128), jnp.float32),
                                    jax.ShapeDtypeStruct((1, 128), jnp.float32),
                                    jax.ShapeDtypeStruct((1, 128), jnp.float32)))
        return (lambda a, b, c: fn(a, b, c)), (q, k, v)
    return make


for _t in (True, False):
    for _rows in (1, 8):
        for _kr in (64, 128):
            _add(f"r14/dot-chain/{'nt' if _t else 'nn'}/q{_rows}/k{_kr}", "micro",
                 _dot_chain(_t, _rows, _kr), kind="dot-chain", transposed=_t, rows=_rows,
                 kr=_kr)
for _kr in (16, 32, 64, 128, 256):
    _add(f"r14/paged-block/k{_kr}", "micro", _paged_block(_kr), kind="paged-block", kr=_kr)


# round 15 (2026-12-06, sixth session): jax's paged-attention loop written from the math,
# taken apart (r13: the chip's time per computed block is 560 ns at 4 pages a block and
# 554 at 8; the model's 471 and 565): per (sequence, head) grid step a loop over blocks
# of ``per_block`` 16-row f32 pages, each block starting the next block's key then value
# page DMAs (page numbers from a scalar-prefetched table) and waiting for its own keys,
# then values. "full": the softmax update between; "dma": the DMAs and waits alone;
# "compute": the update alone, on a block that stays in VMEM
def _paged_inputs(batch: int, heads: int, pages: int):
    """A page table (each sequence's pages, shuffled), one query row per head, and the
    key and value pages (16 rows each) of round 15's and 16's loops."""
    total = batch * pages
    table = jnp.asarray(np.random.default_rng(0).permutation(total).reshape(batch, pages),
                        jnp.int32)
    return (table, _arr((batch, heads, 1, 128), seed=1, scale=0.1),
            _arr((heads, total, 16, 128), seed=2, scale=0.1),
            _arr((heads, total, 16, 128), seed=3, scale=0.1))


def _paged_scratch(rows: int) -> list:
    """Two slots of key and of value pages, their two DMA semaphores each, m and l."""
    return [pltpu.VMEM((2, rows, 128), jnp.float32), pltpu.VMEM((2, rows, 128), jnp.float32),
            pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA((2,)),
            pltpu.VMEM((1, 128), jnp.float32), pltpu.VMEM((1, 128), jnp.float32)]


def _page_copies(table_ref, keys, values, per_block, b, h, i, slot):
    """Block ``i`` of sequence ``b``'s key and value page DMAs for head ``h`` into
    ``slot`` (``keys``, ``values``: the pages in HBM, the slots, their semaphores)."""
    def page(src, buf, sem, p):
        return pltpu.make_async_copy(src.at[h, table_ref[b, i * per_block + p]],
                                     buf.at[slot, pl.ds(p * 16, 16)], sem.at[slot])
    return ([page(*keys, p) for p in range(per_block)],
            [page(*values, p) for p in range(per_block)])


def _paged_loop(per_block: int, variant: str, batch: int = 8, heads: int = 8,
                pages: int = 64):
    blocks, rows = pages // per_block, per_block * 16

    def body(table_ref, q_ref, k_hbm, v_hbm, o_ref, kbuf, vbuf, ksem, vsem, m_ref, l_ref):
        b, h = pl.program_id(0), pl.program_id(1)

        def copies(i, slot):
            return _page_copies(table_ref, (k_hbm, kbuf, ksem), (v_hbm, vbuf, vsem),
                                per_block, b, h, i, slot)

        def start(i, slot):
            ks, vs = copies(i, slot)
            for c in ks + vs:
                c.start()

        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        o_ref[...] = jnp.zeros((1, 128), jnp.float32)
        if variant == "compute":
            kbuf[...] = jnp.zeros_like(kbuf)
            vbuf[...] = jnp.zeros_like(vbuf)
        else:
            start(0, 0)

        def step(i, c):
            slot = i % 2
            if variant != "compute":
                @pl.when(i + 1 < blocks)
                def _():
                    start(i + 1, 1 - slot)
                ks, vs = copies(i, slot)
                for x in ks:
                    x.wait()
            if variant == "dma":
                for x in vs:
                    x.wait()
                o_ref[...] += kbuf[slot, pl.ds(0, 1), :] + vbuf[slot, pl.ds(0, 1), :]
                return c
            scores = _online_scores(q_ref[...], kbuf[slot], m_ref, l_ref, i * rows, 100000)
            if variant != "compute":
                for x in vs:
                    x.wait()
            _online_output(o_ref, vbuf[slot], scores)
            return c
        jax.lax.fori_loop(0, blocks, step, 0)

    def make():
        table, q, k, v = _paged_inputs(batch, heads, pages)
        qspec = pl.BlockSpec((None, None, 1, 128), lambda b, h, t: (b, h, 0, 0))
        anyspec = pl.BlockSpec(memory_space=pl.ANY)
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
                   grid_spec=pltpu.PrefetchScalarGridSpec(
                       num_scalar_prefetch=1, grid=(batch, heads),
                       in_specs=[qspec, anyspec, anyspec], out_specs=qspec,
                       scratch_shapes=_paged_scratch(rows)))
        return (lambda t, a, b, c: fn(t, a, b, c)), (table, q, k, v)
    return make


for _variant in ("full", "dma", "compute"):
    for _pb in (2, 4, 8, 16):
        _add(f"r15/paged-loop/{_variant}/pb{_pb}", "micro", _paged_loop(_pb, _variant),
             kind="paged-loop", variant=_variant, per_block=_pb)


# round 16: the same loop with jax's control code around the math, written here (round
# 15: the loop alone is 485 ns a block at 4 pages on the chip, jax's kernel 560): the
# whole block under a `pl.when` on the sequence's length (read from SMEM), the slot and a
# first-block flag kept in SMEM, and the next block's pages fetched across grid steps
# (the last block of one head fetches the next head's first: its indices in scalar code)
def _paged_jaxlike(per_block: int, when: bool = True, smem: bool = True, cross: bool = True,
                   first_in_loop: bool = True, batch: int = 8, heads: int = 8,
                   pages: int = 64):
    """``when``: the block under a ``pl.when`` on the length; ``smem``: the slot and the
    first-block flag in SMEM (else ``i % 2`` and the loop's first block); ``cross``: the
    last block fetches the next head's first (else each head fetches its own first);
    ``first_in_loop``: the first block's fetch under a ``pl.when`` in the loop (else
    before it; only without ``smem`` and ``cross``)."""
    blocks, rows = pages // per_block, per_block * 16

    def body(table_ref, len_ref, q_ref, k_hbm, v_hbm, o_ref, kbuf, vbuf, ksem, vsem,
             m_ref, l_ref, state):
        b, h = pl.program_id(0), pl.program_id(1)

        def copies(bb, hh, i, slot):
            return _page_copies(table_ref, (k_hbm, kbuf, ksem), (v_hbm, vbuf, vsem),
                                per_block, bb, hh, i, slot)

        @pl.when(((b == 0) & (h == 0)) if cross else True)
        def _():
            state[0] = 0
            state[1] = 1

        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        o_ref[...] = jnp.zeros((1, 128), jnp.float32)
        length = len_ref[b]
        if not first_in_loop:
            ks, vs = copies(b, h, 0, 0)
            for x in ks + vs:
                x.start()

        def step(i, c):
            def block():
                if smem:
                    slot, first = state[0], state[1]
                    state[1] = 0
                else:
                    slot = i % 2
                    first = ((b == 0) & (h == 0) & (i == 0)) if cross else (i == 0)
                if cross:
                    last = i + 1 >= blocks
                    nh = jnp.where(last, jnp.where(h + 1 < heads, h + 1, 0), h)
                    nb = jnp.where(last & (h + 1 >= heads), b + 1, b)
                    ni = jnp.where(last, 0, i + 1)
                    more = nb < batch
                else:
                    nb, nh, ni, more = b, h, i + 1, i + 1 < blocks

                @pl.when((first == 1 if smem else first) if first_in_loop else False)
                def _():
                    ks, vs = copies(b, h, i, slot)
                    for x in ks + vs:
                        x.start()

                @pl.when(more)
                def _():
                    ks, vs = copies(nb, nh, ni, 1 - slot)
                    for x in ks + vs:
                        x.start()
                    if smem:
                        state[0] = 1 - slot
                ks, vs = copies(b, h, i, slot)
                for x in ks:
                    x.wait()
                scores = _online_scores(q_ref[...], kbuf[slot], m_ref, l_ref, i * rows,
                                        length)
                for x in vs:
                    x.wait()
                _online_output(o_ref, vbuf[slot], scores)
            if when:
                pl.when(i * rows < length)(block)
            else:
                block()
            return c
        jax.lax.fori_loop(0, blocks, step, 0)

    def make():
        table, q, k, v = _paged_inputs(batch, heads, pages)
        lengths = jnp.full((batch,), pages * 16, jnp.int32)
        qspec = pl.BlockSpec((None, None, 1, 128), lambda b, h, t, n: (b, h, 0, 0))
        anyspec = pl.BlockSpec(memory_space=pl.ANY)
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
                   grid_spec=pltpu.PrefetchScalarGridSpec(
                       num_scalar_prefetch=2, grid=(batch, heads),
                       in_specs=[qspec, anyspec, anyspec], out_specs=qspec,
                       scratch_shapes=[*_paged_scratch(rows), pltpu.SMEM((2,), jnp.int32)]),
                   compiler_params=pltpu.CompilerParams(
                       dimension_semantics=("arbitrary", "arbitrary")))
        return (lambda t, n, a, b, c: fn(t, n, a, b, c)), (table, lengths, q, k, v)
    return make


for _pb in (2, 4, 8, 16):
    _add(f"r16/paged-jaxlike/pb{_pb}", "micro", _paged_jaxlike(_pb), kind="paged-loop",
         variant="jaxlike", per_block=_pb)
for _pb in (4, 8):
    for _name, _flags in (("when", (True, False, False)), ("smem", (False, True, False)),
                          ("cross", (False, False, True)), ("smem-cross", (False, True, True))):
        _add(f"r17/paged-control/{_name}/pb{_pb}", "micro", _paged_jaxlike(_pb, *_flags),
             kind="paged-loop", variant=_name, per_block=_pb)
for _pb in (4, 8):
    for _name, _flags in (("base", (False, False, False, True)),
                          ("base-first-outside", (False, False, False, False)),
                          ("when-first-outside", (True, False, False, False))):
        _add(f"r18/paged-control/{_name}/pb{_pb}", "micro", _paged_jaxlike(_pb, *_flags),
             kind="paged-loop", variant=_name, per_block=_pb)


# round 19: what a `pl.when` holding DMA starts costs a loop when it is not taken (round
# 18: the first block's fetch under a `pl.when(i == 0)` in jax's paged-attention loop
# costs 124 ns a block at 4 pages): a loop of 64 dependent vector ops on one vreg, and
# in it a `pl.when` on a flag read from SMEM (0: never taken) around ``n`` page DMAs
# (0: no `pl.when` at all), or around ``n`` vector stores (``vec``)
def _cond_dma(n: int, vec: bool = False, steps: int = 64, iters: int = 64):
    def body(flag_ref, table_ref, x_ref, pages_hbm, o_ref, buf, sem):
        def step(i, x):
            if n:
                @pl.when(flag_ref[0] == 1)
                def _():
                    for p in range(n):
                        if vec:
                            buf[p, pl.ds(0, 8), :] = x
                            continue
                        pltpu.make_async_copy(pages_hbm.at[table_ref[(i * n + p) % 64]],
                                              buf.at[p], sem).start()
            return x * 1.0001 + 0.5
        o_ref[...] = jax.lax.fori_loop(0, iters, step, x_ref[...])

    def make():
        flag = jnp.zeros((1,), jnp.int32)
        table = jnp.asarray(np.random.default_rng(4).permutation(64), jnp.int32)
        x = _arr((8, 128), seed=1, scale=0.1)
        pages = _arr((64, 16, 128), seed=2)
        spec = pl.BlockSpec((8, 128), lambda s, f, t: (0, 0))
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                   grid_spec=pltpu.PrefetchScalarGridSpec(
                       num_scalar_prefetch=2, grid=(steps,),
                       in_specs=[spec, pl.BlockSpec(memory_space=pl.ANY)], out_specs=spec,
                       scratch_shapes=[pltpu.VMEM((max(n, 1), 16, 128), jnp.float32),
                                       pltpu.SemaphoreType.DMA(())]))
        return (lambda f, t, a, b: fn(f, t, a, b)), (flag, table, x, pages)
    return make


for _n in (0, 1, 2, 4, 8, 16, 32):
    _add(f"r19/cond-dma/notaken/n{_n}", "micro", _cond_dma(_n), kind="cond-dma", dmas=_n)
for _n in (8, 32):
    _add(f"r19/cond-vec/notaken/n{_n}", "micro", _cond_dma(_n, vec=True), kind="cond-dma",
         stores=_n)


# round 20: whether a grid step's operand work (index maps and block checks: 10.5 ns
# more an operand whose index map computes its block index, round 12) hides under the
# step's compute (jax's flash backward at 128-blocks, 101 ns of it a step, is 21% over
# the chip): six (128, 128) f32 inputs, the same block every step, mapped by a constant
# or through min(i, 0), beside a chain of 0, 4 or 16 dependent dots
def _operands_beside_dots(dynamic: bool, dots: int, n_in: int = 6, steps: int = 1024):
    def imap(i):
        return (jnp.minimum(i, 0), 0) if dynamic else (0, 0)

    def body(*refs):
        ins, o_ref = refs[:n_in], refs[n_in]
        x = ins[0][...]
        for _ in range(dots):
            x = jnp.dot(x, ins[1][...], preferred_element_type=jnp.float32) * 0.01
        for r in ins[2:]:
            x = x + r[...]
        o_ref[...] += x

    def make():
        xs = tuple(_arr((128, 128), seed=s, scale=0.1) for s in range(n_in))
        spec = pl.BlockSpec((128, 128), imap)
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32),
                   grid=(steps,), in_specs=[spec] * n_in,
                   out_specs=pl.BlockSpec((128, 128), lambda i: (0, 0)))
        return (lambda *a: fn(*a)), xs
    return make


for _dyn in (False, True):
    for _dots in (0, 4, 16):
        _add(f"r20/operands-beside-dots/{'dynamic' if _dyn else 'const'}/d{_dots}", "micro",
             _operands_beside_dots(_dyn, _dots), kind="operands-dots", dynamic=_dyn,
             dots=_dots)


# round 21: a page gather with the core's work spaced between its DMA starts or between
# its waits (the issue of a taken DMA start, 12.8 ns when predicated (round 19), against
# the engine's least time per DMA, 21 ns from the page gathers): per grid step 16 f32
# pages started one after the other, then waited for, with ``gap`` dependent vector ops
# on one (16, 128) value after each start (``where="start"``) or after each wait
def _page_gather_spaced(gap: int, where: str, pages_per_step: int = 16, steps: int = 256):
    def body(idx_ref, pages_hbm, o_ref, buf, sem):
        copies = [pltpu.make_async_copy(
            pages_hbm.at[idx_ref[pl.program_id(0) * pages_per_step + j]], buf.at[j], sem)
            for j in range(pages_per_step)]
        x = jnp.full((16, 128), pl.program_id(0).astype(jnp.float32))

        def work(x):
            for _ in range(gap):
                x = x * 1.0001 + 0.5
            return x
        for c in copies:
            c.start()
            if where == "start":
                x = work(x)
        for c in copies:
            c.wait()
            if where == "wait":
                x = work(x)
        o_ref[...] = (jnp.sum(buf[...], axis=0) + x)[None]

    return _page_gather_make(body, pages_per_step, steps, jnp.float32)


for _where in ("start", "wait"):
    for _gap in (0, 2, 8, 32):
        if _gap == 0 and _where == "wait":
            continue
        _add(f"r21/page-gather-spaced/{_where}/gap{_gap}", "micro",
             _page_gather_spaced(_gap, _where), kind="page-gather-spaced", where=_where,
             gap=_gap)


# round 22: what the model's two new rules rest on, and the held-out errors at the edge.
# (1) jax's flash backward with every operand in HBM (sequences too long for XLA to place
# them in VMEM), per kernel at 128- and 256-blocks, beside the 256-block form of round 6's
# step; (2) a block copy's cost at the pipeline's ends: f32 / bf16 copies of (128, 1024)
# blocks over 2 to 64 steps, tanh in bf16 at other blocks; (3) splash at 256-blocks,
# causal and with the full mask (no step skipped), at three lengths
for _b in (128, 256):
    _add(f"r22/flash-backward/h2/s8192/b{_b}", "micro",
         _case(kc.flash_backward_case(2, 8192, _b)), kind="flash-bwd", block=_b)
for _kind in ("dkv", "dq"):
    for _moving in (False, True):
        _add(f"r22/bwd-step/{_kind}/{'moving' if _moving else 'resident'}/jax-form/b256",
             "micro", _bwd_step(_kind, _moving, 256, "jax", b=256), kind="bwd-step",
             step=_kind, moving=_moving, steps=256, block=256)
for _dt in (jnp.float32, jnp.bfloat16):
    for _steps in (2, 4, 8, 16, 64):
        _add(f"r22/copy/{jnp.dtype(_dt).name}/steps{_steps}", "micro",
             _elementwise(lambda x: x, (128 * _steps, 1024), 128, _dt), kind="elementwise",
             fn="copy", dtype=jnp.dtype(_dt).name, steps=_steps)
for _br in (64, 256, 512):
    _add(f"r22/tanh/bfloat16/1024x1024/b{_br}", "micro",
         _elementwise(jnp.tanh, (1024, 1024), _br, jnp.bfloat16), kind="elementwise",
         fn="tanh", dtype="bfloat16", block_rows=_br)


for _causal in (True, False):
    for _seq in (1024, 2048, 4096):
        _add(f"r22/splash-{'causal' if _causal else 'full'}/h2/s{_seq}/b256", "micro",
             _case(kc.splash_forward_case(2, _seq, 256, _causal)), kind="splash", seq=_seq,
             causal=_causal)


# round 23: the dkv step with its transposes written out (p.T @ do, ds.T @ q, as jax's
# kernel has them) against round 6's and 22's contracting the rows (dot_general over
# dimension 0), on resident blocks at 128- and 256-blocks; and one transpose between an
# exp and a dot: s = x @ x.T, p = exp(s), then p.T @ x, dot_general over p's rows, or
# p @ x (no transpose)
for _b in (128, 256):
    _add(f"r23/bwd-step/dkvT/resident/jax-form/b{_b}", "micro",
         _bwd_step("dkvT", False, 256, "jax", b=_b), kind="bwd-step", step="dkvT",
         moving=False, steps=256, block=_b)
    if _b == 128:
        _add("r23/bwd-step/dkv/resident/jax-form/b128", "micro",
             _bwd_step("dkv", False, 256, "jax", b=128), kind="bwd-step", step="dkv",
             moving=False, steps=256, block=128)


def _exp_then_dot(rows: int, form: str, steps: int = 256):
    def body(x_ref, o_ref):
        x = x_ref[...]
        s = jax.lax.dot_general(x, x, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
        p = jnp.exp(s * 0.01)
        if form == "t":
            o_ref[...] += jnp.dot(p.T, x, preferred_element_type=jnp.float32)
        elif form == "rows":
            o_ref[...] += jax.lax.dot_general(p, x, (((0,), (0,)), ((), ())),
                                              preferred_element_type=jnp.float32)
        else:
            o_ref[...] += jnp.dot(p, x, preferred_element_type=jnp.float32)

    def make():
        spec = pl.BlockSpec((rows, 128), lambda i: (0, 0))
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((rows, 128), jnp.float32),
                   grid=(steps,), in_specs=[spec], out_specs=spec)
        return (lambda x: fn(x)), (_arr((rows, 128), scale=0.1),)
    return make


for _b in (128, 256):
    for _form in ("t", "rows", "plain"):
        _add(f"r23/exp-dot/{_form}/b{_b}", "micro", _exp_then_dot(_b, _form),
             kind="exp-dot", form=_form, block=_b)


# round 24: splash's grid steps (256-blocks: ~9% low a computed step, its skipped steps
# 230-330 ns on the chip against the model's 94): k and v mapped through a scalar-prefetch
# table as splash maps them (data_next[h, i, j]) or from the grid indices, the blocks
# moving with j or the same every step, over a (2, 16, 16) grid of a light body
def _table_maps(form: str, heads: int = 2, n: int = 16):
    def body(tbl_ref, q_ref, k_ref, v_ref, o_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o_ref[...] = q_ref[...]

        o_ref[...] += k_ref[...] * 0.5 + v_ref[...]

    def make():
        same = form.endswith("same")
        if form.startswith("table"):
            def kv(h, i, j, tbl):
                return (h, tbl[h, i, j], 0)
        else:
            def kv(h, i, j, tbl):
                return (h, 0 if same else j, 0)
        table = np.zeros((heads, n, n), np.int32) if same else np.broadcast_to(
            np.arange(n, dtype=np.int32), (heads, n, n)).copy()
        qspec = pl.BlockSpec((None, 256, 128), lambda h, i, j, tbl: (h, i, 0))
        kvspec = pl.BlockSpec((None, 256, 128), kv)
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(heads, n, n), in_specs=[qspec, kvspec, kvspec],
            out_specs=qspec)
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((heads, 256 * n, 128), jnp.float32),
                   grid_spec=grid_spec, compiler_params=pltpu.CompilerParams(
                       dimension_semantics=("parallel", "arbitrary", "arbitrary")))
        q, k, v = (_arr((heads, 256 * n, 128), seed=s) for s in range(3))
        return (lambda t, q, k, v: fn(t, q, k, v)), (jnp.asarray(table), q, k, v)
    return make


for _form in ("grid", "table", "grid-same", "table-same"):
    _add(f"r24/kv-maps/{_form}", "micro", _table_maps(_form), kind="kv-maps", form=_form)


# round 25 (2026-12-06, eighth session): every transcendental in bf16 (the held-out set
# 4 put a bf16 sin 23% over: the model charged every bf16 transcendental the mean
# factor of tanh's and exp's, 0.96 and 1.49 of their f32 cost per element)
for _op, _ns in (("log", (4, 16)), ("sin", (2, 8)), ("logistic", (4, 16)),
                 ("rsqrt", (4, 16)), ("div", (4, 16)), ("sqrt", (4, 16))):
    for _n in _ns:
        _add(f"r25/vpu/{_op}/bfloat16/n{_n}", "micro", _chain(_op, jnp.bfloat16, _n),
             kind="vector", op=_op, dtype="bfloat16", n=_n, shape=VPU_SHAPE)


# round 26 (2026-12-06, eighth session): page DMAs in bursts of 32 and 64, from one array
# or split over two (paged attention at 16 pages a block starts 32 page DMAs, its keys'
# and its values', and ran at 17.7 ns a DMA where the model's least was 21 ns:
# r15/paged-loop/dma/pb16 +38%, heldout4/paged/b8h16/p128/pb16 +10.8%)
for _pp in (32, 64):
    for _s in (64, 256):
        _add(f"r26/page-gather-unrolled/float32/p{_pp}/s{_s}", "micro",
             _page_gather_unrolled(_pp, _s, jnp.float32), kind="page-gather",
             dtype="float32", pages=_pp, steps=_s, unrolled=True)


def _page_gather_two(pages_per_step: int, steps: int):
    """As ``_page_gather_unrolled`` in f32, the pages split over two arrays (keys and
    values), each half on its own semaphore, all started then all waited."""
    half = pages_per_step // 2
    total = half * steps

    def body(idx_ref, a_hbm, b_hbm, o_ref, abuf, bbuf, asem, bsem):
        i = pl.program_id(0)
        copies = [pltpu.make_async_copy(src.at[idx_ref[i * half + j]], buf.at[j], sem)
                  for src, buf, sem in ((a_hbm, abuf, asem), (b_hbm, bbuf, bsem))
                  for j in range(half)]
        for c in copies:
            c.start()
        for c in copies:
            c.wait()
        o_ref[...] = (jnp.sum(abuf[...], axis=0) + jnp.sum(bbuf[...], axis=0))[None]

    def make():
        a, b = _arr((total, 16, 128), jnp.float32, 1), _arr((total, 16, 128), jnp.float32, 2)
        idx = jnp.asarray(np.random.default_rng(3).permutation(total), jnp.int32)
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(steps,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
            out_specs=pl.BlockSpec((1, 16, 128), lambda i, idx: (i, 0, 0)),
            scratch_shapes=[pltpu.VMEM((half, 16, 128), jnp.float32),
                            pltpu.VMEM((half, 16, 128), jnp.float32),
                            pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())])
        fn = _lazy(body, out_shape=jax.ShapeDtypeStruct((steps, 16, 128), jnp.float32),
                   grid_spec=grid_spec)
        return (lambda idx, a, b: fn(idx, a, b)), (idx, a, b)
    return make


for _pp in (8, 16, 32, 64):
    _add(f"r26/page-gather-two/float32/p{_pp}/s256", "micro", _page_gather_two(_pp, 256),
         kind="page-gather", dtype="float32", pages=_pp, steps=256, arrays=2)
