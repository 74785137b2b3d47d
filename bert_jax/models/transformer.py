"""The layer stack (FeedForward, Block, Stack) and the Transformer of Vaswani et al. (2017):
Encoder, Decoder, EncoderDecoder; and a decoder-only LM (GPT style). Shape suffixes as in
layers.py. Every model takes `attention_out`, a dict that receives the attention
probabilities of every layer ("encoder", "decoder", "cross": [L, B, N, T, S]) when given."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.models.attention import Attention
from bert_jax.models.config import REMAT_POLICIES, DecoderLMConfig, EncoderDecoderConfig
from bert_jax.models.layers import (
    ACTIVATIONS,
    Array,
    Cache,
    ModelConfig,
    add_positions,
    attend,
    constrain,
    dense,
    dropout,
    embed,
    layer_flops_per_token,
    layer_norm,
    logits_flops_per_token,
    split_rng,
)
from bert_jax.models.masking import Masking, Pattern, pattern_of


class FeedForward(nnx.Module):
    """Position-wise FFN: act(x W_i + b_i) W_o + b_o; gated (mlp_layer=glu, Shazeer 2020):
    (act(x W_i) * x W_gate) W_o, GeGLU with gelu, SwiGLU with silu."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.wi = dense(cfg, cfg.emb_dim, cfg.mlp_dim, ("embed", "mlp"), rngs=rngs)
        self.wi_gate = (dense(cfg, cfg.emb_dim, cfg.mlp_dim, ("embed", "mlp"), rngs=rngs)
                        if cfg.mlp_layer == "glu" else None)
        self.wo = dense(cfg, cfg.mlp_dim, cfg.emb_dim, ("mlp", "embed"), rngs=rngs, role="out")
        self.activation = cfg.activation

    def __call__(self, x_BTD: Array) -> Array:
        h_BTF = ACTIVATIONS[self.activation](self.wi(x_BTD))
        if self.wi_gate is not None:
            h_BTF = h_BTF * self.wi_gate(x_BTD)
        return self.wo(constrain(h_BTF, "batch", "length", "mlp"))


# The encoder output a decoder layer attends to, with who may see what of it.
Memory = tuple[Array, Masking]  # (encoded [B, S, D], the cross-attention Masking)


def first_reads_embeddings(cfg: ModelConfig) -> bool:
    """Pre-norm after an embedding norm (ModernBERT): the first layer's attention reads the
    normalised embeddings as they are, without an attention norm of its own."""
    return cfg.norm == "pre" and getattr(cfg, "embedding_norm", False)


class Block(nnx.Module):
    """One Transformer layer: self-attention, optional cross-attention, FFN; each sublayer
    wrapped in dropout + residual + LayerNorm (post-LN or pre-LN). The attention sublayers'
    dropout is model.attention_output_dropout_rate's, the FFN's model.dropout_rate's."""

    def __init__(self, cfg: ModelConfig, *, cross_attention: bool, rngs: nnx.Rngs):
        self.attention = Attention(cfg, rngs=rngs)
        self.attention_norm = layer_norm(cfg, rngs=rngs)
        self.cross_attention = Attention(cfg, rngs=rngs, cross=True) if cross_attention else None
        self.cross_attention_norm = layer_norm(cfg, rngs=rngs) if cross_attention else None
        self.mlp = FeedForward(cfg, rngs=rngs)
        self.mlp_norm = layer_norm(cfg, rngs=rngs)
        self.pre_norm = cfg.norm == "pre"
        self.first_reads_embeddings = first_reads_embeddings(cfg)
        self.dropout_rate = cfg.dropout_rate
        self.attention_output_rate = cfg.attention_output_dropout

    def _residual(self, x, norm, fn, rng, rate):
        if self.pre_norm:
            return x + dropout(fn(norm(x)), rate, rng)
        return norm(x + dropout(fn(x), rate, rng))

    def __call__(self, x_BTD: Array, masking: Masking, *, memory: Memory | None = None,
                 rng: Array | None = None, cache: Cache | None = None,
                 return_attention: bool = False, layer: Array | int = 1
                 ) -> tuple[Array, Cache | None, dict[str, Array]]:
        """Returns (output, updated cache, {} or with return_attention the probabilities
        {"attention": [B, N, T, S], and "cross_attention" with a memory}). With `cache`, the
        queries are written to the cache at masking.q_offset. `layer`: this layer's index
        (traced under scan)."""
        r = split_rng(rng, 5)
        x_BTD = constrain(x_BTD, "batch", "length", "embed")
        probs = {}
        new_cache = None

        def self_attention(h):
            nonlocal new_cache
            out, new_cache, probs["attention"] = self.attention(
                h, h, masking, rng=r[0], cache=cache,
                cache_index=None if cache is None else masking.q_offset, return_probs=return_attention)
            return out

        attention_norm = self.attention_norm
        if self.first_reads_embeddings:
            def attention_norm(h):
                if self.attention_norm is None:  # a one-layer stack: its layer is the first
                    return h
                if isinstance(layer, int):
                    return h if layer == 0 else self.attention_norm(h)
                return jnp.where(layer == 0, h, self.attention_norm(h))
        x_BTD = self._residual(x_BTD, attention_norm, self_attention, r[1], self.attention_output_rate)
        if self.cross_attention is not None:
            encoded_BSD, cross_masking = memory

            def cross_attention(h):
                out, _, probs["cross_attention"] = self.cross_attention(
                    h, encoded_BSD, cross_masking, rng=r[2], return_probs=return_attention)
                return out

            x_BTD = self._residual(x_BTD, self.cross_attention_norm, cross_attention, r[3],
                                   self.attention_output_rate)
        x_BTD = self._residual(x_BTD, self.mlp_norm, self.mlp, r[4], self.dropout_rate)
        probs = {k: v for k, v in probs.items() if v is not None}
        return constrain(x_BTD, "batch", "length", "embed"), new_cache, probs


