"""Attention, in one place: who may attend to whom (`Masking`), the implementations that
compute it (`KERNELS`, chosen by `model.attention_kernel`), and the multi-head attention layer.

Every kernel receives q, k, v and a `Masking`: the packed-sequence ids of queries and keys
(0 = padding), their positions, and the flags (causal, local window, cross-attention). A dense
[B, 1, T, S] mask exists only inside the kernels that need one (`dense_mask`). A new kernel is
a function with `xla_attention`'s signature added to KERNELS; it raises `UnsupportedAttention`
for a combination it cannot compute (the message names the config field to change), and
`check` rejects such a config before anything is compiled.

Kernels: `xla` (the reference: a dense mask, runs anywhere) and `splash` (Pallas block-sparse
flash attention for TPU, in interpret mode on CPU; docs/attention.md says what it covers and
where it hands over to xla).

Shape suffixes as in layers.py.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec

from bert_jax.models.config import ModelConfig
from bert_jax.models.layers import Array, Cache, constrain, cpu_bf16, dense, dropout, matmul, sharding_context

log = logging.getLogger(__name__)


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
    kernels that need them. `cross`: queries and keys are different sequences (a decoder's
    encoder-decoder attention), where a query may have no key to see."""

    q_segment_ids: Array  # [B, T] int
    kv_segment_ids: Array  # [B, S] int
    q_positions: Array  # [B, T] int
    kv_positions: Array  # [B, S] int
    q_offset: Array | int = 0  # index of the first query among the keys (incremental decoding)
    causal: bool = dataclasses.field(default=False, metadata={"static": True})
    window: int | None = dataclasses.field(default=None, metadata={"static": True})
    cross: bool = dataclasses.field(default=False, metadata={"static": True})


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


_SAID: set[str] = set()


def _say_once(line: str) -> None:
    if line not in _SAID:
        _SAID.add(line)
        log.info(line)


def _splash_segment_ids(m: Masking) -> tuple[Array, Array]:
    """Splash's segment ids ([B, T], [B, S]): a query sees only keys with its id, and no query
    may be left with none (its softmax would divide by 0). Full bidirectional attention: a
    padding query joins its row's last sequence and padding keys get an id no query has (-1),
    which for an unpacked row is the reference's masking exactly (SQuAD's span softmax reads
    padding outputs); a row of padding only keeps 0 throughout. With causal or window flags a
    padding query may have no key of any sequence in reach, so padding is its own segment:
    padding outputs then differ from xla's, and no loss reads them (the decoders weight their
    targets by segment id > 0; the BERT objectives read [CLS], tags and masked positions)."""
    q, kv = m.q_segment_ids, m.kv_segment_ids
    if m.causal or m.window is not None:
        return q, kv
    last = jnp.max(q, axis=1, keepdims=True)
    return jnp.where(q == 0, last, q), jnp.where((kv == 0) & (last > 0), -1, kv)


def _splash_mask(m: Masking, T: int, S: int) -> splash.Mask:
    """The static [T, S] mask of the flags: splash skips the blocks it leaves empty."""
    if m.window is not None:
        return splash.LocalMask((T, S), (m.window, 0 if m.causal else m.window), offset=0)
    return splash.CausalMask((T, S)) if m.causal else splash.FullMask((T, S))


def _platform() -> str:
    """Where the step runs: the mesh's devices inside a sharded step (`plan` traces for a TPU
    mesh on a CPU machine), else the default backend."""
    ctx = sharding_context()
    return ctx.mesh.devices.flat[0].platform if ctx is not None else jax.default_backend()


