"""The models, in JAX/Flax NNX only: their configs, one per family (config), shared layers
(layers), who attends to whom (masking), the attention kernels (kernels/: one file per
kernel, each registering itself), the attention layer and its checks (attention), BERT and its
task heads (bert), the Transformer encoder-decoder and decoder-only LM (transformer), and this
registry (config -> model, named sizes, parameter counts, FLOPs per token). A new model
variant or attention kernel lands here. Parameters carry logical axis names; no physical mesh
axis appears. It may import only jax, flax and the base module trees: never config, data,
training or anything above.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from bert_jax import trees
from bert_jax.models import attention, kernels
from bert_jax.models.bert import (
    BertForEmbedding,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    sentence_pool,  # noqa: F401 (models.sentence_pool: sentence vectors' pooling)
)
from bert_jax.models.config import (
    BertConfig,
    DecoderLMConfig,
    EncoderDecoderConfig,
    ModelConfig,
)
from bert_jax.models.transformer import DecoderLM, EncoderDecoder

MODELS = {
    "bert": BertModel,
    "bert_pretraining": BertForPreTraining,
    "bert_classification": BertForSequenceClassification,  # num_labels=1: regression
    "bert_tagging": BertForTokenClassification,
    "bert_span": BertForQuestionAnswering,
    "bert_choice": BertForMultipleChoice,
    "bert_embedding": BertForEmbedding,  # sentence vectors (training/contrastive.py)
    "transformer": EncoderDecoder,
    "decoder_lm": DecoderLM,
}

# Each model's config family (models/config.py): its `model` section holds the fields it reads.
CONFIGS: dict[str, type[ModelConfig]] = {
    **{name: BertConfig for name in MODELS if name.startswith("bert")},
    "transformer": EncoderDecoderConfig,
    "decoder_lm": DecoderLMConfig,
}
ALL_FIELDS = tuple(dict.fromkeys(f.name for c in set(CONFIGS.values()) for f in dataclasses.fields(c)))

# (layers, hidden); heads = hidden / 64, FFN = 4 * hidden. tiny..medium are the
# "Well-Read Students" miniatures released with BERT; base and large are the paper's.
BERT_SIZES = {"tiny": (2, 128), "mini": (4, 256), "small": (4, 512), "medium": (8, 512),
              "base": (12, 768), "large": (24, 1024)}

# ModernBERT (Warner et al. 2024): (layers, hidden, FFN width); heads = hidden / 64. base and
# large are the released models (149M, 395M); the miniatures have BERT's miniature shapes
# with ModernBERT's FFN ratio (1.5 x hidden), for CPU runs.
MODERNBERT_SIZES = {"tiny": (2, 128, 192), "mini": (4, 256, 384), "small": (4, 512, 768),
                    "medium": (8, 512, 768), "base": (22, 768, 1152), "large": (28, 1024, 2624)}

# Paper Table 3: (N, d_model, d_ff, h, dropout).
TRANSFORMER_SIZES = {"base": (6, 512, 2048, 8, 0.1), "big": (6, 1024, 4096, 16, 0.3)}


def model_fields(name: str) -> tuple[str, ...]:
    """The config fields model `name` reads (dtype included, which a run config sets at top
    level); its `model` section holds these and `name`."""
    return tuple(f.name for f in dataclasses.fields(CONFIGS[name])
                 if name in (f.metadata["only"] or (name,)))


def _check_name(name: Any) -> None:
    if name not in MODELS:
        raise ValueError(f"model.name={name!r}; choose one of {sorted(MODELS)}")


def not_read(name: str, field: str, value: Any, where: str = "model") -> str:
    """The error for a field model `name` does not read (the model would ignore it)."""
    readers = sorted(m for m in MODELS if field in model_fields(m))
    return (f"{where}.{field}={value!r}: model {name!r} ({CONFIGS[name].family} family) does not "
            f"read {field}, so the setting would do nothing; remove it ({field} is read by: "
            f"{', '.join(readers)})")


def model_section(name: str, preset: Mapping[str, Any], **changes) -> dict[str, Any]:
    """A config's `model` section for model `name`: the fields it reads (all but `dtype`, which
    a run config sets once at top level, config.dtype), from its family's defaults, then the
    `preset` (e.g. bert_model_fields; fields `name` does not read are left out), then `changes`,
    each a field `name` reads."""
    _check_name(name)
    reads = [k for k in model_fields(name) if k != "dtype"]
    unknown = sorted(set(preset) - set(ALL_FIELDS))
    if unknown:
        raise ValueError(f"unknown model config key(s) {unknown}; valid keys: {reads}")
    for key, value in changes.items():
        if key not in model_fields(name):
            raise ValueError(not_read(name, key, value))
    values = {**dataclasses.asdict(CONFIGS[name]()), **preset, **changes}
    return {"name": name, **{k: values[k] for k in reads}}


def bert_model_fields(size: str) -> dict[str, Any]:
    """BertConfig fields of a named BERT size (vocab 30522, 512 positions, 2 segments)."""
    if size not in BERT_SIZES:
        raise ValueError(f"unknown BERT size {size!r}; choose one of {sorted(BERT_SIZES)}")
    layers, hidden = BERT_SIZES[size]
    return dataclasses.asdict(BertConfig(
        vocab_size=30522, emb_dim=hidden, num_layers=layers, num_heads=hidden // 64, head_dim=64,
        mlp_dim=4 * hidden, max_len=512, type_vocab_size=2, dropout_rate=0.1,
        attention_dropout_rate=0.1, activation="gelu", layer_norm_eps=1e-12, norm="post",
        initializer="truncated_normal", initializer_range=0.02))


def modernbert_model_fields(size: str) -> dict[str, Any]:
    """BertConfig fields of a named ModernBERT size: vocabulary 50,368 (50,280 BPE tokens padded
    to a multiple of 64), rope (theta 160k in global layers, 10k in local ones), GeGLU, pre-norm
    with bias-free LayerNorms (eps 1e-5) and linear layers, an embedding norm and a final norm,
    128-token local attention (64 each side) with a global layer every third, no token types,
    ModernBERT's task heads, masked LM only (HF's ModernBertConfig defaults); and from its
    pretraining yamls (modernbert-base-pretrain.yaml): dropout 0.1 on the attention output
    projection only (attn_out_dropout_prob; embed, mlp and attention probabilities 0.0) and
    the full_megatron initialisation."""
    if size not in MODERNBERT_SIZES:
        raise ValueError(f"unknown ModernBERT size {size!r}; choose one of {sorted(MODERNBERT_SIZES)}")
    layers, hidden, mlp = MODERNBERT_SIZES[size]
    return dataclasses.asdict(BertConfig(
        vocab_size=50368, vocab_multiple=64, emb_dim=hidden, num_layers=layers,
        num_heads=hidden // 64, head_dim=64, mlp_dim=mlp, max_len=8192, type_vocab_size=0,
        positions="rope", rope_theta=160_000.0, rope_local_theta=10_000.0, mlp_layer="glu",
        activation="gelu", norm="pre", normalization="layernorm", norm_bias=False,
        use_bias=False, embedding_norm=True, layer_norm_eps=1e-5, attention_window=64,
        attention_global_every=3, dropout_rate=0.0, attention_dropout_rate=0.0,
        attention_output_dropout_rate=0.1, task_head="modernbert", pooling="cls", use_pooler=False, nsp=False,
        initializer="full_megatron", initializer_range=0.02, hf_family="modernbert"))


def encoder_model_fields(size: str) -> dict[str, Any]:
    """A named encoder: a BERT size (tiny .. large), or `modernbert-<size>`."""
    family, _, rest = size.rpartition("-")
    if family == "modernbert":
        return modernbert_model_fields(rest)
    if family:
        raise ValueError(f"unknown encoder {size!r}; choose a BERT size {sorted(BERT_SIZES)} or "
                         f"modernbert-<size> with a size of {sorted(MODERNBERT_SIZES)}")
    return bert_model_fields(size)


def transformer_model_fields(size: str, vocab_size: int = 37000) -> dict[str, Any]:
    """EncoderDecoderConfig fields of the paper's Transformer base/big (shared 37k BPE
    vocabulary); a decoder_lm's model_section takes those it reads."""
    if size not in TRANSFORMER_SIZES:
        raise ValueError(f"unknown Transformer size {size!r}; choose one of "
                         f"{sorted(TRANSFORMER_SIZES)}")
    layers, d_model, d_ff, heads, rate = TRANSFORMER_SIZES[size]
    return dataclasses.asdict(EncoderDecoderConfig(
        vocab_size=vocab_size, emb_dim=d_model, num_layers=layers, num_decoder_layers=layers,
        num_heads=heads, head_dim=d_model // heads, mlp_dim=d_ff, dropout_rate=rate,
        attention_dropout_rate=rate, activation="relu", layer_norm_eps=1e-6, norm="post",
        positions="sinusoidal", initializer="xavier_uniform", share_embeddings=True,
        tie_output=True, scale_embeddings=True))


