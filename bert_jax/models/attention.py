"""Attention, in one place: who may attend to whom (`Masking`), the implementations that
compute it (`KERNELS`, chosen by `model.attention_kernel`), and the multi-head attention layer.

Every kernel receives q, k, v and a `Masking`: the packed-sequence ids of queries and keys
(0 = padding), their positions, and the flags (causal, local window). A dense [B, 1, T, S]
mask exists only inside the kernels that need one (`dense_mask`). A new kernel is a function
with `xla_attention`'s signature added to KERNELS; it raises `UnsupportedAttention` for a
combination it cannot compute (the message names the config field to change).

Shape suffixes as in layers.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.models.layers import Array, Cache, constrain, cpu_bf16, dense, dropout, matmul


class UnsupportedAttention(ValueError):
    """A kernel asked for a masking, dtype or option it cannot compute."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Masking:
    """Which keys each query may see. Query t of row b sees key s when both belong to the same
    packed sequence (segment id; 0 = padding), and, with `causal`, s <= q_offset + t, and, with
    `window`, |q_offset + t - s| <= window. Causal and window masks use indices (query t sits at
    q_offset + t: the cache slot it is written to), as splash and cuDNN do; within a packed
    sequence that is the order of its positions. Padding queries see every non-padding key
    the flags allow (as the reference BERT does), so no row is empty; their outputs never
    reach a loss. The positions (restarting at 0 in each packed sequence) are there for
    kernels that need them."""

    q_segment_ids: Array  # [B, T] int
    kv_segment_ids: Array  # [B, S] int
    q_positions: Array  # [B, T] int
    kv_positions: Array  # [B, S] int
    q_offset: Array | int = 0  # index of the first query among the keys (incremental decoding)
    causal: bool = dataclasses.field(default=False, metadata={"static": True})
    window: int | None = dataclasses.field(default=None, metadata={"static": True})


def dense_mask(m: Masking) -> Array:
    """The boolean mask [B, 1, T, S] of a Masking: True where query t may attend to key s."""
    q = m.q_segment_ids[:, None, :, None]
    k = m.kv_segment_ids[:, None, None, :]
    mask = (k != 0) & ((q == k) | (q == 0))
    if m.causal or m.window is not None:
        q_idx = m.q_offset + jnp.arange(m.q_segment_ids.shape[1])
        k_idx = jnp.arange(m.kv_segment_ids.shape[1])
        if m.causal:
            mask = mask & (k_idx[None, :] <= q_idx[:, None])[None, None]
        if m.window is not None:
            mask = mask & (jnp.abs(q_idx[:, None] - k_idx[None, :]) <= m.window)[None, None]
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


Kernel = Callable[..., tuple[Array, Array | None]]
KERNELS: dict[str, Kernel] = {
    "xla": xla_attention,
}


def kernel(name: str) -> Kernel:
    if name not in KERNELS:
        raise UnsupportedAttention(f"model.attention_kernel={name!r}; choose one of {sorted(KERNELS)}")
    return KERNELS[name]


class Attention(nnx.Module):
    """Multi-head attention (self or encoder-decoder) with an optional key/value cache."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        D, N, K = cfg.emb_dim, cfg.num_heads, cfg.head_dim
        self.query = dense(cfg, D, (N, K), ("embed", "heads", "kv"), rngs=rngs)
        self.key = dense(cfg, D, (N, K), ("embed", "heads", "kv"), rngs=rngs)
        self.value = dense(cfg, D, (N, K), ("embed", "heads", "kv"), rngs=rngs)
        self.out = dense(cfg, (N, K), D, ("heads", "kv", "embed"), axis=(-2, -1), rngs=rngs)
        self.dropout_rate = cfg.attention_dropout_rate
        self.kernel = cfg.attention_kernel
        kernel(self.kernel)  # an unknown name fails here, when the model is built

    def __call__(self, x_BTD: Array, kv_BSD: Array, masking: Masking, *, rng: Array | None = None,
                 cache: Cache | None = None, cache_index: Array | None = None,
                 return_probs: bool = False) -> tuple[Array, Cache | None, Array | None]:
        """Returns (output [B, T, D], the updated cache, the probabilities [B, N, T, S] when
        return_probs else None). With `cache`, this step's keys and values are written at
        cache_index and the queries attend over every cache slot (masking hides the slots
        not written yet)."""
        heads = ("batch", "length", "heads", "kv")
        q_BTNK = constrain(self.query(x_BTD), *heads)
        k_BSNK, v_BSNK = constrain(self.key(kv_BSD), *heads), constrain(self.value(kv_BSD), *heads)
        if cache is not None:
            start = (0, cache_index, 0, 0)
            k_BSNK = jax.lax.dynamic_update_slice(cache["key"], k_BSNK.astype(cache["key"].dtype), start)
            v_BSNK = jax.lax.dynamic_update_slice(cache["value"], v_BSNK.astype(cache["value"].dtype), start)
            cache = {"key": k_BSNK, "value": v_BSNK}
        out_BTNK, probs_BNTS = kernel(self.kernel)(q_BTNK, k_BSNK, v_BSNK, masking,
                                                   dropout_rate=self.dropout_rate, rng=rng,
                                                   return_probs=return_probs)
        return self.out(constrain(out_BTNK, *heads)), cache, probs_BNTS