class Stack(nnx.Module):
    """num_layers Blocks whose parameters are stacked on a leading 'layers' axis.

    The same parameters run either unrolled (a Python loop) or under lax.scan
    (`scan_layers`), with an optional remat policy, so checkpoints do not depend on
    how the stack is executed.
    """

    def __init__(self, cfg: ModelConfig, num_layers: int, *, cross_attention: bool,
                 rngs: nnx.Rngs):
        @nnx.split_rngs(splits=num_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        def make(rngs):
            return Block(cfg, cross_attention=cross_attention, rngs=rngs)

        self.layers = make(rngs)
        # The first layer reads the normalised embeddings (first_reads_embeddings): the stack
        # holds the attention norms of layers 1.. only (none for one layer), and __call__ puts
        # a placeholder row for layer 0 in front, which that layer does not read.
        self.first_norm_absent = first_reads_embeddings(cfg)
        if self.first_norm_absent and num_layers == 1:
            self.layers.attention_norm = None
        elif self.first_norm_absent:
            for name in ("scale", "bias"):  # (LayerNorm's bias may be None, RMSNorm has none)
                if (var := getattr(self.layers.attention_norm, name, None)) is not None:
                    var.set_value(var.get_value()[1:])
        self.final_norm = layer_norm(cfg, rngs=rngs) if cfg.norm == "pre" else None
        self.num_layers = num_layers
        self.scan = cfg.scan_layers
        self.remat_policy = cfg.remat_policy
        self.attention_kernel = cfg.attention_kernel

    def _period(self, masking: Masking) -> int:
        """Layers per scanned step: the period of a window's global layers under the xla
        kernel (models/kernels/xla.py computes local layers banded when it knows them), else 1."""
        p = masking.pattern
        if self.attention_kernel != "xla" or masking.window is None or p is None or p.block:
            return 1
        return p.global_every if 1 < p.global_every <= self.num_layers else 1

    def __call__(self, x_BTD: Array, masking: Masking, *, memory: Memory | None = None,
                 rng: Array | None = None, cache: Cache | None = None,
                 return_hidden: bool = False, return_attention: bool = False
                 ) -> tuple[Array, Cache | None, dict[str, Array]]:
        """Returns (output, updated cache, extras): extras holds "hidden", every layer's output
        [L, B, T, D] (a pre-norm stack's last after its final norm, as the output), with
        return_hidden, and "attention" (and "cross_attention" in a
        decoder), every layer's probabilities [L, B, N, T, S], with return_attention."""
        graphdef, params = nnx.split(self.layers)
        if self.first_norm_absent and self.num_layers > 1:
            params["attention_norm"] = jax.tree.map(
                lambda x: jnp.concatenate([jnp.ones_like(x[:1]), x]), params["attention_norm"])
        rngs_L = None if rng is None else jax.random.split(rng, self.num_layers)

        def body(h_BTD, xs, layer, kind=None):
            layer_params, layer_rng, layer_cache = xs
            block = nnx.merge(graphdef, layer_params)
            # kind: a static layer index whose attention pattern is this layer's (grouped scan)
            seen_as = layer if kind is None else kind
            h_BTD, layer_cache, probs = block(h_BTD, masking.in_layer(seen_as, self.num_layers),
                                              memory=memory, rng=layer_rng, cache=layer_cache,
                                              return_attention=return_attention, layer=layer)
            return h_BTD, (layer_cache, {**probs, **({"hidden": h_BTD} if return_hidden else {})})

        def remat(fn):
            if self.remat_policy == "none":
                return fn
            return jax.checkpoint(fn, policy=REMAT_POLICIES[self.remat_policy],
                                  prevent_cse=not self.scan)

        def unrolled(h_BTD, xs, layers, kinds):
            ys = []
            for j, (i, kind) in enumerate(zip(layers, kinds, strict=True)):
                step = remat(lambda h_BTD, xs_i, i=i, kind=kind: body(h_BTD, xs_i, i, kind))
                h_BTD, y = step(h_BTD, jax.tree.map(lambda a, j=j: a[j], xs))
                ys.append(y)
            return h_BTD, jax.tree.map(lambda *a: jnp.stack(a), *ys) if ys else (None, {})

        xs = (params, rngs_L, cache)
        period = self._period(masking)
        if self.scan and period > 1:
            # One scanned step per period of the pattern (ModernBERT: a global layer and two
            # local ones), each layer's kind static inside it: the xla kernel computes a local
            # layer banded, where a traced index would compile both under lax.cond and keep
            # the dense one's residuals for every layer. The layers after the last whole
            # period run unrolled.
            groups = self.num_layers // period
            head = jax.tree.map(lambda a: a[:groups * period].reshape(groups, period, *a.shape[1:]), xs)
            kinds = list(range(period))
            x_BTD, ys = jax.lax.scan(
                lambda h, xs_g: unrolled(h, xs_g[0], [xs_g[1] * period + j for j in kinds], kinds),
                x_BTD, (head, jnp.arange(groups)))
            ys = jax.tree.map(lambda a: a.reshape(groups * period, *a.shape[2:]), ys)
            rest = list(range(groups * period, self.num_layers))
            if rest:
                x_BTD, tail = unrolled(x_BTD, jax.tree.map(lambda a: a[groups * period:], xs),
                                       rest, rest)
                ys = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), ys, tail)
            cache, extras = ys
        elif self.scan:  # the layer index is traced: attention patterns pick by it (attention.py)
            step = remat(lambda h_BTD, xs_i: body(h_BTD, xs_i[0], xs_i[1]))
            x_BTD, (cache, extras) = jax.lax.scan(step, x_BTD, (xs, jnp.arange(self.num_layers)))
        else:  # a Python int per layer: each layer's static attention pattern
            x_BTD, (cache, extras) = unrolled(x_BTD, xs, range(self.num_layers),
                                              [None] * self.num_layers)
        if self.final_norm is not None:
            x_BTD = self.final_norm(x_BTD)
            if return_hidden:  # the last layer's output as the stack gives it (HF's last hidden state)
                extras["hidden"] = extras["hidden"].at[-1].set(x_BTD)
        return x_BTD, cache, extras