def split_model_config(model_cfg: Mapping[str, Any]) -> tuple[str, ModelConfig]:
    """(`name`, its family's config) from a config's `model` section; unknown keys, and fields
    the model does not read, are errors."""
    fields = dict(model_cfg)
    name = fields.pop("name", None)
    _check_name(name)
    reads = model_fields(name)
    unknown = sorted(set(fields) - set(ALL_FIELDS))
    if unknown:
        raise ValueError(f"unknown model config key(s) {unknown}; valid keys: {sorted(reads)}")
    unread = [k for k in fields if k not in reads]
    if unread:
        raise ValueError(not_read(name, unread[0], fields[unread[0]]))
    cfg = CONFIGS[name](**fields)
    kernels.get(cfg.attention_kernel)  # a registered kernel (one registered later counts too)
    attention.check_pattern(cfg)  # pattern fields that do not go together
    return name, cfg


def complete_model_config(model_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`name` and every field the model reads, defaults filled in (a stored config may leave
    out fields at their defaults)."""
    name, cfg = split_model_config(model_cfg)
    return {"name": name, **{k: getattr(cfg, k) for k in model_fields(name)}}


def stored_model_config(model_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A `model` section as a checkpoint stored it, read with today's per-family configs:
    checkpoints saved before them hold every model's fields, so the fields this model does not
    read are left out (it never read them: its weights were made without them); a BERT model
    saved before `hf_family` gets the family export then took it for."""
    name = model_cfg.get("name")
    if name not in MODELS:
        return dict(model_cfg)
    reads = model_fields(name)
    out = {k: v for k, v in model_cfg.items() if k == "name" or k in reads or k not in ALL_FIELDS}
    if CONFIGS[name] is BertConfig and len(out) < len(model_cfg):
        # Saved with every model's fields, before BERT read `positions`: a learned table.
        out.pop("positions", None)
    if CONFIGS[name] is BertConfig and "hf_family" not in out:
        out["hf_family"] = _legacy_hf_family(out)
    return out


# Only for model sections saved before `hf_family` existed (they did not say): the family that
# export then guessed from the other fields, frozen as it was. ModernBERT when fewer of these
# fields differ from its values than from BERT's (a tie is BERT), else RoBERTa when the
# positions start after a pad id, else BERT.
_LEGACY_MODERNBERT = {"positions": "rope", "task_head": "modernbert", "norm": "pre",
                      "normalization": "layernorm", "mlp_layer": "glu", "embedding_norm": True,
                      "type_vocab_size": 0, "position_offset": 0, "attention_pattern": "full"}
_LEGACY_BERT = {"positions": "learned", "normalization": "layernorm", "norm_bias": True,
                "use_bias": True, "mlp_layer": "mlp", "embedding_norm": True, "task_head": "bert",
                "attention_window": 0, "attention_pattern": "full", "norm": "post"}


def _legacy_hf_family(stored: Mapping[str, Any]) -> str:
    """The HF family of a BERT `model` section saved without one (see _LEGACY_MODERNBERT)."""
    values = {f.name: f.default for f in dataclasses.fields(BertConfig)} | dict(stored)
    modern = sum(values[k] != v for k, v in _LEGACY_MODERNBERT.items())
    bert = sum(values[k] != v for k, v in _LEGACY_BERT.items()) + (values["type_vocab_size"] == 0)
    if modern < bert:
        return "modernbert"
    return "roberta" if values["position_offset"] > 0 else "bert"


def create_model(model_cfg: Mapping[str, Any], *, seed: int = 0) -> nnx.Module:
    """A freshly initialised model. Parameters carry logical axis names but are not
    sharded here: sharding is the train loop's job (sharding.py)."""
    name, cfg = split_model_config(model_cfg)
    with nnx.use_eager_sharding(False):
        return MODELS[name](cfg, rngs=nnx.Rngs(params=seed))


def abstract_model(model_cfg: Mapping[str, Any]) -> nnx.Module:
    """The model with ShapeDtypeStruct leaves: shapes and metadata without any compute."""
    return nnx.eval_shape(lambda: create_model(model_cfg))


def param_counts(model: nnx.Module, depth: int = 2) -> dict[str, int]:
    """Parameter count per module path (up to `depth` levels) plus 'total'."""
    counts: dict[str, int] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
        keys = [k for k in trees.key_names(path) if k != "value"]  # nnx's Variable.value
        name = "/".join(keys[:depth])
        counts[name] = counts.get(name, 0) + int(np.prod(leaf.shape))
    counts["total"] = sum(counts.values())
    return counts


def flops_per_token(model_cfg: Mapping[str, Any], seq_len: int) -> dict[str, float]:
    """Forward matmul FLOPs per token at sequence length seq_len, by part of the model (2 per
    multiply-add; training ~3x); each model class defines its parts."""
    name, cfg = split_model_config(model_cfg)
    return {k: float(v) for k, v in MODELS[name].flops_per_token(cfg, seq_len).items()}


def encoder_path(name: str) -> tuple[str, ...]:
    """Where model `name` holds its BERT encoder's parameters (() for the bare encoder)."""
    return getattr(MODELS[name], "encoder_path", ())
