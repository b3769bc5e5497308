"""The kernels the interpreter benchmarks run: jax's shipped TPU kernels and small-op ones.

Each case is ``make() -> (fn, args)`` plus a numpy reference, so every interpreter's
answer is checked before it is timed. Six are jax's own kernels from
``jax.experimental.pallas.ops.tpu`` (matmul, flash attention forward and backward,
splash attention forward, megablox gmm, paged attention); three are written here, in
the style of kernels dominated by many small operations per grid step:

- ``rglru_scan``: an RG-LRU-style gated linear recurrence (sigmoid gates, softplus decay,
  ``h = a * h + sqrt(1 - a^2) * (gate * x)``), one time step per loop iteration, the
  carry in VMEM scratch across sequential grid steps;
- ``gated_delta_chunk``: a gated-delta-rule-style chunked linear attention (cumulative
  log gates by a triangular matmul, decayed causal intra-chunk scores, the inter-chunk
  state in VMEM scratch updated with a beta-weighted delta);
- ``quantized_matmul``: int8 weights with per-column f32 scales, blocked with an f32
  accumulator, dequantised at the last k step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], tuple[Callable, tuple]]
    reference: Callable[..., np.ndarray]
    tolerance: float = 1e-2  # max abs error, relative to max(1, max |expected|)


def _rng():
    return np.random.default_rng(0)


def _normal(rng, shape, scale=1.0):
    return jnp.asarray((rng.standard_normal(shape) * scale).astype(np.float32))


def _softmax_attention(q, k, v, causal=False):
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2)
    if causal:
        n = s.shape[-1]
        s = np.where(np.tril(np.ones((s.shape[-2], n), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


# --- jax's shipped kernels ----------------------------------------------------------------


def matmul_case(n: int = 1024, block: int = 128) -> Case:
    from jax.experimental.pallas.ops.tpu.matmul import matmul

    def make():
        rng = _rng()
        x, y = _normal(rng, (n, n)), _normal(rng, (n, n))
        return functools.partial(matmul, block_shape=(block, block), block_k=block), (x, y)

    return Case(f"matmul {n}^3 (blocks {block})", make,
                lambda x, y: np.asarray(x, np.float64) @ np.asarray(y, np.float64))


def _flash_inputs(heads, seq):
    rng = _rng()
    return tuple(_normal(rng, (1, heads, seq, 128)) for _ in range(3))


def _flash_sizes(block):
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    return fa.BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1,
                         block_q_major_dkv=block, block_k_major_dkv=block, block_k_dkv=block,
                         block_q_dkv=block, block_k_major_dq=block, block_k_dq=block,
                         block_q_dq=block)


def flash_forward_case(heads: int = 2, seq: int = 1024, block: int = 128) -> Case:
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    def make():
        sizes = _flash_sizes(block)
        return (lambda q, k, v: fa.flash_attention(q, k, v, block_sizes=sizes),
                _flash_inputs(heads, seq))

    return Case(f"flash forward h{heads} seq {seq} (blocks {block})", make, _softmax_attention)


def flash_backward_case(heads: int = 2, seq: int = 512, block: int = 128) -> Case:
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    def make():
        sizes = _flash_sizes(block)

        def loss(q, k, v):
            return jnp.sum(fa.flash_attention(q, k, v, block_sizes=sizes) ** 2)

        grad = jax.grad(loss, argnums=(0, 1, 2))
        return (lambda q, k, v: jnp.stack(grad(q, k, v))), _flash_inputs(heads, seq)

    def ref(q, k, v):
        def attention(q, k, v):
            s = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision="highest")
            return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v,
                              precision="highest")

        grads = jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v) ** 2), argnums=(0, 1, 2))
        return np.stack([np.asarray(g) for g in grads(q, k, v)])

    return Case(f"flash backward h{heads} seq {seq} (blocks {block})", make, ref)


def splash_forward_case(heads: int = 2, seq: int = 1024, block: int = 256,
                        causal: bool = True) -> Case:
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    def make():
        one = sm.CausalMask((seq, seq)) if causal else sm.FullMask((seq, seq))
        mask = sm.MultiHeadMask([one for _ in range(heads)])
        sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block)
        kernel = sk.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1)
        rng = _rng()
        q, k, v = (_normal(rng, (heads, seq, 128)) for _ in range(3))
        return kernel, (q, k, v)

    return Case(f"splash forward {'causal' if causal else 'full'} h{heads} seq {seq} "
                f"(blocks {block})", make,
                lambda q, k, v: _softmax_attention(q, k, v, causal=causal))


def gmm_case(m: int = 1024, k: int = 256, n: int = 256, groups: int = 4) -> Case:
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    def make():
        rng = _rng()
        lhs, rhs = _normal(rng, (m, k)), _normal(rng, (groups, k, n))
        sizes = jnp.asarray([m // 8, 3 * m // 8, m // 4, m // 4], jnp.int32)[:groups]
        return functools.partial(gmm, tiling=(128, 128, 128)), (lhs, rhs, sizes)

    def ref(lhs, rhs, sizes):
        lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
        ends = np.cumsum(np.asarray(sizes))
        starts = ends - np.asarray(sizes)
        return np.concatenate([lhs[s:e] @ rhs[g] for g, (s, e) in enumerate(zip(starts, ends))])

    return Case(f"megablox gmm {m}x{k}x{n}, {groups} groups", make, ref)


def paged_attention_case(batch: int = 4, heads: int = 4, page_size: int = 16,
                         pages_per_seq: int = 16, per_block: int = 4) -> Case:
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    total_pages = batch * pages_per_seq

    def make():
        rng = _rng()
        q = _normal(rng, (batch, heads, 128))
        k_pages = _normal(rng, (heads, total_pages, page_size, 128))
        v_pages = _normal(rng, (heads, total_pages, page_size, 128))
        lengths = jnp.asarray(
            rng.integers(page_size, page_size * pages_per_seq, batch), jnp.int32)
        page_indices = jnp.asarray(
            rng.permutation(total_pages).reshape(batch, pages_per_seq), jnp.int32)
        fn = functools.partial(paged_attention, pages_per_compute_block=per_block)
        return fn, (q, k_pages, v_pages, lengths, page_indices)

    def ref(q, k_pages, v_pages, lengths, page_indices):
        out = np.zeros(q.shape)
        for b in range(batch):
            pages = np.asarray(page_indices[b])
            n = int(lengths[b])
            k = np.asarray(k_pages, np.float64)[:, pages].reshape(heads, -1, 128)[:, :n]
            v = np.asarray(v_pages, np.float64)[:, pages].reshape(heads, -1, 128)[:, :n]
            out[b] = _softmax_attention(np.asarray(q[b])[:, None], k, v)[:, 0]
        return out

    # The kernel multiplies in bf16 (jax's HLO interpreter and palladium agree to the
    # bit on these inputs; both are 0.08 from the f64 reference at |expected| <= 3.2).
    return Case(f"paged attention b{batch} h{heads} pages {pages_per_seq}x{page_size} "
                f"(block {per_block})", make, ref, tolerance=5e-2)


# --- small-op kernels written here --------------------------------------------------------


def rglru_scan_case(seq: int = 512, width: int = 256, chunk: int = 64, block: int = 128,
                    interpret=None) -> Case:
    """h_t = a_t * h_{t-1} + sqrt(1 - a_t^2) * sigmoid(gx_t) * x_t with
    a_t = exp(-8 * sigmoid(ga_t) * softplus(c)), one row per loop step."""

    def kernel(x_ref, gx_ref, ga_ref, c_ref, o_ref, h_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            h_ref[...] = jnp.zeros_like(h_ref)

        softplus_c = jnp.logaddexp(c_ref[...], 0.0)

        def step(t, h):
            x = x_ref[pl.ds(t, 1), :]
            gate_x = jax.nn.sigmoid(gx_ref[pl.ds(t, 1), :])
            gate_a = jax.nn.sigmoid(ga_ref[pl.ds(t, 1), :])
            log_a = -8.0 * gate_a * softplus_c
            a = jnp.exp(log_a)
            multiplier = jnp.sqrt(jnp.maximum(1.0 - jnp.exp(2.0 * log_a), 0.0))
            h = a * h + multiplier * (gate_x * x)
            o_ref[pl.ds(t, 1), :] = h
            return h

        h_ref[...] = jax.lax.fori_loop(0, chunk, step, h_ref[...])

    def fn(x, gx, ga, c):
        row = pl.BlockSpec((chunk, block), lambda j, i: (i, j))
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(width // block, seq // chunk),
            in_specs=[row, row, row, pl.BlockSpec((1, block), lambda j, i: (0, j))],
            out_specs=row, scratch_shapes=[pltpu.VMEM((1, block), jnp.float32)],
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "arbitrary")),
        )(x, gx, ga, c)

    def make():
        rng = _rng()
        return fn, (_normal(rng, (seq, width)), _normal(rng, (seq, width)),
                    _normal(rng, (seq, width)), _normal(rng, (1, width)))

    def ref(x, gx, ga, c):
        x, gx, ga, c = (np.asarray(a, np.float64) for a in (x, gx, ga, c))
        sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
        log_a = -8.0 * sig(ga) * np.logaddexp(c, 0.0)
        a, mult = np.exp(log_a), np.sqrt(np.maximum(1 - np.exp(2 * log_a), 0))
        h, out = np.zeros(width), np.empty_like(x)
        for t in range(seq):
            h = a[t] * h + mult[t] * sig(gx[t]) * x[t]
            out[t] = h
        return out

    return Case(f"rg-lru scan {seq}x{width} (chunks {chunk}, 1 row per step)", make, ref)


def gated_delta_chunk_case(seq: int = 1024, heads: int = 2, chunk: int = 64,
                           dk: int = 128, dv: int = 128) -> Case:
    """Chunked gated linear attention with a delta-rule-style state update:
    per chunk, G = cumsum(g); o = (causal(q k^T) * exp(G_i - G_j)) v + (q * exp(G)) S;
    S <- exp(G_last) S + (k * beta * exp(G_last - G))^T (v - (k * exp(G)) S)."""

    def kernel(q_ref, k_ref, v_ref, g_ref, beta_ref, o_ref, s_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            s_ref[...] = jnp.zeros_like(s_ref)

        q, k, v = q_ref[0], k_ref[0], v_ref[0]
        g, beta = g_ref[0], beta_ref[0]  # (chunk, 1)
        rows = jax.lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0)
        cols = jax.lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1)
        lower = (cols <= rows).astype(jnp.float32)
        cum = jnp.dot(lower, g, preferred_element_type=jnp.float32)  # (chunk, 1)
        last = cum[chunk - 1:chunk, :]  # (1, 1)
        decay = jnp.exp(cum - jnp.transpose(cum)) * lower
        scores = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                                     preferred_element_type=jnp.float32) * decay
        state = s_ref[...]
        o_ref[0] = (jnp.dot(scores, v, preferred_element_type=jnp.float32)
                    + jnp.dot(q * jnp.exp(cum), state, preferred_element_type=jnp.float32))
        delta = v - jnp.dot(k * jnp.exp(cum), state, preferred_element_type=jnp.float32)
        weighted = k * (beta * jnp.exp(last - cum))
        s_ref[...] = jnp.exp(last) * state + jax.lax.dot_general(
            weighted, delta, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)

    def fn(q, k, v, g, beta):
        def spec(d):
            return pl.BlockSpec((1, chunk, d), lambda h, c: (h, c, 0))

        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((heads, seq, dv), jnp.float32),
            grid=(heads, seq // chunk),
            in_specs=[spec(dk), spec(dk), spec(dv), spec(1), spec(1)], out_specs=spec(dv),
            scratch_shapes=[pltpu.VMEM((dk, dv), jnp.float32)],
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "arbitrary")),
        )(q, k, v, g, beta)

    def make():
        rng = _rng()
        q = _normal(rng, (heads, seq, dk), dk ** -0.5)
        k = _normal(rng, (heads, seq, dk), dk ** -0.5)
        v = _normal(rng, (heads, seq, dv))
        g = jnp.asarray(-rng.uniform(0.01, 0.1, (heads, seq, 1)).astype(np.float32))
        beta = jnp.asarray(rng.uniform(0.0, 1.0, (heads, seq, 1)).astype(np.float32))
        return fn, (q, k, v, g, beta)

    def ref(q, k, v, g, beta):
        q, k, v, g, beta = (np.asarray(a, np.float64) for a in (q, k, v, g, beta))
        out = np.empty((heads, seq, dv))
        lower = np.tril(np.ones((chunk, chunk)))
        for h in range(heads):
            state = np.zeros((dk, dv))
            for c0 in range(0, seq, chunk):
                sl = slice(c0, c0 + chunk)
                qc, kc, vc, bc = q[h, sl], k[h, sl], v[h, sl], beta[h, sl]
                cum = np.cumsum(g[h, sl], axis=0)
                last = cum[-1:]
                decay = np.exp(cum - cum.T) * lower
                out[h, sl] = (qc @ kc.T * decay) @ vc + (qc * np.exp(cum)) @ state
                delta = vc - (kc * np.exp(cum)) @ state
                state = np.exp(last) * state + (kc * bc * np.exp(last - cum)).T @ delta
        return out

    return Case(f"gated-delta chunks h{heads} seq {seq} (chunk {chunk})", make, ref)


def quantized_matmul_case(m: int = 512, k: int = 1024, n: int = 512, block: int = 128) -> Case:
    """x (f32) @ dequantised int8 w with per-column scales, f32 accumulator."""

    def kernel(x_ref, w_ref, scale_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], w_ref[...].astype(jnp.float32),
                                preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...] * scale_ref[...]

    def fn(x, w, scale):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
            grid=(m // block, n // block, k // block),
            in_specs=[pl.BlockSpec((block, block), lambda i, j, kk: (i, kk)),
                      pl.BlockSpec((block, block), lambda i, j, kk: (kk, j)),
                      pl.BlockSpec((1, block), lambda i, j, kk: (0, j))],
            out_specs=pl.BlockSpec((block, block), lambda i, j, kk: (i, j)),
            scratch_shapes=[pltpu.VMEM((block, block), jnp.float32)],
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "arbitrary")),
        )(x, w, scale)

    def make():
        rng = _rng()
        x = _normal(rng, (m, k))
        w = jnp.asarray(rng.integers(-127, 128, (k, n)).astype(np.int8))
        scale = jnp.asarray(rng.uniform(0.001, 0.01, (1, n)).astype(np.float32))
        return fn, (x, w, scale)

    def ref(x, w, scale):
        return (np.asarray(x, np.float64) @ np.asarray(w, np.float64)) * np.asarray(scale)

    return Case(f"int8 quantized matmul {m}x{k}x{n} (blocks {block})", make, ref)


def all_cases(quick: bool = False) -> list[Case]:
    if quick:
        return [matmul_case(256), flash_forward_case(1, 256), flash_backward_case(1, 256),
                splash_forward_case(1, 512), gmm_case(256, 128, 128),
                paged_attention_case(2, 2, 16, 8, 4), rglru_scan_case(128, 128, 32),
                gated_delta_chunk_case(256, 1), quantized_matmul_case(256, 256, 256)]
    return [matmul_case(), flash_forward_case(), flash_backward_case(), splash_forward_case(),
            gmm_case(), paged_attention_case(), rglru_scan_case(), gated_delta_chunk_case(),
            quantized_matmul_case()]
