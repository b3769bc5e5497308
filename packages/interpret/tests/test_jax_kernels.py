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
