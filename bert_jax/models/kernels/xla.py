"""The xla kernel, the reference: softmax(QK^T / sqrt(d_k)) V under a dense [B, 1, T, S] mask
(built here, the only place one exists), dropout on the probabilities; runs anywhere XLA does.
Shape suffixes as in layers.py."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.models.kernels import Array, Kernel, register
from bert_jax.models.layers import cpu_bf16, dropout, matmul
from bert_jax.models.masking import Masking, bigbird_blocks


def dense_mask(m: Masking) -> Array:
    """The boolean mask [B, 1, T, S] of a Masking: True where query t may attend to key s."""
    q = m.q_segment_ids[:, None, :, None]
    k = m.kv_segment_ids[:, None, None, :]
    mask = (k != 0) & ((q == k) | (q == 0))
    q_idx = m.q_offset + jnp.arange(m.q_segment_ids.shape[1])
    k_idx = jnp.arange(m.kv_segment_ids.shape[1])
    if m.causal:
        mask = mask & (k_idx[None, :] <= q_idx[:, None])[None, None]
    if m.window is not None:
        band = jnp.abs(q_idx[:, None] - k_idx[None, :]) <= m.window
        if m.pattern is not None:
            band = band | m.pattern.is_global(m.layer)
        mask = mask & band[None, None]
    if m.pattern is not None and m.pattern.block:
        p, S = m.pattern, m.kv_segment_ids.shape[1]
        n = -(-S // p.block)
        table = jnp.asarray(np.stack([bigbird_blocks(p, i, n) for i in range(p.num_layers)]))
        near = table[m.layer][(q_idx // p.block)[:, None], (k_idx // p.block)[None, :]]
        first = p.block * p.global_blocks
        glob = (m.q_positions < first)[:, :, None] | (m.kv_positions < first)[:, None, :]
        mask = mask & (near[None] | glob)[:, None]
    return mask


def attention_probs(q_BTNK: Array, k_BSNK: Array, mask_B1TS: Array) -> Array:
    """softmax(QK^T / sqrt(d_k)) over the keys, float32 [B, N, T, S]; masked keys get 0."""
    scale = 1.0 / math.sqrt(q_BTNK.shape[-1])
    logits_BNTS = matmul("btnk,bsnk->bnts", q_BTNK, k_BSNK).astype(jnp.float32) * scale
    logits_BNTS = jnp.where(mask_B1TS, logits_BNTS, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(logits_BNTS, axis=-1)


def xla_attention(q_BTNK: Array, k_BSNK: Array, v_BSNK: Array, masking: Masking, *,
                  dropout_rate: float = 0.0, rng: Array | None = None,
                  return_probs: bool = False) -> tuple[Array, Array | None]:
    """The reference: softmax(QK^T / sqrt(d_k)) V under the dense mask, dropout on the
    probabilities. Returns (output [B, T, N, K], the probabilities [B, N, T, S] before dropout
    when return_probs, else None). Runs anywhere XLA does."""
    mask_B1TS = dense_mask(masking)
    if (not return_probs and (rng is None or dropout_rate == 0.0)
            and not cpu_bf16(q_BTNK, k_BSNK, v_BSNK)):
        return jax.nn.dot_product_attention(q_BTNK, k_BSNK, v_BSNK, mask=mask_B1TS), None
    # Dropout on the probabilities (or returning them) needs them materialised; so does a
    # bfloat16 CPU run, whose dots go through layers.matmul.
    probs_BNTS = attention_probs(q_BTNK, k_BSNK, mask_B1TS)
    dropped_BNTS = dropout(probs_BNTS, dropout_rate, rng)
    out_BTNK = matmul("bnts,bsnk->btnk", dropped_BNTS.astype(v_BSNK.dtype), v_BSNK)
    return out_BTNK, probs_BNTS if return_probs else None


class XLA(Kernel):
    """The reference kernel: every masking, dropout and probabilities, on any platform; XLA's
    cost analysis counts its FLOPs (and plan's model FLOPs count what the pattern leaves)."""

    name = "xla"

    def __call__(self, q_BTNK, k_BSNK, v_BSNK, masking, **options):
        return xla_attention(q_BTNK, k_BSNK, v_BSNK, masking, **options)


register(XLA())
