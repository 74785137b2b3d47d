"""The splash kernel: Pallas block-sparse flash attention for TPU (interpret mode on CPU), with
packed rows through segment ids and the static masks of windows, global layers and BigBird;
its refusals (dropout, lengths not in 128-multiple tiles, BigBird with packed rows) and its
FLOPs from the tiles it visits (XLA's cost analysis cannot see inside it). docs/attention.md
says what it covers and where it hands over to xla. Shape suffixes as in layers.py."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec

from bert_jax.models.config import ModelConfig
from bert_jax.models.kernels import (
    Array,
    Kernel,
    UnsupportedAttention,
    platform,
    refuse_dropout,
    register,
    say_once,
)
from bert_jax.models.kernels.xla import xla_attention
from bert_jax.models.layers import sharding_context
from bert_jax.models.masking import Masking, Pattern, bigbird_blocks, pattern_of

BLOCK_ERROR = ("model.attention_kernel=splash tiles a sequence of {length} tokens in blocks of "
               "min(model.attention_block_size={block}, {length}), which must be a multiple of "
               "128 that divides {length}; choose a block size and sequence length (data."
               "max_seq_length) that are multiples of 128, or model.attention_kernel=xla")


def bad_blocks(block_size: int, length: int) -> bool:
    block = min(block_size, length)
    return bool(block % 128 or length % block)  # splash's tiles fill whole 128-lane vregs


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
    if m.causal or m.window is not None or m.pattern is not None:
        return q, kv
    last = jnp.max(q, axis=1, keepdims=True)
    return jnp.where(q == 0, last, q), jnp.where((kv == 0) & (last > 0), -1, kv)


def _splash_mask(m: Masking, T: int, S: int, layer: int) -> splash.Mask:
    """The static [T, S] mask of the flags and layer `layer`'s pattern: splash skips the blocks
    it leaves empty. BigBird's global blocks are the row's first (by index): the positions'
    global tokens in a row holding one example from index 0 (`check_data` refuses packing)."""
    p = m.pattern
    if p is not None and p.block:
        n, first = -(-S // p.block), p.block * p.global_blocks
        near = np.kron(bigbird_blocks(p, layer, n), np.ones((p.block, p.block), bool))[:T, :S]
        near |= (np.arange(T) < first)[:, None] | (np.arange(S) < first)[None, :]
        if m.causal:
            near &= np.tri(T, S, dtype=bool)
        return splash.NumpyMask(near)
    if m.window is not None and not (p is not None and p.is_global(layer)):
        return splash.LocalMask((T, S), (m.window, 0 if m.causal else m.window), offset=0)
    return splash.CausalMask((T, S)) if m.causal else splash.FullMask((T, S))


SPLASH_MATMULS = {"forward": 2, "training": 9}  # per visited block: QK^T, PV; backward 7 more


def splash_blocks(T: int, S: int, block: int, *, causal: bool = False, window: int | None = None,
                  pattern: Pattern | None = None, layer: int = 0) -> int:
    """The [block, block] tiles splash visits in one head of one row at layer `layer`: those
    its static mask (`_splash_mask`) leaves non-empty (segment ids skip nothing statically)."""
    m = Masking(None, None, None, None, causal=causal, window=window, pattern=pattern)
    mask = _splash_mask(m, T, S, layer)
    return sum(int(mask[i:i + block, :].reshape(-1, S // block, block).any(axis=(0, 2)).sum())
               for i in range(0, T, block))


def splash_flops(cfg: ModelConfig, batch: int, length: int, *, causal: bool = False,
                 layers: int | None = None, training: bool = True) -> float:
    """Splash's matmul FLOPs for `batch` rows of `length` tokens through a stack of self-attention
    layers (default cfg.num_layers) of cfg's heads and pattern: per visited tile 2 matmuls
    forward (QK^T, PV) and, training, 7 backward (dq: QK^T, dP, dQ; dkv: QK^T, dP, dV, dK), each
    2 * block^2 * head_dim FLOPs per head. XLA's cost analysis cannot see inside the kernel."""
    layers = cfg.num_layers if layers is None else layers
    window, pattern = pattern_of(cfg, layers)
    kinds = pattern.layer_kinds() if pattern is not None else [0] * layers
    block = min(cfg.attention_block_size, length)
    visited: dict[int, int] = {}
    for i, kind in enumerate(kinds):
        if kind not in visited:
            visited[kind] = splash_blocks(length, length, block, causal=causal, window=window,
                                          pattern=pattern, layer=i)
    tiles = sum(visited[k] for k in kinds)
    per_tile = SPLASH_MATMULS["training" if training else "forward"] * 2 * block * block * cfg.head_dim
    return float(tiles * per_tile * cfg.num_heads * batch)


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
                   else f"a length of {T} (not in 128-multiple tiles)" if bad_blocks(block_size, T)
                   else None)
    if xla_instead:
        say_once(f"model.attention_kernel=splash: {xla_instead} runs with the xla kernel")
        return xla_attention(q_BTNK, k_BSNK, v_BSNK, masking, dropout_rate=dropout_rate, rng=rng,
                             return_probs=return_probs)
    if rng is not None:
        refuse_dropout("splash", dropout_rate)
    where = platform()
    SPLASH.check_platform(where)
    block = min(block_size, T)
    # Splash does not scale the logits.
    q_BTNK = q_BTNK * jnp.asarray(1.0 / math.sqrt(q_BTNK.shape[-1]), q_BTNK.dtype)
    q_seg_BT, kv_seg_BS = _splash_segment_ids(masking)

    # One kernel per distinct static mask: a layer index traced by scan_layers picks its
    # layer's kernel with lax.switch (all of them are compiled; one runs).
    layer = masking.layer
    if masking.pattern is None or isinstance(layer, int):
        layers, pick = [layer if isinstance(layer, int) else 0], jnp.int32(0)
    else:
        kinds = masking.pattern.layer_kinds()
        layers = [kinds.index(k) for k in dict.fromkeys(kinds)]  # each kind's first layer
        pick = jnp.asarray([layers.index(kinds.index(k)) for k in kinds], jnp.int32)[layer]

    def per_shard(q_BTNK, k_BSNK, v_BSNK, q_seg_BT, kv_seg_BS, pick):
        N = q_BTNK.shape[2]  # this shard's heads
        sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                                  block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                                  block_q_dq=block, block_kv_dq=block)
        heads_first = (lambda x: x.transpose(0, 2, 1, 3))  # [B, T, N, K] <-> [B, N, T, K]

        def run(layer):
            mask = splash.MultiHeadMask([_splash_mask(masking, T, S, layer)] * N)
            fn = splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                        interpret=where == "cpu")
            return lambda *args: jax.vmap(fn)(*args[:3], segment_ids=splash.SegmentIds(*args[3:]))

        args = (heads_first(q_BTNK), heads_first(k_BSNK), heads_first(v_BSNK), q_seg_BT, kv_seg_BS)
        if len(layers) == 1:
            return heads_first(run(layers[0])(*args))
        return heads_first(jax.lax.switch(pick, [run(i) for i in layers], *args))

    ctx = sharding_context()
    if ctx is None:
        return per_shard(q_BTNK, k_BSNK, v_BSNK, q_seg_BT, kv_seg_BS, pick), None
    batch, _, heads, _ = ctx.spec(("batch", "length", "heads", "kv"), q_BTNK.shape)
    spec_BTNK, spec_BT = PartitionSpec(batch, None, heads, None), PartitionSpec(batch, None)
    sharded = jax.shard_map(per_shard, mesh=ctx.mesh,
                            in_specs=(spec_BTNK,) * 3 + (spec_BT,) * 2 + (PartitionSpec(),),
                            out_specs=spec_BTNK, check_vma=False)
    return sharded(q_BTNK, k_BSNK, v_BSNK, q_seg_BT, kv_seg_BS, pick), None


