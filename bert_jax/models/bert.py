"""BERT (Devlin et al. 2019): embeddings, encoder, pooler and the task heads.

Every task model holds the shared encoder as `.bert`, so a pretraining checkpoint's
`bert` subtree initialises any fine-tuning model. Shape suffixes as in layers.py.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

from bert_jax.models.config import BertConfig
from bert_jax.models.layers import (
    ACTIVATIONS,
    Array,
    add_positions,
    attend,
    dense,
    dropout,
    embed,
    layer_flops_per_token,
    layer_norm,
    logits_flops_per_token,
    split_rng,
)
from bert_jax.models.masking import Masking, pattern_of
from bert_jax.models.transformer import Encoder


class BertEmbeddings(nnx.Module):
    """Token + segment (token type, unless type_vocab_size=0) + position embeddings (a learned
    table, the sinusoidal encoding, or none with rope, which the attention applies), the
    embedding norm (unless embedding_norm=False), dropout."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.word = embed(cfg, cfg.vocab_rows, ("vocab", "embed"), rngs=rngs)
        self.position = (embed(cfg, cfg.max_len, (None, "embed"), rngs=rngs)
                         if cfg.positions == "learned" else None)
        self.sinusoidal = cfg.positions == "sinusoidal"
        self.token_type = (embed(cfg, cfg.type_vocab_size, (None, "embed"), rngs=rngs)
                           if cfg.type_vocab_size else None)
        self.norm = layer_norm(cfg, rngs=rngs) if cfg.embedding_norm else None
        self.dropout_rate = cfg.dropout_rate

    def __call__(self, ids_BT: Array, token_type_ids_BT: Array, positions_BT: Array,
                 rng: Array | None) -> Array:
        x_BTD = self.word(ids_BT)
        if self.token_type is not None:
            x_BTD = x_BTD + self.token_type(token_type_ids_BT)
        x_BTD = add_positions(x_BTD, positions_BT, self.position, self.sinusoidal)
        if self.norm is not None:
            x_BTD = self.norm(x_BTD)
        return dropout(x_BTD, self.dropout_rate, rng)


def encoder_flops_per_token(cfg: BertConfig, seq_len: int) -> dict[str, float]:
    """Forward matmul FLOPs per token of the encoder (embeddings and heads are negligible)."""
    return {"encoder_per_token": cfg.num_layers * layer_flops_per_token(cfg, seq_len)}


