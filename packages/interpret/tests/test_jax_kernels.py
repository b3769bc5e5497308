"""Kernels shipped in the jax wheel (jax.experimental.pallas.ops.tpu), run by palladium."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import flash_attention as fa
from jax.experimental.pallas.ops.tpu import matmul as mm
from jax.experimental.pallas.ops.tpu.random import philox, threefry  # noqa: F401 (registers PRNGs)

from palladium.interpret import InterpretParams, force_tpu_interpret_mode

BLOCKS = fa.BlockSizes(
    block_q=128, block_k_major=128, block_k=128, block_b=1,
    block_q_major_dkv=128, block_k_major_dkv=128, block_k_dkv=128, block_q_dkv=128,
    block_k_major_dq=128, block_k_dq=128, block_q_dq=128,
)


def test_matmul():
    x = jax.random.normal(jax.random.key(0), (256, 256))
    y = jax.random.normal(jax.random.key(1), (256, 256))
    with force_tpu_interpret_mode(InterpretParams()):
        out = mm.matmul(x, y, block_shape=(128, 128))
    np.testing.assert_allclose(out, x @ y, rtol=1e-4, atol=1e-3)


def _qkv():
    return [jax.random.normal(jax.random.key(i), (1, 2, 256, 64)) for i in range(3)]


def test_flash_attention_forward():
    q, k, v = _qkv()
    with force_tpu_interpret_mode(InterpretParams()):
        out = fa.flash_attention(q, k, v, causal=True, block_sizes=BLOCKS)
    np.testing.assert_allclose(out, fa.mha_reference(q, k, v, None, causal=True), rtol=1e-4, atol=1e-4)


def test_flash_attention_backward_via_grad():
    q, k, v = _qkv()

    def loss(q, k, v):
        return fa.flash_attention(q, k, v, causal=True, block_sizes=BLOCKS).sum()

    def ref_loss(q, k, v):
        return fa.mha_reference(q, k, v, None, causal=True).sum()

    with force_tpu_interpret_mode(InterpretParams()):
        grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    for g, r in zip(grads, jax.grad(ref_loss, argnums=(0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-3)


def test_threefry_kernel_matches_jax_threefry():
    with force_tpu_interpret_mode(InterpretParams()):
        bits = jax.random.bits(jax.random.key(7, impl="pallas_threefry2x32"), (16, 256), jnp.uint32)
    ref = jax.random.bits(jax.random.key(7, impl="threefry2x32"), (16, 256), jnp.uint32)
    np.testing.assert_array_equal(bits, ref)


def test_philox_kernel_matches_jax_interpreter():
    key = jax.random.key(3, impl="pallas_philox4x32")
    with force_tpu_interpret_mode(InterpretParams()):
        bits = jax.random.bits(key, (16, 256), jnp.uint32)
    with force_tpu_interpret_mode(True):  # jax's own (HLO) interpreter as the reference
        ref = jax.random.bits(key, (16, 256), jnp.uint32)
    np.testing.assert_array_equal(bits, ref)


def ragged_paged_attention_inputs():
    """jax's ragged paged attention's operands for three sequences of mixed prefill and
    decode, and how many query rows they have (the rest of the output is padding)."""
    rng = np.random.default_rng(0)
    q_lens, kv_lens = np.array([5, 1, 18]), np.array([40, 17, 90, 0])
    q = jnp.asarray(rng.standard_normal((32, 8, 128)), jnp.float32)
    kv = jnp.asarray(rng.standard_normal((64, 16, 4, 128)), jnp.float32)
    pages = jnp.asarray(rng.permutation(64)[:32].reshape(4, 8), jnp.int32)
    cu_q = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens), [q_lens.sum()]]), jnp.int32)
    args = (q, kv, jnp.asarray(kv_lens, jnp.int32), pages, cu_q, jnp.array([3], jnp.int32))
    return args, int(q_lens.sum())


def ragged_paged_attention_case():
    """jax's shipped ragged paged attention (it uses jnp.sign and integer //) on
    ``ragged_paged_attention_inputs``, and its reference."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

    args, n = ragged_paged_attention_inputs()
    out = rpa.ragged_paged_attention(*args, num_kv_pages_per_block=4, num_queries_per_block=8)
    return np.asarray(out)[:n], np.asarray(rpa.ref_ragged_paged_attention(*args))[:n]


def test_ragged_paged_attention_is_not_rejected_and_matches_its_reference():
    # It failed the lowering check ("Unsupported TPU device kind: cpu" at its jnp.sign).
    with force_tpu_interpret_mode(InterpretParams(compile_check="approximate")):
        out, ref = ragged_paged_attention_case()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