class Splash(Kernel):
    """Pallas splash attention: TPU, and CPU in interpret mode (the tests)."""

    name = "splash"
    platforms = ("tpu", "cpu")
    reads_block_size = True
    opaque = True

    def __call__(self, q_BTNK, k_BSNK, v_BSNK, masking, **options):
        return splash_attention(q_BTNK, k_BSNK, v_BSNK, masking, **options)

    def wrong_platform(self, platform: str) -> str:
        return (f"model.attention_kernel=splash runs on TPU (and on CPU in interpret mode), not "
                f"on {platform}; choose model.attention_kernel=xla")

    def check(self, cfg: ModelConfig, lengths: Sequence[int], *, training: bool) -> None:
        if training:
            refuse_dropout(self.name, cfg.attention_dropout_rate)
        for length in lengths:
            if bad_blocks(cfg.attention_block_size, length):
                raise UnsupportedAttention(BLOCK_ERROR.format(block=cfg.attention_block_size,
                                                              length=length))

    def check_data(self, cfg: ModelConfig, *, packed: bool) -> None:
        if packed and cfg.attention_pattern == "bigbird":
            raise UnsupportedAttention(
                "model.attention_pattern=bigbird with model.attention_kernel=splash and "
                "data.pack=True: splash's static mask makes only each row's first blocks global, "
                "not each packed example's; set data.pack=False or model.attention_kernel=xla")

    def flops(self, cfg: ModelConfig, batch: int, length: int, *, training: bool,
              causal: bool = False, layers: int | None = None) -> float:
        """The tiles it visits (`splash_flops`), not the keys the pattern leaves."""
        return splash_flops(cfg, batch, length, causal=causal, layers=layers, training=training)


SPLASH = register(Splash())