def init_cache(cfg: ModelConfig, num_layers: int, batch: int, max_len: int) -> Cache:
    """Empty self-attention key/value cache for incremental decoding: [L, B, S, N, K]."""
    shape = (num_layers, batch, max_len, cfg.num_heads, cfg.head_dim)
    return {"key": jnp.zeros(shape, cfg.compute_dtype), "value": jnp.zeros(shape, cfg.compute_dtype)}


def _default_segments(ids_BT: Array, segments_BT: Array | None, pad_id: int) -> Array:
    return (ids_BT != pad_id).astype(jnp.int32) if segments_BT is None else segments_BT


def _default_positions(ids_BT: Array, positions_BT: Array | None, offset=0) -> Array:
    if positions_BT is not None:
        return positions_BT
    return jnp.broadcast_to(offset + jnp.arange(ids_BT.shape[1]), ids_BT.shape)


def _causal_masking(seg_BT: Array, pos_BT: Array, cache: Cache | None, cache_index,
                    window: int | None, pattern: Pattern | None) -> Masking:
    if cache is None:
        return Masking(seg_BT, seg_BT, pos_BT, pos_BT, causal=True, window=window, pattern=pattern)
    # Decoding: the keys are all cache slots [L, B, S, N, K]; the causal mask hides the
    # slots after the current position, which are not written yet.
    B, S = seg_BT.shape[0], cache["key"].shape[2]
    slots_BS = jnp.broadcast_to(jnp.arange(S), (B, S))
    return Masking(jnp.ones_like(seg_BT), jnp.ones((B, S), jnp.int32), pos_BT, slots_BS,
                   q_offset=cache_index, causal=True, window=window, pattern=pattern)


