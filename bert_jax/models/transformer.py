"""The Transformer of Vaswani et al. (2017): Encoder, Decoder, EncoderDecoder; and a
decoder-only LM (GPT style). Shape suffixes as in layers.py."""

from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

from bert_jax.models.config import DecoderLMConfig, EncoderDecoderConfig
from bert_jax.models.layers import (
    Array,
    Cache,
    ModelConfig,
    Stack,
    attend,
    attention_mask,
    dropout,
    embed,
    init_cache,
    layer_flops_per_token,
    logits_flops_per_token,
    sinusoidal_positions,
    split_rng,
)


def _default_segments(ids_BT: Array, segments_BT: Array | None, pad_id: int) -> Array:
    return (ids_BT != pad_id).astype(jnp.int32) if segments_BT is None else segments_BT


def _default_positions(ids_BT: Array, positions_BT: Array | None, offset=0) -> Array:
    if positions_BT is not None:
        return positions_BT
    return jnp.broadcast_to(offset + jnp.arange(ids_BT.shape[1]), ids_BT.shape)


def _causal_mask(seg_BT: Array, cache: Cache | None, cache_index) -> Array:
    if cache is None:
        return attention_mask(seg_BT, seg_BT, causal=True)
    # Decoding: the keys are all cache slots [L, B, S, N, K]; the causal mask hides the
    # slots after the current position, which are not written yet.
    kv_seg_BS = jnp.ones((seg_BT.shape[0], cache["key"].shape[2]), jnp.int32)
    return attention_mask(jnp.ones_like(seg_BT), kv_seg_BS, causal=True, q_offset=cache_index)