class PredictionHead(nnx.Module):
    """dense + activation + norm: the MLM head's transform, and (task_head=modernbert) the task
    heads' (HF's ModernBertPredictionHead); `role`: its dense's (layers.ROLES; ModernBERT's
    training code: "in" for the MLM head, "out" for the task heads)."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs, role: str = "in"):
        self.transform = dense(cfg, cfg.emb_dim, cfg.emb_dim, ("embed", "mlp"), rngs=rngs, role=role)
        self.norm = layer_norm(cfg, rngs=rngs)
        self.activation = cfg.activation

    def __call__(self, x_BXD: Array) -> Array:
        return self.norm(ACTIVATIONS[self.activation](self.transform(x_BXD)))


def mean_pool(seq_BTD: Array, segment_ids_BT: Array, cls_index: Array | None) -> Array:
    """The mean of each example's tokens: of every row's non-padding tokens [B, D], or, for
    packed rows, of the tokens sharing the segment of each cls_index (flat [B*T] indices, any
    shape) [*cls_index.shape, D]."""
    if cls_index is None:
        w_BT = (segment_ids_BT > 0).astype(jnp.float32)
        total_BD = jnp.einsum("bt,btd->bd", w_BT, seq_BTD.astype(jnp.float32))
        return (total_BD / jnp.maximum(w_BT.sum(1, keepdims=True), 1.0)).astype(seq_BTD.dtype)
    T = seq_BTD.shape[1]
    rows = cls_index // T
    segment = segment_ids_BT.reshape(-1)[cls_index]
    w_XT = (segment_ids_BT[rows] == segment[..., None]).astype(jnp.float32)
    total_XD = jnp.einsum("...t,...td->...d", w_XT, seq_BTD[rows].astype(jnp.float32))
    return (total_XD / jnp.maximum(w_XT.sum(-1, keepdims=True), 1.0)).astype(seq_BTD.dtype)


def sentence_pool(hidden_BTD: Array, mask_BT: Array, pooling: str, normalize: bool) -> Array:
    """Sentence vectors [B, D] of the last hidden states: sentence-transformers' Pooling (the
    mean over the tokens the mask keeps; the max over them; the first token) and Normalize."""
    mask = mask_BT[..., None].astype(hidden_BTD.dtype)
    if pooling == "mean":
        out = (hidden_BTD * mask).sum(1) / jnp.maximum(mask.sum(1), 1e-9)
    elif pooling == "max":
        out = jnp.where(mask > 0, hidden_BTD, -1e9).max(1)
    else:
        out = hidden_BTD[:, 0]
    if normalize:  # torch.nn.functional.normalize: x / max(||x||, 1e-12)
        out = out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    return out


class BertModel(nnx.Module):
    """The BERT encoder: embeddings, Transformer encoder, optional pooled output: BERT's tanh
    pooler on [CLS], or (task_head=modernbert) the [CLS] vector or the tokens' mean as they
    are (the task's PredictionHead follows)."""

    encoder_path: tuple[str, ...] = ()  # where a BertModel's parameters sit in this model
    flops_per_token = staticmethod(encoder_flops_per_token)

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs, use_pooler: bool | None = None):
        self.embeddings = BertEmbeddings(cfg, rngs=rngs)
        self.encoder = Encoder(cfg, rngs=rngs)
        self.window, self.pattern = pattern_of(cfg)
        self.position_offset = cfg.position_offset
        use_pooler = cfg.use_pooler if use_pooler is None else use_pooler
        self.pooling = (cfg.pooling if cfg.task_head == "modernbert" else "tanh") if use_pooler else None
        self.pooler = (dense(cfg, cfg.emb_dim, cfg.emb_dim, ("embed", "mlp"), rngs=rngs)
                       if self.pooling == "tanh" else None)

    def __call__(self, input_ids: Array, token_type_ids: Array | None = None,
                 attention_mask: Array | None = None, *, segment_ids: Array | None = None,
                 positions: Array | None = None, cls_index: Array | None = None,
                 rng: Array | None = None, return_hidden: bool = False,
                 attention_out: dict | None = None) -> dict[str, Array]:
        """Inputs are [B, T] int arrays. token_type_ids: segment A/B (0/1);
        attention_mask: 1 for real tokens, 0 for padding (the HF convention);
        segment_ids: packed-sequence ids (0 = padding), instead of attention_mask;
        positions: per-token positions (restart at 0 in each packed sequence);
        cls_index: where the pooler reads, as indices into the flattened [B*T] tokens (any
        shape; packed rows hold several [CLS]); default: each row's first token.

        Returns sequence_output [B,T,D], pooled_output [B,D] or [*cls_index.shape, D] (with a
        pooler; mean pooling averages each example's tokens); with return_hidden, hidden_states
        [L+1,B,T,D]: the embeddings then every
        layer's output, a pre-norm model's last after its final norm (= sequence_output, as
        Hugging Face's last_hidden_state and, in transformers 5, hidden_states[-1]).
        attention_out: a dict that receives "encoder", every layer's and head's
        attention probabilities [L,B,N,T,T] (query x key), as every model's attention_out does.
        """
        r = split_rng(rng, 2)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
        if segment_ids is None:
            segment_ids = (jnp.ones_like(input_ids) if attention_mask is None
                           else attention_mask.astype(jnp.int32))
        rows = positions
        if self.position_offset:  # RoBERTa: rows from pad id + 1 on, padding on the pad id's
            rows = jnp.where(segment_ids > 0, positions + self.position_offset,
                             self.position_offset - 1)
        x_BTD = self.embeddings(input_ids, token_type_ids, rows, r[0])
        masking = Masking(segment_ids, segment_ids, positions, positions,
                          window=self.window, pattern=self.pattern)
        seq_BTD, _, extras = self.encoder(x_BTD, masking, rng=r[1], return_hidden=return_hidden,
                                          return_attention=attention_out is not None)
        out = {"sequence_output": seq_BTD}
        if self.pooling == "mean":
            out["pooled_output"] = mean_pool(seq_BTD, segment_ids, cls_index)
        elif self.pooling is not None:
            cls_BD = (seq_BTD[:, 0] if cls_index is None
                      else seq_BTD.reshape(-1, seq_BTD.shape[-1])[cls_index])
            out["pooled_output"] = cls_BD if self.pooler is None else jnp.tanh(self.pooler(cls_BD))
        if return_hidden:
            out["hidden_states"] = jnp.concatenate([x_BTD[None], extras["hidden"]], axis=0)
        if attention_out is not None:
            attention_out["encoder"] = extras["attention"]
        return out


