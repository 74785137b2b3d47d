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


def _attend(q_BTNK: Array, k_BSNK: Array, v_BSNK: Array, mask_B1TS: Array, dropout_rate: float,
            rng: Array | None, return_probs: bool) -> tuple[Array, Array | None]:
    """softmax(QK^T / sqrt(d_k)) V under a boolean mask, dropout on the probabilities."""
    if (not return_probs and (rng is None or dropout_rate == 0.0)
            and not cpu_bf16(q_BTNK, k_BSNK, v_BSNK)):
        return jax.nn.dot_product_attention(q_BTNK, k_BSNK, v_BSNK, mask=mask_B1TS), None
    # Dropout on the probabilities (or returning them) needs them materialised; so does a
    # bfloat16 CPU run, whose dots go through layers.matmul.
    probs_BNTS = attention_probs(q_BTNK, k_BSNK, mask_B1TS)
    dropped_BNTS = dropout(probs_BNTS, dropout_rate, rng)
    out_BTNK = matmul("bnts,bsnk->btnk", dropped_BNTS.astype(v_BSNK.dtype), v_BSNK)
    return out_BTNK, probs_BNTS if return_probs else None


BAND_BLOCK = 0  # the banded computation's query block at most (0: the window)


def band_block(m: Masking, T: int, S: int) -> int | None:
    """The query block of the banded computation of a local window (`banded`), or None where
    the dense one runs: a self-attention window (no cache offset, no BigBird blocks) whose
    band of key blocks, (2 * ceil(W / block) + 1) * block keys, is at most half the length."""
    if (m.window is None or m.cross or T != S or not isinstance(m.q_offset, int) or m.q_offset
            or (m.pattern is not None and m.pattern.block)):
        return None
    block = min(m.window, BAND_BLOCK) if BAND_BLOCK else m.window
    keys = (2 * -(-m.window // block) + 1) * block
    return block if 2 * keys <= T else None


def _blocks(x_BL: Array, block: int, side: int) -> Array:
    """[B, nb * block, ...] -> [B, nb, (2 * side + 1) * block, ...]: each block of `block`
    positions with the `side` blocks before and after it (zeros beyond the ends)."""
    B, L = x_BL.shape[:2]
    nb = L // block
    x = x_BL.reshape(B, nb, block, *x_BL.shape[2:])
    x = jnp.pad(x, [(0, 0), (side, side)] + [(0, 0)] * (x.ndim - 2))
    return jnp.concatenate([x[:, j:j + nb] for j in range(2 * side + 1)], axis=2)


def banded(q_BTNK: Array, k_BSNK: Array, v_BSNK: Array, m: Masking, block: int) -> Array:
    """A local window computed on the keys near each query block only: queries in blocks of
    `block`, each block against the blocks within the window on either side, under
    dense_mask's rule restricted to them; equal to the dense computation (to rounding) at
    O(T * window) cost instead of O(T^2). A query that sees no key (a padding query with no
    real key in its window) gets the mean of all values, as the dense softmax over S keys
    all masked alike gives it."""
    B, T, N, K = q_BTNK.shape
    side = -(-m.window // block)
    nb = -(-T // block)
    pad = nb * block - T
    padded = (lambda x: jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)))
    q_seg, kv_seg = padded(m.q_segment_ids), padded(m.kv_segment_ids)  # pads are padding (0)
    V = (2 * side + 1) * block
    # Index of each query and key of block u: u * block + i, (u - side) * block + j.
    q_idx_UC = jnp.arange(nb * block).reshape(nb, block)
    k_idx_UV = (jnp.arange(nb)[:, None] - side) * block + jnp.arange(V)[None, :]
    q_BUC = q_seg.reshape(B, nb, block)
    k_BUV = _blocks(kv_seg, block, side)
    mask = (k_BUV[:, :, None, :] != 0) & ((q_BUC[..., None] == k_BUV[:, :, None, :])
                                          | (q_BUC[..., None] == 0))
    band_UCV = jnp.abs(q_idx_UC[:, :, None] - k_idx_UV[:, None, :]) <= m.window
    if m.causal:
        band_UCV = band_UCV & (k_idx_UV[:, None, :] <= q_idx_UC[:, :, None])
    mask_BUCV = mask & band_UCV[None]
    fold = (lambda x: x.reshape(B * nb, *x.shape[2:]))
    out, _ = _attend(fold(padded(q_BTNK).reshape(B, nb, block, N, K)),
                     fold(_blocks(padded(k_BSNK), block, side)),
                     fold(_blocks(padded(v_BSNK), block, side)),
                     fold(mask_BUCV)[:, None], 0.0, None, False)
    out_BTNK = out.reshape(B, nb * block, N, K)[:, :T]
    seen_BT = mask_BUCV.any(-1).reshape(B, nb * block)[:, :T]
    mean_BNK = jnp.mean(v_BSNK.astype(jnp.float32), axis=1).astype(out_BTNK.dtype)
    return jnp.where(seen_BT[:, :, None, None], out_BTNK, mean_BNK[:, None])


def xla_attention(q_BTNK: Array, k_BSNK: Array, v_BSNK: Array, masking: Masking, *,
                  dropout_rate: float = 0.0, rng: Array | None = None,
                  return_probs: bool = False) -> tuple[Array, Array | None]:
    """The reference: softmax(QK^T / sqrt(d_k)) V under the dense mask, dropout on the
    probabilities. Returns (output [B, T, N, K], the probabilities [B, N, T, S] before dropout
    when return_probs, else None). Runs anywhere XLA does. A local window much shorter than
    the sequence, without dropout or probabilities, runs banded (the same result)."""
    block = band_block(masking, q_BTNK.shape[1], k_BSNK.shape[1])
    if block is None or return_probs or (rng is not None and dropout_rate > 0.0):
        return _attend(q_BTNK, k_BSNK, v_BSNK, dense_mask(masking), dropout_rate, rng,
                       return_probs)

    def dense(q, k, v):
        return _attend(q, k, v, dense_mask(masking), 0.0, None, False)[0]

    def local(q, k, v):
        return banded(q, k, v, masking, block)

    p, layer = masking.pattern, masking.layer
    if p is None or not p.global_every:
        return local(q_BTNK, k_BSNK, v_BSNK), None
    if isinstance(layer, int):
        return (dense if p.is_global(layer) else local)(q_BTNK, k_BSNK, v_BSNK), None
    # A layer index traced by scan_layers: its kind picks the computation (one runs).
    return jax.lax.cond(p.is_global(layer), dense, local, q_BTNK, k_BSNK, v_BSNK), None


class XLA(Kernel):
    """The reference kernel: every masking, dropout and probabilities, on any platform; XLA's
    cost analysis counts its FLOPs (and plan's model FLOPs count what the pattern leaves)."""

    name = "xla"

    def __call__(self, q_BTNK, k_BSNK, v_BSNK, masking, **options):
        return xla_attention(q_BTNK, k_BSNK, v_BSNK, masking, **options)


register(XLA())