def splash_attention(q_BTNK: Array, k_BSNK: Array, v_BSNK: Array, masking: Masking, *,
                     dropout_rate: float = 0.0, rng: Array | None = None,
                     return_probs: bool = False, block_size: int = 128
                     ) -> tuple[Array, Array | None]:
    """Pallas splash attention (TPU; interpret mode on CPU): flash attention over the blocks the
    flags leave non-empty, packed rows through segment ids, tiles of min(block_size, T). Inside
    a sharded step it runs per shard under shard_map (batch over the batch axes, heads over
    `tensor`). Returning probabilities, incremental decoding, cross-attention and lengths it
    cannot tile go to xla."""
    T, S = q_BTNK.shape[1], k_BSNK.shape[1]
    xla_instead = ("returning attention probabilities" if return_probs
                   else "cross-attention" if masking.cross
                   else "incremental decoding" if T != S or not isinstance(masking.q_offset, int)
                   or masking.q_offset
                   # training lengths are checked up front (check); inference may bring others
                   else f"a length of {T} (not in 128-multiple tiles)" if _bad_blocks(block_size, T)
                   else None)
    if xla_instead:
        _say_once(f"model.attention_kernel=splash: {xla_instead} runs with the xla kernel")
        return xla_attention(q_BTNK, k_BSNK, v_BSNK, masking, dropout_rate=dropout_rate, rng=rng,
                             return_probs=return_probs)
    if rng is not None and dropout_rate > 0.0:
        raise UnsupportedAttention(_DROPOUT_ERROR.format(dropout_rate))
    platform = _platform()
    check_platform("splash", platform)
    block = min(block_size, T)
    # Splash does not scale the logits.
    q_BTNK = q_BTNK * jnp.asarray(1.0 / math.sqrt(q_BTNK.shape[-1]), q_BTNK.dtype)
    q_seg_BT, kv_seg_BS = _splash_segment_ids(masking)

    def per_shard(q_BTNK, k_BSNK, v_BSNK, q_seg_BT, kv_seg_BS):
        N = q_BTNK.shape[2]  # this shard's heads
        sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                                  block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                                  block_q_dq=block, block_kv_dq=block)
        fn = splash.make_splash_mha(splash.MultiHeadMask([_splash_mask(masking, T, S)] * N),
                                    block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                    interpret=platform == "cpu")
        heads_first = (lambda x: x.transpose(0, 2, 1, 3))  # [B, T, N, K] <-> [B, N, T, K]
        out_BNTK = jax.vmap(fn)(heads_first(q_BTNK), heads_first(k_BSNK), heads_first(v_BSNK),
                                segment_ids=splash.SegmentIds(q_seg_BT, kv_seg_BS))
        return heads_first(out_BNTK)

    ctx = sharding_context()
    if ctx is None:
        return per_shard(q_BTNK, k_BSNK, v_BSNK, q_seg_BT, kv_seg_BS), None
    batch, _, heads, _ = ctx.spec(("batch", "length", "heads", "kv"), q_BTNK.shape)
    spec_BTNK, spec_BT = PartitionSpec(batch, None, heads, None), PartitionSpec(batch, None)
    sharded = jax.shard_map(per_shard, mesh=ctx.mesh, in_specs=(spec_BTNK,) * 3 + (spec_BT,) * 2,
                            out_specs=spec_BTNK, check_vma=False)
    return sharded(q_BTNK, k_BSNK, v_BSNK, q_seg_BT, kv_seg_BS), None


Kernel = Callable[..., tuple[Array, Array | None]]
KERNELS: dict[str, Kernel] = {
    "xla": xla_attention,
    "splash": splash_attention,
}
BLOCKED = ("splash",)  # the kernels that read model.attention_block_size

_DROPOUT_ERROR = ("model.attention_dropout_rate={} with model.attention_kernel=splash: splash has "
                  "no dropout on the attention probabilities; set model.attention_dropout_rate=0 "
                  "or use model.attention_kernel=xla")
_BLOCK_ERROR = ("model.attention_kernel=splash tiles a sequence of {length} tokens in blocks of "
                "min(model.attention_block_size={block}, {length}), which must be a multiple of "
                "128 that divides {length}; choose a block size and sequence length (data."
                "max_seq_length) that are multiples of 128, or model.attention_kernel=xla")


def _bad_blocks(block_size: int, length: int) -> bool:
    block = min(block_size, length)
    return bool(block % 128 or length % block)  # splash's tiles fill whole 128-lane vregs


def kernel(name: str) -> Kernel:
    if name not in KERNELS:
        raise UnsupportedAttention(f"model.attention_kernel={name!r}; choose one of {sorted(KERNELS)}")
    return KERNELS[name]


def check_platform(name: str, platform: str) -> None:
    """An error naming the field when kernel `name` cannot run on `platform` (jax's name)."""
    if name == "splash" and platform not in ("tpu", "cpu"):
        raise UnsupportedAttention(f"model.attention_kernel=splash runs on TPU (and on CPU in "
                                   f"interpret mode), not on {platform}; choose "
                                   f"model.attention_kernel=xla")


def check(cfg: ModelConfig, lengths: Sequence[int], *, training: bool) -> None:
    """What the attention settings cannot do at these sequence lengths (training: with the
    config's dropout), found before anything is compiled; raises UnsupportedAttention."""
    kernel(cfg.attention_kernel)
    for length in lengths:
        if cfg.attention_window >= length:
            raise UnsupportedAttention(
                f"model.attention_window={cfg.attention_window} is not smaller than the sequence "
                f"length {length}: every token would see every other; choose a window below "
                f"{length}, or model.attention_window=0 (full attention)")
    if cfg.attention_kernel != "splash":
        return
    if training and cfg.attention_dropout_rate > 0.0:
        raise UnsupportedAttention(_DROPOUT_ERROR.format(cfg.attention_dropout_rate))
    for length in lengths:
        if _bad_blocks(cfg.attention_block_size, length):
            raise UnsupportedAttention(_BLOCK_ERROR.format(block=cfg.attention_block_size,
                                                           length=length))


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
        self.options = {"block_size": cfg.attention_block_size} if self.kernel in BLOCKED else {}

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
                                                   return_probs=return_probs, **self.options)
        return self.out(constrain(out_BTNK, *heads)), cache, probs_BNTS