class BertTask(nnx.Module):
    """A task model: the encoder as `.bert` plus a head; with task_head=modernbert, a
    PredictionHead (`.head`) before the classifier and its dropout."""

    encoder_path: tuple[str, ...] = ("bert",)
    flops_per_token = staticmethod(encoder_flops_per_token)

    def _task_head(self, cfg: BertConfig, rngs: nnx.Rngs) -> None:
        self.head = (PredictionHead(cfg, rngs=rngs, role="out") if cfg.task_head == "modernbert"
                     else None)
        self.dropout_rate = cfg.dropout_rate

    def _classify(self, classifier: nnx.Module, x_BXD: Array, rng: Array | None) -> Array:
        """The head (if any), dropout, then the classifier; float32 logits."""
        if self.head is not None:
            x_BXD = self.head(x_BXD)
        return classifier(dropout(x_BXD, self.dropout_rate, rng)).astype(jnp.float32)


class MaskedLMHead(PredictionHead):
    """dense + activation + norm, then the decoder tied to the token embeddings + bias."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.bias = nnx.Param(jnp.zeros((cfg.vocab_rows,), jnp.float32), out_sharding=("vocab",))

    def __call__(self, x_BPD: Array, word_embeddings: nnx.Embed) -> Array:
        h_BPD = super().__call__(x_BPD)
        return attend(word_embeddings, h_BPD).astype(jnp.float32) + self.bias[...]


class BertForPreTraining(BertTask):
    """MLM + next-sentence prediction; with cfg.nsp=False MLM only (no pooler, no NSP head)."""

    @staticmethod
    def flops_per_token(cfg: BertConfig, seq_len: int) -> dict[str, float]:
        """The encoder's, plus the MLM head's per predicted token (transform + vocabulary)."""
        return {**encoder_flops_per_token(cfg, seq_len),
                "mlm_head_per_predicted_token": 2 * cfg.emb_dim * cfg.emb_dim
                + logits_flops_per_token(cfg)}

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.bert = BertModel(cfg, rngs=rngs, use_pooler=cfg.nsp)  # no NSP head, no pooler
        self.mlm = MaskedLMHead(cfg, rngs=rngs)
        self.nsp = (dense(cfg, cfg.emb_dim, 2, ("embed", None), rngs=rngs, use_bias=True, role="final_out")
                    if cfg.nsp else None)

    def __call__(self, input_ids: Array, *, masked_positions: Array | None = None,
                 rng: Array | None = None, **inputs) -> dict[str, Array]:
        """With masked_positions [B, P], MLM logits [B,P,V] only at those positions (the
        vocabulary projection is the costly part); else at every position [B,T,V]."""
        out = self.bert(input_ids, rng=rng, **inputs)
        seq_BTD = out["sequence_output"]
        if masked_positions is not None:  # [B, P]
            seq_BTD = jnp.take_along_axis(seq_BTD, masked_positions[..., None], axis=1)
        logits = {"mlm_logits": self.mlm(seq_BTD, self.bert.embeddings.word)}
        if self.nsp is not None:
            logits["nsp_logits"] = self.nsp(out["pooled_output"]).astype(jnp.float32)
        return logits


class BertForSequenceClassification(BertTask):
    """Pooled output (BERT: tanh pooler on [CLS]; modernbert: [CLS] or mean -> head) ->
    dropout -> dense: num_labels classes, or a regression when 1."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.bert = BertModel(cfg, rngs=rngs, use_pooler=True)
        self._task_head(cfg, rngs)
        self.classifier = dense(cfg, cfg.emb_dim, cfg.num_labels, ("embed", None), rngs=rngs,
                                use_bias=True, role="final_out")

    def __call__(self, input_ids: Array, *, rng: Array | None = None, **inputs
                 ) -> dict[str, Array]:
        r = split_rng(rng, 2)
        pooled_BD = self.bert(input_ids, rng=r[0], **inputs)["pooled_output"]
        return {"logits": self._classify(self.classifier, pooled_BD, r[1])}