class Encoder(Stack):
    """N layers of self-attention + FFN (no cross-attention)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, cfg.num_layers, cross_attention=False, rngs=rngs)


class Decoder(Stack):
    """N layers of masked self-attention + encoder-decoder attention + FFN; called with a
    cache (from `init_cache`) it decodes incrementally."""

    def __init__(self, cfg: ModelConfig, num_layers: int, *, rngs: nnx.Rngs):
        super().__init__(cfg, num_layers, cross_attention=True, rngs=rngs)


class TokenEmbedder(nnx.Module):
    """Token embeddings (optionally x sqrt(d)) + sinusoidal or learned positions + dropout."""

    def __init__(self, cfg: DecoderLMConfig, *, rngs: nnx.Rngs):
        self.token = embed(cfg, cfg.vocab_size, ("vocab", "embed"), rngs=rngs)
        self.position = (embed(cfg, cfg.max_len, (None, "embed"), rngs=rngs)
                         if cfg.positions == "learned" else None)
        self.scale = math.sqrt(cfg.emb_dim) if cfg.scale_embeddings else 1.0
        self.dropout_rate = cfg.dropout_rate
        self.emb_dim = cfg.emb_dim

    def __call__(self, ids_BT: Array, positions_BT: Array, rng: Array | None) -> Array:
        x_BTD = self.token(ids_BT) * self.scale
        if self.position is None:
            x_BTD = x_BTD + sinusoidal_positions(positions_BT, self.emb_dim).astype(x_BTD.dtype)
        else:
            x_BTD = x_BTD + self.position(positions_BT)
        return dropout(x_BTD, self.dropout_rate, rng)


class EncoderDecoder(nnx.Module):
    """The Transformer: shared source/target embeddings and tied pre-softmax weights
    (paper 3.4) when `share_embeddings` / `tie_output`."""

    def __init__(self, cfg: EncoderDecoderConfig, *, rngs: nnx.Rngs, pad_id: int = 0):
        self.source_embed = TokenEmbedder(cfg, rngs=rngs)
        self.target_embed = None if cfg.share_embeddings else TokenEmbedder(cfg, rngs=rngs)
        self.encoder = Encoder(cfg, rngs=rngs)
        self.decoder = Decoder(cfg, cfg.num_decoder_layers or cfg.num_layers, rngs=rngs)
        self.logits = None if cfg.tie_output else embed(cfg, cfg.vocab_size, ("vocab", "embed"),
                                                        rngs=rngs)
        self.cfg = cfg
        self.pad_id = pad_id

    @staticmethod
    def flops_per_token(cfg: EncoderDecoderConfig, seq_len: int) -> dict[str, float]:
        """Forward matmul FLOPs per source token (encoder) and per target token (decoder)."""
        decoder_layers = cfg.num_decoder_layers or cfg.num_layers
        return {"encoder_per_source_token": cfg.num_layers * layer_flops_per_token(cfg, seq_len),
                "decoder_per_target_token": decoder_layers * layer_flops_per_token(
                    cfg, seq_len, cross_attention=True) + logits_flops_per_token(cfg)}

    def _target_embedder(self) -> TokenEmbedder:
        return self.source_embed if self.target_embed is None else self.target_embed

    def encode(self, src_BS: Array, *, src_segments_BS: Array | None = None,
               src_positions_BS: Array | None = None, rng: Array | None = None,
               attention_out: dict | None = None) -> Array:
        """attention_out: a dict that receives "encoder", the self-attention probabilities
        [L, B, N, S, S]."""
        r = split_rng(rng, 2)
        seg_BS = _default_segments(src_BS, src_segments_BS, self.pad_id)
        x_BSD = self.source_embed(src_BS, _default_positions(src_BS, src_positions_BS), r[0])
        encoded_BSD, _, extras = self.encoder(x_BSD, attention_mask(seg_BS, seg_BS), rng=r[1],
                                              return_attention=attention_out is not None)
        if attention_out is not None:
            attention_out["encoder"] = extras["attention"]
        return encoded_BSD

    def decode(self, tgt_in_BT: Array, encoded_BSD: Array, src_segments_BS: Array, *,
               tgt_segments_BT: Array | None = None, tgt_positions_BT: Array | None = None,
               rng: Array | None = None, cache: Cache | None = None,
               cache_index: Array | int = 0, attention_out: dict | None = None
               ) -> tuple[Array, Cache | None]:
        """Logits [B, T, V] for target inputs (shifted right). With `cache`, the T tokens sit
        at absolute positions cache_index.. and the cache is updated and returned.
        attention_out: a dict that receives "decoder" (self-attention [L, B, N, T, T]) and
        "cross" (encoder-decoder attention [L, B, N, T, S]) probabilities."""
        r = split_rng(rng, 2)
        seg_BT = _default_segments(tgt_in_BT, tgt_segments_BT, self.pad_id)
        offset = 0 if cache is None else cache_index
        pos_BT = _default_positions(tgt_in_BT, tgt_positions_BT, offset)
        y_BTD = self._target_embedder()(tgt_in_BT, pos_BT, r[0])
        self_mask = _causal_mask(seg_BT, cache, cache_index)
        cross_mask = attention_mask(seg_BT if cache is None else jnp.ones_like(seg_BT),
                                    src_segments_BS)
        y_BTD, cache, extras = self.decoder(y_BTD, self_mask, encoded_BSD=encoded_BSD,
                                            cross_mask_B1TS=cross_mask, rng=r[1], cache=cache,
                                            cache_index=cache_index if cache is not None else None,
                                            return_attention=attention_out is not None)
        if attention_out is not None:
            attention_out.update(decoder=extras["attention"], cross=extras["cross_attention"])
        table = self.source_embed.token if self.logits is None else self.logits
        return attend(table, y_BTD).astype(jnp.float32), cache

    def __call__(self, src_BS: Array, tgt_in_BT: Array, *, src_segments_BS: Array | None = None,
                 tgt_segments_BT: Array | None = None, src_positions_BS: Array | None = None,
                 tgt_positions_BT: Array | None = None, rng: Array | None = None,
                 attention_out: dict | None = None) -> Array:
        """Logits [B, T, V]; attention_out receives "encoder", "decoder" and "cross" attention
        probabilities (see encode and decode)."""
        r = split_rng(rng, 2)
        src_seg_BS = _default_segments(src_BS, src_segments_BS, self.pad_id)
        encoded_BSD = self.encode(src_BS, src_segments_BS=src_seg_BS,
                                  src_positions_BS=src_positions_BS, rng=r[0],
                                  attention_out=attention_out)
        logits_BTV, _ = self.decode(tgt_in_BT, encoded_BSD, src_seg_BS,
                                    tgt_segments_BT=tgt_segments_BT,
                                    tgt_positions_BT=tgt_positions_BT, rng=r[1],
                                    attention_out=attention_out)
        return logits_BTV

    def init_cache(self, batch: int, max_len: int) -> Cache:
        return init_cache(self.cfg, self.decoder.num_layers, batch, max_len)


class DecoderLM(nnx.Module):
    """Decoder-only language model (GPT style): causal self-attention blocks, no
    cross-attention, output tied to the token embeddings."""

    def __init__(self, cfg: DecoderLMConfig, *, rngs: nnx.Rngs, pad_id: int = 0):
        self.embed = TokenEmbedder(cfg, rngs=rngs)
        self.decoder = Stack(cfg, cfg.num_layers, cross_attention=False, rngs=rngs)
        self.logits = None if cfg.tie_output else embed(cfg, cfg.vocab_size, ("vocab", "embed"),
                                                        rngs=rngs)
        self.cfg = cfg
        self.pad_id = pad_id

    @staticmethod
    def flops_per_token(cfg: DecoderLMConfig, seq_len: int) -> dict[str, float]:
        return {"decoder_per_token": cfg.num_layers * layer_flops_per_token(cfg, seq_len)
                + logits_flops_per_token(cfg)}

    def __call__(self, ids_BT: Array, *, segments_BT: Array | None = None,
                 positions_BT: Array | None = None, rng: Array | None = None,
                 cache: Cache | None = None, cache_index: Array | int = 0,
                 attention_out: dict | None = None) -> tuple[Array, Cache | None]:
        """attention_out: a dict that receives "decoder", the causal self-attention
        probabilities [L, B, N, T, T]."""
        r = split_rng(rng, 2)
        seg_BT = _default_segments(ids_BT, segments_BT, self.pad_id)
        offset = 0 if cache is None else cache_index
        x_BTD = self.embed(ids_BT, _default_positions(ids_BT, positions_BT, offset), r[0])
        x_BTD, cache, extras = self.decoder(
            x_BTD, _causal_mask(seg_BT, cache, cache_index), rng=r[1], cache=cache,
            cache_index=cache_index if cache is not None else None,
            return_attention=attention_out is not None)
        if attention_out is not None:
            attention_out["decoder"] = extras["attention"]
        table = self.embed.token if self.logits is None else self.logits
        return attend(table, x_BTD).astype(jnp.float32), cache

    def init_cache(self, batch: int, max_len: int) -> Cache:
        return init_cache(self.cfg, self.decoder.num_layers, batch, max_len)