# --- uninitialized_reads="on_use" (the default) on calls 1-4: no false report ------------
# (calls 3 and 4 run the compiled paths: segments from launch 3, whole launches)

CALLS = 4


def test_megablox_gmm_and_its_gradient_tgmm_on_calls_1_to_4():
    """gmm merges each output tile with ``jnp.where(mask, acc, out[...])``: rows of
    other groups are read uninitialised and discarded (the read-based check reports it)."""
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.standard_normal((256, 128)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((4, 128, 128)), jnp.float32)
    sizes = jnp.asarray([32, 96, 64, 64], jnp.int32)  # group edges inside 128-row tiles
    ends = np.cumsum(np.asarray(sizes))
    groups = np.searchsorted(ends, np.arange(256), side="right")

    def loss(lhs, rhs):
        out = gmm(lhs, rhs, sizes, tiling=(128, 128, 128))
        return (out * out).sum(), out

    with force_tpu_interpret_mode(InterpretParams()):
        f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
        for _ in range(CALLS):
            (_, out), (dlhs, drhs) = f(lhs, rhs)
            lhs64, rhs64 = np.float64(lhs), np.float64(rhs)
            ref = np.einsum("mk,mkn->mn", lhs64, rhs64[groups])
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)
            np.testing.assert_allclose(dlhs, np.einsum("mn,mkn->mk", 2 * ref, rhs64[groups]),
                                       rtol=1e-4, atol=1e-2)
            ref_drhs = np.stack([lhs64[groups == g].T @ (2 * ref[groups == g]) for g in range(4)])
            np.testing.assert_allclose(drhs, ref_drhs, rtol=1e-4, atol=1e-2)


def test_flash_attention_not_causal_on_calls_1_to_4():
    q, k, v = _qkv()
    with force_tpu_interpret_mode(InterpretParams()):
        f = jax.jit(lambda q, k, v: fa.flash_attention(q, k, v, causal=False, block_sizes=BLOCKS))
        for _ in range(CALLS):
            np.testing.assert_allclose(f(q, k, v), fa.mha_reference(q, k, v, None, causal=False),
                                       rtol=1e-4, atol=1e-4)


def test_splash_attention_causal_on_calls_1_to_4():
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    heads, seq = 2, 512
    mask = sm.MultiHeadMask([sm.CausalMask((seq, seq)) for _ in range(heads)])
    kernel = sk.make_splash_mha(mask, block_sizes=sk.BlockSizes(
        block_q=256, block_kv=256, block_kv_compute=256), head_shards=1, q_seq_shards=1)
    q, k, v = (jax.random.normal(jax.random.key(i), (heads, seq, 128)) for i in range(3))
    s = jnp.einsum("hqd,hkd->hqk", q, k)
    s = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), s, -jnp.inf)
    ref = jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, axis=-1), v)
    with force_tpu_interpret_mode(InterpretParams()):
        f = jax.jit(kernel)
        for _ in range(CALLS):
            np.testing.assert_allclose(f(q, k, v), ref, rtol=1e-3, atol=1e-3)


def test_paged_attention_on_calls_1_to_4():
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    batch, heads, page, pages_per_seq = 2, 2, 16, 8
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.standard_normal((batch, heads, 128)), jnp.float32)
    k_pages, v_pages = (jnp.asarray(rng.standard_normal((heads, batch * pages_per_seq, page, 128)),
                                    jnp.float32) for _ in range(2))
    lengths = jnp.asarray([37, 100], jnp.int32)
    indices = jnp.asarray(rng.permutation(batch * pages_per_seq).reshape(batch, pages_per_seq),
                          jnp.int32)
    ref = np.zeros((batch, heads, 128))
    for b in range(batch):
        n = int(lengths[b])
        kk = np.float64(k_pages)[:, np.asarray(indices[b])].reshape(heads, -1, 128)[:, :n]
        vv = np.float64(v_pages)[:, np.asarray(indices[b])].reshape(heads, -1, 128)[:, :n]
        s = np.einsum("hd,hkd->hk", np.float64(q[b]), kk)
        p = np.exp(s - s.max(-1, keepdims=True))
        ref[b] = np.einsum("hk,hkd->hd", p / p.sum(-1, keepdims=True), vv)
    with force_tpu_interpret_mode(InterpretParams()):
        f = jax.jit(lambda *a: paged_attention(*a, pages_per_compute_block=4))
        for _ in range(CALLS):
            np.testing.assert_allclose(f(q, k_pages, v_pages, lengths, indices), ref,
                                       rtol=5e-2, atol=5e-2)