class BertForTokenClassification(BertTask):
    """Per-token tags: sequence output (-> head, modernbert) -> dropout -> dense."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.bert = BertModel(cfg, rngs=rngs, use_pooler=False)
        self._task_head(cfg, rngs)
        self.classifier = dense(cfg, cfg.emb_dim, cfg.num_labels, ("embed", None), rngs=rngs,
                                use_bias=True, role="final_out")

    def __call__(self, input_ids: Array, *, rng: Array | None = None, **inputs
                 ) -> dict[str, Array]:
        r = split_rng(rng, 2)
        seq_BTD = self.bert(input_ids, rng=r[0], **inputs)["sequence_output"]
        return {"logits": self._classify(self.classifier, seq_BTD, r[1])}


class BertForQuestionAnswering(BertTask):
    """Span QA: start and end logits from one dense layer (the start/end vectors); modernbert:
    after the head and dropout (BERT's has neither)."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.bert = BertModel(cfg, rngs=rngs, use_pooler=False)
        self._task_head(cfg, rngs)
        self.qa = dense(cfg, cfg.emb_dim, 2, ("embed", None), rngs=rngs, use_bias=True,
                        role="final_out")

    def __call__(self, input_ids: Array, *, rng: Array | None = None, **inputs
                 ) -> dict[str, Array]:
        r = split_rng(rng, 2)
        seq_BTD = self.bert(input_ids, rng=r[0], **inputs)["sequence_output"]
        logits_BT2 = (self._classify(self.qa, seq_BTD, r[1]) if self.head is not None
                      else self.qa(seq_BTD).astype(jnp.float32))
        return {"start_logits": logits_BT2[..., 0], "end_logits": logits_BT2[..., 1]}


class BertForMultipleChoice(BertTask):
    """One score per choice from its pooled output (as sequence classification); softmax over
    choices in the loss."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.bert = BertModel(cfg, rngs=rngs, use_pooler=True)
        self._task_head(cfg, rngs)
        self.classifier = dense(cfg, cfg.emb_dim, 1, ("embed", None), rngs=rngs, use_bias=True,
                                role="final_out")

    def __call__(self, input_ids: Array, *, rng: Array | None = None, **inputs
                 ) -> dict[str, Array]:
        """Inputs are [B, C, T], or packed rows [R, T] with cls_index [B, C]; returns logits
        [B, C]."""
        r = split_rng(rng, 2)
        if "cls_index" in inputs:
            pooled_BCD = self.bert(input_ids, rng=r[0], **inputs)["pooled_output"]
            return {"logits": self._classify(self.classifier, pooled_BCD, r[1])[..., 0]}
        B, C, T = input_ids.shape
        flat = {k: None if v is None else v.reshape(B * C, T) for k, v in inputs.items()}
        pooled = self.bert(input_ids.reshape(B * C, T), rng=r[0], **flat)["pooled_output"]
        return {"logits": self._classify(self.classifier, pooled, r[1]).reshape(B, C)}


class BertForEmbedding(BertTask):
    """Sentence embeddings: the encoder's last hidden states pooled over each text's real
    tokens (cfg.embedding_pooling) and, with cfg.normalize_embeddings, L2-normalised, in
    float32; with cfg.learn_scale, `log_scale`, the contrastive losses' learned similarity
    scale (its log, starting at log cfg.similarity_scale, as CLIP's logit scale)."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.bert = BertModel(cfg, rngs=rngs, use_pooler=False)
        self.pooling, self.normalize = cfg.embedding_pooling, cfg.normalize_embeddings
        self.log_scale = (nnx.Param(jnp.full((), math.log(cfg.similarity_scale), jnp.float32),
                                    out_sharding=()) if cfg.learn_scale else None)

    def __call__(self, input_ids: Array, *, rng: Array | None = None, **inputs
                 ) -> dict[str, Array]:
        """Inputs of any shape [..., T] (queries [B, T], documents [B, N, T]): embeddings
        [..., D]."""
        *lead, T = input_ids.shape
        flat = {k: v.reshape(-1, T) for k, v in inputs.items() if v is not None}
        seq_XTD = self.bert(input_ids.reshape(-1, T), rng=rng, **flat)["sequence_output"]
        mask_XT = flat.get("attention_mask", jnp.ones_like(seq_XTD[..., 0]))
        vec_XD = sentence_pool(seq_XTD.astype(jnp.float32), mask_XT, self.pooling, self.normalize)
        return {"embedding": vec_XD.reshape(*lead, -1)}
