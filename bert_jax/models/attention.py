"""Attention, in one place: who may attend to whom (`Masking`, models/masking.py), the kernels
that compute it (models/kernels/: one file each, registered by name and chosen by
`model.attention_kernel`), what a config cannot run (`check_platform`, `check`, `check_data`:
the checks any kernel needs, then the chosen kernel's own) and the multi-head attention layer.

Every kernel receives q, k, v and a `Masking`: the packed-sequence ids of queries and keys
(0 = padding), their positions, and the flags (causal, local window, cross-attention, the
per-layer pattern); a dense mask exists only inside the kernels that need one. To add a
kernel, write one file with a `kernels.Kernel` subclass that registers an instance
(`kernels.register`): its name, platforms, whether it reads model.attention_block_size, what
it refuses (`check`, `check_data`, raising UnsupportedAttention with a message naming the
config field to change), its FLOPs and the call; models/kernels/__init__.py says what each
must provide. Nothing here changes: the layer, the checks, the model config's choices and
`plan` ask the registry.

Shape suffixes as in layers.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.models import kernels
from bert_jax.models.config import ModelConfig
from bert_jax.models.kernels import Kernel, UnsupportedAttention
from bert_jax.models.layers import Array, Cache, constrain, dense, matmul, rope
from bert_jax.models.masking import Masking

__all__ = ["Attention", "Kernel", "Masking", "UnsupportedAttention", "check",
           "check_data", "check_pattern", "check_platform", "kernel", "rope_theta"]


def kernel(name: str) -> Kernel:
    """The registered kernel `name`; an unknown name is an error naming the field."""
    return kernels.get(name)


def check_platform(name: str, platform: str) -> None:
    """An error naming the field when kernel `name` cannot run on `platform` (jax's name)."""
    kernels.get(name).check_platform(platform)


def check_pattern(cfg: ModelConfig) -> None:
    """Pattern fields that do not go together (any length); raises UnsupportedAttention."""
    p, window, every = cfg.attention_pattern, cfg.attention_window, cfg.attention_global_every
    if p != "full" and window:
        raise UnsupportedAttention(
            f"model.attention_window={window} with model.attention_pattern={p}: the window is the "
            f"local pattern of model.attention_pattern=full"
            + ("; bigbird's window is model.bigbird_window_blocks" if p == "bigbird" else "")
            + "; set model.attention_window=0")
    if every and not window:
        raise UnsupportedAttention(
            f"model.attention_global_every={every} makes every {every}th layer global among local "
            f"layers: it needs model.attention_window > 0 (e.g. 128), or set it to 0")
    if p == "linformer" and not hasattr(cfg, "linformer_k"):
        raise UnsupportedAttention(
            f"model.attention_pattern=linformer: {type(cfg).family} models attend causally or "
            f"across sequences; linformer (keys projected along the sequence) is for the BERT "
            f"models; choose model.attention_pattern=full or bigbird")
    if p == "linformer" and cfg.attention_kernel != "xla":
        raise UnsupportedAttention(
            "model.attention_pattern=linformer runs with model.attention_kernel=xla (its keys "
            "are linformer_k projections, no sparse mask); set model.attention_kernel=xla")


def check_data(cfg: ModelConfig, *, packed: bool) -> None:
    """What the pattern, then the kernel, cannot do with packed rows (data.pack)."""
    if packed and cfg.attention_pattern == "linformer":
        raise UnsupportedAttention(
            "model.attention_pattern=linformer with data.pack=True: linformer's projection mixes "
            "every position of a row, so packed examples would see each other; set "
            "data.pack=False or choose another model.attention_pattern")
    kernels.get(cfg.attention_kernel).check_data(cfg, packed=packed)


def _divisor(length: int, block: int) -> int:
    """The largest divisor of length below it and not above block (a suggestion)."""
    return max(d for d in range(1, max(2, min(block, length // 2) + 1)) if length % d == 0)


def check(cfg: ModelConfig, lengths: Sequence[int], *, training: bool) -> None:
    """What the attention settings cannot do at these sequence lengths (training: with the
    config's dropout), found before anything is compiled: what any kernel refuses, then what
    the chosen one does; raises UnsupportedAttention."""
    chosen = kernels.get(cfg.attention_kernel)
    check_pattern(cfg)
    for length in lengths:
        if cfg.attention_window >= length:
            raise UnsupportedAttention(
                f"model.attention_window={cfg.attention_window} is not smaller than the sequence "
                f"length {length}: every token would see every other; choose a window below "
                f"{length}, or model.attention_window=0 (full attention)")
        if cfg.attention_pattern == "bigbird" and length % cfg.bigbird_block:
            raise UnsupportedAttention(
                f"model.bigbird_block={cfg.bigbird_block} does not divide the sequence length "
                f"{length}: bigbird works in whole blocks; choose a block that divides {length} "
                f"(e.g. model.bigbird_block={_divisor(length, cfg.bigbird_block)})")
        if cfg.attention_pattern == "linformer" and cfg.linformer_k >= length:
            raise UnsupportedAttention(
                f"model.linformer_k={cfg.linformer_k} is not smaller than the sequence length "
                f"{length}: the projection would not shorten it; choose model.linformer_k below "
                f"{length}, or model.attention_pattern=full")
    chosen.check(cfg, lengths, training=training)


def rope_theta(m: Masking, global_theta: float, local_theta: float) -> Array | float:
    """The rope base of the layer attending: the local one where a window applies (all layers,
    or those a Pattern does not make global), else the global one."""
    if m.window is None:
        return global_theta
    if m.pattern is None or not m.pattern.global_every:
        return local_theta
    return jnp.where(m.pattern.is_global(m.layer), global_theta, local_theta)


class Attention(nnx.Module):
    """Multi-head attention (self or encoder-decoder) with an optional key/value cache."""

    def __init__(self, cfg, *, rngs: nnx.Rngs, cross: bool = False):
        D, N, K = cfg.emb_dim, cfg.num_heads, cfg.head_dim
        self.query = dense(cfg, D, (N, K), ("embed", "heads", "kv"), rngs=rngs)
        self.key = dense(cfg, D, (N, K), ("embed", "heads", "kv"), rngs=rngs)
        self.value = dense(cfg, D, (N, K), ("embed", "heads", "kv"), rngs=rngs)
        self.out = dense(cfg, (N, K), D, ("heads", "kv", "embed"), axis=(-2, -1), rngs=rngs,
                         role="out")
        self.dropout_rate = cfg.attention_dropout_rate
        # Rotary positions on self-attention's queries and keys; the local (window) layers
        # have their own base (ModernBERT: 10k local, 160k global).
        self.rope = cfg.positions == "rope" and not cross
        self.rope_thetas = (cfg.rope_theta, cfg.rope_local_theta or cfg.rope_theta)
        self.kernel = cfg.attention_kernel  # a name (the model config checked it): looked up per call
        self.options = kernels.get(self.kernel).options(cfg)
        # Linformer: one [max_len, k] projection per layer, shared by keys, values and heads
        # (the paper's key-value sharing).
        self.linformer = (nnx.Param(nnx.initializers.normal(cfg.max_len ** -0.5)(
            rngs.params(), (cfg.max_len, cfg.linformer_k)), out_sharding=(None, None))
            if cfg.attention_pattern == "linformer" else None)

    def _project(self, k_BSNK: Array, v_BSNK: Array, m: Masking) -> tuple[Array, Array, Masking]:
        """Linformer: keys and values projected along the sequence to k; padding keys are zeroed
        first, so a row's output depends on its real tokens only. Every query sees all k."""
        S = k_BSNK.shape[1]
        E_SJ = self.linformer[...][:S].astype(k_BSNK.dtype)
        real = (m.kv_segment_ids != 0)[:, :, None, None]
        k_BJNK, v_BJNK = (matmul("bsnk,sj->bjnk", jnp.where(real, x, 0), E_SJ)
                          for x in (k_BSNK, v_BSNK))
        B, J = k_BJNK.shape[:2]
        kv_pos_BJ = jnp.broadcast_to(jnp.arange(J), (B, J))
        return k_BJNK, v_BJNK, Masking((m.q_segment_ids != 0).astype(jnp.int32),
                                       jnp.ones((B, J), jnp.int32), m.q_positions, kv_pos_BJ)

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
        if self.rope:  # self-attention: the new keys sit at the queries' positions
            theta = rope_theta(masking, *self.rope_thetas)
            q_BTNK = rope(q_BTNK, masking.q_positions, theta)
            k_BSNK = rope(k_BSNK, masking.q_positions, theta)
        if cache is not None:
            start = (0, cache_index, 0, 0)
            k_BSNK = jax.lax.dynamic_update_slice(cache["key"], k_BSNK.astype(cache["key"].dtype), start)
            v_BSNK = jax.lax.dynamic_update_slice(cache["value"], v_BSNK.astype(cache["value"].dtype), start)
            cache = {"key": k_BSNK, "value": v_BSNK}
        if self.linformer is not None:
            k_BSNK, v_BSNK, masking = self._project(k_BSNK, v_BSNK, masking)
        out_BTNK, probs_BNTS = kernels.get(self.kernel)(
            q_BTNK, k_BSNK, v_BSNK, masking, dropout_rate=self.dropout_rate, rng=rng,
            return_probs=return_probs, **self.options)
        return self.out(constrain(out_BTNK, *heads)), cache, probs_BNTS