def _record(attention_out: dict | None, **found: Array) -> None:
    if attention_out is not None:
        attention_out.update(found)


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
    """Token embeddings (optionally x sqrt(d)) + sinusoidal or learned positions (none with
    rope, which the attention applies) + dropout."""

    def __init__(self, cfg: DecoderLMConfig, *, rngs: nnx.Rngs):
        self.token = embed(cfg, cfg.vocab_size, ("vocab", "embed"), rngs=rngs)
        self.position = (embed(cfg, cfg.max_len, (None, "embed"), rngs=rngs)
                         if cfg.positions == "learned" else None)
        self.sinusoidal = cfg.positions == "sinusoidal"
        self.scale = math.sqrt(cfg.emb_dim) if cfg.scale_embeddings else 1.0
        self.dropout_rate = cfg.dropout_rate
        self.emb_dim = cfg.emb_dim

    def __call__(self, ids_BT: Array, positions_BT: Array, rng: Array | None) -> Array:
        x_BTD = add_positions(self.token(ids_BT) * self.scale, positions_BT, self.position,
                              self.sinusoidal)
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
        self.window, self.pattern = pattern_of(cfg)  # self-attention's window and pattern

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
        pos_BS = _default_positions(src_BS, src_positions_BS)
        x_BSD = self.source_embed(src_BS, pos_BS, r[0])
        masking = Masking(seg_BS, seg_BS, pos_BS, pos_BS, window=self.window,
                          pattern=self.pattern)
        encoded_BSD, _, extras = self.encoder(x_BSD, masking, rng=r[1],
                                              return_attention=attention_out is not None)
        _record(attention_out, encoder=extras.get("attention"))
        return encoded_BSD

    def decode(self, tgt_in_BT: Array, encoded_BSD: Array, src_segments_BS: Array, *,
               src_positions_BS: Array | None = None,
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
        cross = Masking(seg_BT if cache is None else jnp.ones_like(seg_BT), src_segments_BS, pos_BT,
                        _default_positions(src_segments_BS, src_positions_BS), cross=True)
        masking = _causal_masking(seg_BT, pos_BT, cache, cache_index, self.window, self.pattern)
        y_BTD, cache, extras = self.decoder(y_BTD, masking,
                                            memory=(encoded_BSD, cross), rng=r[1], cache=cache,
                                            return_attention=attention_out is not None)
        _record(attention_out, decoder=extras.get("attention"), cross=extras.get("cross_attention"))
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
                                    src_positions_BS=src_positions_BS, tgt_segments_BT=tgt_segments_BT,
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
        self.window, self.pattern = pattern_of(cfg)  # self-attention's window and pattern

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
        pos_BT = _default_positions(ids_BT, positions_BT, offset)
        x_BTD = self.embed(ids_BT, pos_BT, r[0])
        masking = _causal_masking(seg_BT, pos_BT, cache, cache_index, self.window, self.pattern)
        x_BTD, cache, extras = self.decoder(x_BTD, masking, rng=r[1], cache=cache,
                                            return_attention=attention_out is not None)
        _record(attention_out, decoder=extras.get("attention"))
        table = self.embed.token if self.logits is None else self.logits
        return attend(table, x_BTD).astype(jnp.float32), cache

    def init_cache(self, batch: int, max_len: int) -> Cache:
        return init_cache(self.cfg, self.decoder.num_layers, batch, max_len)
