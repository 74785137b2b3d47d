"""Import of public BERT and RoBERTa checkpoints (`bert-jax convert hf:<dir> <out>`), and the one
table of names between our parameters and Hugging Face's that export.py uses for the way back.

Accepted sources: a Hugging Face BERT folder (config.json, vocab.txt or, as transformers 5 saves
it, tokenizer.json's WordPiece alone, and model.safetensors,
pytorch_model.bin or a sharded index of either; tensors with or without the `bert.` prefix,
LayerNorm `gamma`/`beta` or `weight`/`bias`), a Hugging Face cache entry (`models--org--name`
or one of its `snapshots/<hash>`), and Google's original TensorFlow release (bert_config.json,
vocab.txt, bert_model.ckpt.index + .data-*), read without TensorFlow. A Hugging Face RoBERTa
folder (model_type "roberta": tokenizer.json or vocab.json + merges.txt, tensors under `roberta.`)
becomes our BERT family with position_offset = pad id + 1; its heads' tensors are renamed to
BERT's (ROBERTA_NAMES) on the way in and back on the way out. A Hugging Face ModernBERT folder
(model_type "modernbert": tokenizer.json, tensors under `model.`) becomes our BERT family with
ModernBERT's switches (models.modernbert_model_fields: rope, GeGLU, pre-norm, task_head
modernbert); its tensors are renamed to BERT's, its fused ones split (MODERNBERT_NAMES), on the
way in, and renamed and fused back on the way out.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx, traverse_util

from bert_jax import models, paths
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.interop.hf_weights import load_hf_weights, resolve_model_dir
from bert_jax.interop.tf_checkpoint import read_tf_checkpoint
from bert_jax.training import checkpoint

log = logging.getLogger(__name__)

# Our model name -> the HF architecture export writes; import reads these and the aliases.
HF_ARCHITECTURE = {
    "bert": "BertModel",
    "bert_pretraining": "BertForPreTraining",
    "bert_classification": "BertForSequenceClassification",
    "bert_tagging": "BertForTokenClassification",
    "bert_span": "BertForQuestionAnswering",
    "bert_choice": "BertForMultipleChoice",
}
# The same for a RoBERTa (position_offset > 0): it has no NSP head, so pretraining is its MLM.
ROBERTA_ARCHITECTURE = {
    "bert": "RobertaModel",
    "bert_pretraining": "RobertaForMaskedLM",
    "bert_classification": "RobertaForSequenceClassification",
    "bert_tagging": "RobertaForTokenClassification",
    "bert_span": "RobertaForQuestionAnswering",
    "bert_choice": "RobertaForMultipleChoice",
}
# The same for a ModernBERT (task_head=modernbert or positions=rope; see hf_config).
MODERNBERT_ARCHITECTURE = {
    "bert": "ModernBertModel",
    "bert_pretraining": "ModernBertForMaskedLM",
    "bert_classification": "ModernBertForSequenceClassification",
    "bert_tagging": "ModernBertForTokenClassification",
    "bert_span": "ModernBertForQuestionAnswering",
    "bert_choice": "ModernBertForMultipleChoice",
}
ARCHITECTURES = {v: k for table in (HF_ARCHITECTURE, ROBERTA_ARCHITECTURE, MODERNBERT_ARCHITECTURE)
                 for k, v in table.items()} | {
    "BertForMaskedLM": "bert_pretraining", "BertForNextSentencePrediction": "bert_pretraining"}
MODEL_TYPES = ("bert", "roberta", "modernbert")  # config.json's model_type values that convert
# RoBERTa's tensor name prefixes where BERT's differ (its encoder is BERT's, under `roberta.`):
# the MLM head, and the classification head, whose dense + tanh on <s> is BERT's pooler.
ROBERTA_NAMES = {
    "lm_head.dense.": "cls.predictions.transform.dense.",
    "lm_head.layer_norm.": "cls.predictions.transform.LayerNorm.",
    "lm_head.bias": "cls.predictions.bias",
    "lm_head.decoder.": "cls.predictions.decoder.",
    "classifier.dense.": "pooler.dense.",
    "classifier.out_proj.": "classifier.",
}
# Our activation -> the HF hidden_act export writes; import reads these and the aliases.
HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}
HF_ACTIVATIONS = {v: k for k, v in HF_ACTIVATION.items()} | {"gelu_pytorch_tanh": "gelu_tanh"}

# Our parameter path -> HF tensor name, for the encoder relative to where each side keeps it
# (our task models under `bert/`, HF's under `bert.`, a bare BertModel at the root on both).
ENCODER_NAMES = {
    "embeddings/word/embedding": "embeddings.word_embeddings.weight",
    "embeddings/position/embedding": "embeddings.position_embeddings.weight",
    "embeddings/token_type/embedding": "embeddings.token_type_embeddings.weight",
    "embeddings/norm/scale": "embeddings.LayerNorm.weight",
    "embeddings/norm/bias": "embeddings.LayerNorm.bias",
    "pooler/kernel": "pooler.dense.weight",
    "pooler/bias": "pooler.dense.bias",
    "encoder/final_norm/scale": "final_norm.weight",  # pre-norm (ModernBERT): after the last layer
    "encoder/final_norm/bias": "final_norm.bias",
}
# The heads, at the root of both models.
HEAD_NAMES = {
    "mlm/transform/kernel": "cls.predictions.transform.dense.weight",
    "mlm/transform/bias": "cls.predictions.transform.dense.bias",
    "mlm/norm/scale": "cls.predictions.transform.LayerNorm.weight",
    "mlm/norm/bias": "cls.predictions.transform.LayerNorm.bias",
    "mlm/bias": "cls.predictions.bias",
    "nsp/kernel": "cls.seq_relationship.weight",
    "nsp/bias": "cls.seq_relationship.bias",
    "classifier/kernel": "classifier.weight",
    "classifier/bias": "classifier.bias",
    "qa/kernel": "qa_outputs.weight",
    "qa/bias": "qa_outputs.bias",
    # task_head=modernbert: the task models' dense + activation + norm before the classifier
    "head/transform/kernel": "head.dense.weight",
    "head/transform/bias": "head.dense.bias",
    "head/norm/scale": "head.norm.weight",
    "head/norm/bias": "head.norm.bias",
}
# Per encoder layer: our module under encoder/layers (stacked [L, ...]) -> HF's under
# encoder.layer.{i}.
LAYER_NAMES = {
    "attention/query": "attention.self.query",
    "attention/key": "attention.self.key",
    "attention/value": "attention.self.value",
    "attention/out": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "mlp/wi": "intermediate.dense",
    "mlp/wi_gate": "intermediate.gate",  # mlp_layer=glu: the gate half (ModernBERT's Wi)
    "mlp/wo": "output.dense",
    "mlp_norm": "output.LayerNorm",
}
_LEAF = {"kernel": "weight", "scale": "weight", "bias": "bias"}
_POOLER = ("pooler/kernel", "pooler/bias")

# HF ModernBERT's tensor names (its encoder's relative to `model.` in its task models) -> the
# BERT names of the tables above, for both directions; {i}: the layer; a tuple: one fused tensor,
# those BERT tensors concatenated along its first (output) axis (Wqkv: query, key, value; Wi:
# the activated half, then the gate). Its layer 0 has no attn_norm (it reads the normalised
# embeddings; ours has the stacked norm and does not use layer 0's).
MODERNBERT_NAMES = {
    "embeddings.tok_embeddings.": "embeddings.word_embeddings.",
    "embeddings.norm.": "embeddings.LayerNorm.",
    "layers.{i}.attn_norm.": "encoder.layer.{i}.attention.output.LayerNorm.",
    "layers.{i}.attn.Wqkv.": tuple(f"encoder.layer.{{i}}.attention.self.{x}."
                                   for x in ("query", "key", "value")),
    "layers.{i}.attn.Wo.": "encoder.layer.{i}.attention.output.dense.",
    "layers.{i}.mlp_norm.": "encoder.layer.{i}.output.LayerNorm.",
    "layers.{i}.mlp.Wi.": ("encoder.layer.{i}.intermediate.dense.", "encoder.layer.{i}.intermediate.gate."),
    "layers.{i}.mlp.Wo.": "encoder.layer.{i}.output.dense.",
    "final_norm.": "final_norm.",
}
# Its heads (at the root), where BERT's names differ: the MLM's prediction head and decoder are
# BERT's cls.predictions; question answering's classifier is BERT's qa_outputs.
MODERNBERT_HEAD_NAMES = {
    "bert_pretraining": {"head.dense.": "cls.predictions.transform.dense.",
                         "head.norm.": "cls.predictions.transform.LayerNorm.",
                         "decoder.bias": "cls.predictions.bias",
                         "decoder.weight": "cls.predictions.decoder.weight"},
    "bert_span": {"classifier.": "qa_outputs."},
}

# Original TF names that do not follow the module/kernel pattern: run_pretraining.py's heads,
# run_classifier.py's and run_squad.py's output layers (all [out, in], like torch weights).
_TF_NAMES = {
    "cls/predictions/output_bias": "cls.predictions.bias",
    "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
    "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
    "cls/squad/output_weights": "qa_outputs.weight",
    "cls/squad/output_bias": "qa_outputs.bias",
    "output_weights": "classifier.weight",
    "output_bias": "classifier.bias",
}
# Optimizer slots and counters a TF training checkpoint also holds.
_TF_SKIP = re.compile(r"(^|/)(adam_[mv]|Adam(_\d+)?|Momentum|global_step|beta[12]_power|"
                      r"good_steps|loss_scale|save_counter)$|^_CHECKPOINTABLE_OBJECT_GRAPH$")


def hf_names(model_name: str, paths: Iterable[str], num_layers: int, hf_encoder_prefix: str = ""
             ) -> dict[str, list[str]]:
    """{our parameter path: [HF tensor name, one per encoder layer for the stacked layers]};
    HF encoder names carry `hf_encoder_prefix` ("bert." in HF task models)."""
    ours_at = "".join(f"{k}/" for k in models.encoder_path(model_name))
    table = {}
    for path in paths:
        if not path.startswith(ours_at):
            table[path] = [HEAD_NAMES[path]]
            continue
        rel = path.removeprefix(ours_at)
        if rel.startswith("encoder/layers/"):
            module, leaf = rel.removeprefix("encoder/layers/").rsplit("/", 1)
            table[path] = [f"{hf_encoder_prefix}encoder.layer.{i}.{LAYER_NAMES[module]}.{_LEAF[leaf]}"
                           for i in range(num_layers)]
        else:
            table[path] = [hf_encoder_prefix + ENCODER_NAMES[rel]]
    return table


def model_config_from_hf(hf: dict[str, Any], name: str | None = None, use_pooler: bool = True
                         ) -> dict[str, Any]:
    """Our `model` config section from a HF BERT, RoBERTa or ModernBERT config.json."""
    model_type = hf.get("model_type", "bert")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"config.json: model_type={model_type!r} does not convert; supported "
                         f"model_type: {', '.join(map(repr, MODEL_TYPES))}")
    if model_type == "modernbert":
        return modernbert_config_from_hf(hf, name)
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("config.json: position_embedding_type="
                         f"{hf['position_embedding_type']!r} is not supported (only 'absolute')")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise ValueError("config.json: is_decoder/add_cross_attention is set (a causal BERT "
                         "decoder); only the bidirectional BERT encoder converts")
    act = hf.get("hidden_act", "gelu")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"config.json: hidden_act={act!r}; supported: {sorted(HF_ACTIVATIONS)}")
    _check_sizes(hf, "BERT")
    name = name or choose_head(hf, ())
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    num_labels = _num_labels(hf)
    offset = 0
    if model_type == "roberta":  # positions from pad id + 1 (HF RobertaConfig's default pad: 1)
        pad = hf.get("pad_token_id", 1)
        if not isinstance(pad, int) or isinstance(pad, bool) or not 0 <= pad < hf.get(
                "max_position_embeddings", 512) - 1:
            raise ValueError(f"config.json: pad_token_id={pad!r}; a RoBERTa's positions start "
                             "after it, so it must be an integer < max_position_embeddings - 1")
        offset = pad + 1
    # The fields model `name` reads: the pooler and the label count only where it has them.
    return models.model_section(name, dict(
        vocab_size=hf["vocab_size"], emb_dim=hidden,
        num_layers=hf["num_hidden_layers"], num_heads=heads, head_dim=hidden // heads,
        mlp_dim=hf["intermediate_size"], max_len=hf.get("max_position_embeddings", 512),
        type_vocab_size=hf.get("type_vocab_size", 2), position_offset=offset,
        dropout_rate=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
        activation=HF_ACTIVATIONS[act], layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        initializer_range=hf.get("initializer_range", 0.02), use_pooler=use_pooler,
        num_labels=num_labels,
        # RoBERTa has no NSP head (nor a pooler); BERT's published MaskedLM checkpoints
        # (bert-base-uncased) carry both
        nsp=model_type == "bert"))


def _check_sizes(hf: dict[str, Any], family: str) -> None:
    """config.json's sizes: present, positive integers, and a width the heads split evenly."""
    if missing := [k for k in _REQUIRED if k not in hf]:
        raise ValueError(f"config.json: no {missing[0]!r}; expected a {family} config with {list(_REQUIRED)}")
    for key in (*_REQUIRED, "max_position_embeddings", "type_vocab_size"):
        value, least = hf.get(key, 1), 0 if key == "type_vocab_size" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"config.json: {key}={value!r}, expected an integer >= {least}")
    if hf["hidden_size"] % hf["num_attention_heads"]:
        raise ValueError(f"config.json: hidden_size={hf['hidden_size']} is not divisible by "
                         f"num_attention_heads={hf['num_attention_heads']}; a {family} config "
                         "splits the width evenly")


def _num_labels(hf: dict[str, Any]) -> int:
    return len(hf["id2label"]) if "id2label" in hf else hf.get("num_labels", 2)


# HF ModernBERT's layer kinds (config.json layer_types).
_GLOBAL, _LOCAL = "full_attention", "sliding_attention"


def _modernbert_pattern(hf: dict[str, Any]) -> tuple[int, int]:
    """(attention_window, attention_global_every) of a ModernBERT config.json: layer_types (5.x)
    or global_attn_every_n_layers (older; default 3), and local_attention (both sides: 2 x ours)."""
    layers = hf["num_hidden_layers"]
    if hf.get("layer_types") is not None:
        kinds = hf["layer_types"]
        if not isinstance(kinds, list) or len(kinds) != layers or set(kinds) - {_GLOBAL, _LOCAL}:
            raise ValueError(f"config.json: layer_types={kinds!r}, expected a list of "
                             f"num_hidden_layers={layers} values {_GLOBAL!r} or {_LOCAL!r}")
    else:
        every = hf.get("global_attn_every_n_layers", 3)
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"config.json: global_attn_every_n_layers={every!r}, expected an "
                             "integer >= 1")
        kinds = [_LOCAL if i % every else _GLOBAL for i in range(layers)]
    if _LOCAL not in kinds:
        return 0, 0  # every layer global: no window
    local = hf.get("local_attention", 128)
    if not isinstance(local, int) or isinstance(local, bool) or local < 2:
        raise ValueError(f"config.json: local_attention={local!r}, expected an integer >= 2 (the "
                         "window over both sides; ModernBERT's is 128)")
    globals_ = [i for i, kind in enumerate(kinds) if kind == _GLOBAL]
    # Ours: layer i is global when i % every == 0 (every=0: none); a lone layer 0: every = layers.
    every = 0 if not globals_ else (globals_[1] if len(globals_) > 1 else layers)
    if kinds != [_GLOBAL if every and i % every == 0 else _LOCAL for i in range(layers)]:
        raise ValueError(f"config.json: layer_types={kinds!r} cannot be expressed: our model makes "
                         "layer i global when i % model.attention_global_every == 0 (layer 0 and "
                         "every n-th after it, or none); use such a pattern")
    return local // 2, every


def _modernbert_thetas(hf: dict[str, Any]) -> tuple[float, float]:
    """(global, local) rope bases of a ModernBERT config.json: rope_parameters per layer kind
    (5.x), or global_rope_theta / local_rope_theta (older)."""
    if hf.get("rope_scaling") is not None:
        raise ValueError(f"config.json: rope_scaling={hf['rope_scaling']!r}; only plain rope "
                         "converts (remove rope_scaling)")
    params = hf.get("rope_parameters") or {}
    thetas = []
    for kind, old, default in ((_GLOBAL, "global_rope_theta", 160_000.0),
                               (_LOCAL, "local_rope_theta", 10_000.0)):
        p = params.get(kind) or {}
        if p.get("rope_type", "default") != "default":
            raise ValueError(f"config.json: rope_parameters.{kind}.rope_type={p['rope_type']!r}; "
                             "only 'default' rope converts")
        theta = p.get("rope_theta", hf.get(old, default))
        if isinstance(theta, bool) or not isinstance(theta, int | float) or not theta > 0:
            where = f"rope_parameters.{kind}.rope_theta" if "rope_theta" in p else old
            raise ValueError(f"config.json: {where}={theta!r}; rope's base must be > 0")
        thetas.append(float(theta))
    return thetas[0], thetas[1]


def modernbert_config_from_hf(hf: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """Our `model` config section from a HF ModernBERT config.json: our BERT family with
    ModernBERT's switches; what our model cannot express is a ValueError naming the field."""
    _check_sizes(hf, "ModernBERT")
    act = hf.get("hidden_activation", "gelu")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"config.json: hidden_activation={act!r}; supported: {sorted(HF_ACTIVATIONS)}")
    if (head_act := hf.get("classifier_activation", "gelu")) != act:
        raise ValueError(f"config.json: classifier_activation={head_act!r} differs from "
                         f"hidden_activation={act!r}; our heads use the model's one activation")
    # One switch (model.use_bias) for the attention, feed-forward and prediction head's dense
    # layers; the classifier always has a bias (as HF's), the MLM decoder's is zero without one.
    biases = {k: hf.get(k, False) for k in ("attention_bias", "mlp_bias", "classifier_bias")}
    if len(set(biases.values())) > 1:
        odd = min(biases, key=lambda k: list(biases.values()).count(biases[k]))
        raise ValueError(f"config.json: {odd}={biases[odd]!r} but "
                         + ", ".join(f"{k}={v!r}" for k, v in biases.items() if k != odd)
                         + "; our model has one switch for them (model.use_bias): set them equal")
    if hf.get("hidden_size") and "head_dim" in hf and hf["head_dim"] != hf["hidden_size"] // hf[
            "num_attention_heads"]:
        raise ValueError(f"config.json: head_dim={hf['head_dim']!r}; HF's ModernBERT splits "
                         "hidden_size evenly over num_attention_heads")
    pooling = hf.get("classifier_pooling", "cls")
    if pooling not in ("cls", "mean"):
        raise ValueError(f"config.json: classifier_pooling={pooling!r}, expected 'cls' or 'mean'")
    window, every = _modernbert_pattern(hf)
    theta, local_theta = _modernbert_thetas(hf)
    name = name or choose_head(hf, ())
    hidden, heads, vocab = hf["hidden_size"], hf["num_attention_heads"], hf["vocab_size"]
    dropout = max(hf.get(k, 0.0) for k in ("embedding_dropout", "mlp_dropout", "classifier_dropout"))
    return models.model_section(name, {
        **models.modernbert_model_fields("base"),  # the switches; the sizes follow
        # ModernBERT's table is a multiple of 64 rows: keep saying so where it is.
        "vocab_size": vocab, "vocab_multiple": 64 if vocab % 64 == 0 else 1,
        "emb_dim": hidden, "num_layers": hf["num_hidden_layers"], "num_heads": heads,
        "head_dim": hidden // heads, "mlp_dim": hf["intermediate_size"],
        "max_len": hf.get("max_position_embeddings", 8192), "activation": HF_ACTIVATIONS[act],
        "norm_bias": bool(hf.get("norm_bias", False)), "use_bias": bool(biases["attention_bias"]),
        "layer_norm_eps": hf.get("norm_eps", 1e-5), "attention_window": window,
        "attention_global_every": every, "rope_theta": theta, "rope_local_theta": local_theta,
        "pooling": pooling, "dropout_rate": dropout,
        "attention_dropout_rate": hf.get("attention_dropout", 0.0),
        "initializer_range": hf.get("initializer_range", 0.02), "num_labels": _num_labels(hf)})


def is_roberta(model_cfg: dict[str, Any]) -> bool:
    """Whether our BERT-family `model` section is a RoBERTa (positions after the pad id)."""
    return model_cfg.get("position_offset", 0) > 0


# What HF's BERT and RoBERTa classes always are, of the switches our encoder has beyond them.
BERT_ONLY_VALUES = {"positions": "learned", "normalization": "layernorm", "norm_bias": True,
                    "use_bias": True, "mlp_layer": "mlp", "embedding_norm": True,
                    "task_head": "bert", "attention_window": 0, "attention_pattern": "full"}


# What HF's ModernBERT classes always are (the rest of our switches they express).
MODERNBERT_VALUES = {"positions": "rope", "task_head": "modernbert", "norm": "pre",
                     "normalization": "layernorm", "mlp_layer": "glu", "embedding_norm": True,
                     "type_vocab_size": 0, "position_offset": 0, "attention_pattern": "full"}


def _misfits(cfg: models.BertConfig, modernbert: bool, ids: dict[str, int]) -> list[str]:
    """What keeps our BERT-family model `cfg` from being written as a HF ModernBERT (or, when
    not `modernbert`, as a HF BERT or RoBERTa): one entry per field, naming HF's value."""
    roberta = cfg.position_offset > 0 and not modernbert
    family = "ModernBERT" if modernbert else "RoBERTa" if roberta else "BERT"
    fixed = MODERNBERT_VALUES if modernbert else {"norm": "post", **BERT_ONLY_VALUES}
    bad = [f"model.{k}={getattr(cfg, k)!r} (HF {family}: {v!r})"
           for k, v in fixed.items() if getattr(cfg, k) != v]
    if cfg.num_heads * cfg.head_dim != cfg.emb_dim:
        bad.append(f"model.num_heads*head_dim={cfg.num_heads * cfg.head_dim} (HF {family}: "
                   f"emb_dim={cfg.emb_dim})")
    if cfg.type_vocab_size == 0 and not modernbert:
        bad.append(f"model.type_vocab_size=0 (HF {family} always has segment embeddings)")
    # HF's RoBERTa finds padding by its pad id, whose position row is the one before the first.
    if roberta and ids.get("pad", cfg.position_offset - 1) != cfg.position_offset - 1:
        bad.append(f"model.position_offset={cfg.position_offset} (HF RoBERTa: the tokenizer's pad "
                   f"id + 1 = {ids['pad'] + 1})")
    return bad


def is_modernbert(model_cfg: dict[str, Any]) -> bool:
    """Whether export writes our `model` section as a HF ModernBERT rather than a BERT or
    RoBERTa: the family it differs from in fewer fields (none for a model one of them
    expresses: e.g. task_head=modernbert is ModernBERT's, task_head=bert BERT's); a tie is BERT."""
    name, cfg = models.split_model_config(model_cfg)
    if models.CONFIGS[name] is not models.BertConfig:
        return False
    return len(_misfits(cfg, True, {})) < len(_misfits(cfg, False, {}))


def _hf_labels(name: str, cfg: models.BertConfig) -> dict[str, Any]:
    """config.json's label names (and regression) of a classification or tagging model."""
    if name not in ("bert_classification", "bert_tagging"):
        return {}
    out = {"id2label": {str(i): f"LABEL_{i}" for i in range(cfg.num_labels)},
           "label2id": {f"LABEL_{i}": i for i in range(cfg.num_labels)}}
    if name == "bert_classification" and cfg.num_labels == 1:
        out["problem_type"] = "regression"
    return out


def modernbert_hf_config(name: str, cfg: models.BertConfig, ids: dict[str, int]) -> dict[str, Any]:
    """The HF ModernBERT config.json of our model `name` with config `cfg`; `ids`: the
    tokenizer's pad, cls and sep ids (absent: null)."""
    layers, window, every = cfg.num_layers, cfg.attention_window, cfg.attention_global_every
    kinds = [_GLOBAL if not window or (every and i % every == 0) else _LOCAL for i in range(layers)]
    theta, local_theta = cfg.rope_theta, cfg.rope_local_theta or cfg.rope_theta
    act = HF_ACTIVATION[cfg.activation]
    out = {
        "architectures": [MODERNBERT_ARCHITECTURE[name]], "model_type": "modernbert",
        "vocab_size": cfg.vocab_rows, "hidden_size": cfg.emb_dim,
        "num_hidden_layers": layers, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim, "hidden_activation": act, "classifier_activation": act,
        "max_position_embeddings": cfg.max_len, "initializer_range": cfg.initializer_range,
        "norm_eps": cfg.layer_norm_eps, "norm_bias": cfg.norm_bias,
        "attention_bias": cfg.use_bias, "mlp_bias": cfg.use_bias, "classifier_bias": cfg.use_bias,
        "decoder_bias": True, "embedding_dropout": cfg.dropout_rate, "mlp_dropout": cfg.dropout_rate,
        "classifier_dropout": cfg.dropout_rate, "attention_dropout": cfg.attention_dropout_rate,
        "local_attention": 2 * window if window else 128,  # (128: unused, every layer is global)
        "layer_types": kinds,
        "rope_parameters": {_GLOBAL: {"rope_type": "default", "rope_theta": theta},
                            _LOCAL: {"rope_type": "default", "rope_theta": local_theta}},
        # transformers before 5 reads these (it cannot say "no global layer").
        "global_rope_theta": theta, "local_rope_theta": local_theta,
        **({"global_attn_every_n_layers": every or 1} if every or not window else {}),
        "classifier_pooling": getattr(cfg, "pooling", "cls") if name in (
            "bert_classification", "bert_choice") else "cls",
        "pad_token_id": ids.get("pad"), "cls_token_id": ids.get("cls"), "sep_token_id": ids.get("sep"),
        "bos_token_id": ids.get("cls"), "eos_token_id": ids.get("sep"),
        "tie_word_embeddings": True, "dtype": "float32",
    }
    return out | _hf_labels(name, cfg)


def hf_config(model_cfg: dict[str, Any], special_ids: dict[str, int] | None = None
              ) -> dict[str, Any]:
    """The HF config.json of our `model` config section (the inverse of model_config_from_hf):
    a ModernBERT when is_modernbert, a RoBERTa when position_offset > 0, else a BERT;
    `special_ids`: the tokenizer's pad (and, for RoBERTa and ModernBERT, cls and sep) ids. A
    model HF cannot express is a ValueError naming the field."""
    name, cfg = models.split_model_config(model_cfg)
    if name not in HF_ARCHITECTURE:
        raise ValueError(f"model.name={name!r} has no Hugging Face BERT equivalent; exportable: "
                         f"{sorted(HF_ARCHITECTURE)}")
    ids, modernbert = special_ids or {}, is_modernbert(model_cfg)
    roberta = cfg.position_offset > 0 and not modernbert
    if bad := _misfits(cfg, modernbert, ids):
        family = "ModernBERT" if modernbert else "RoBERTa" if roberta else "BERT"
        raise ValueError(f"this model cannot be written as a Hugging Face {family}: " + "; ".join(bad))
    if modernbert:
        return modernbert_hf_config(name, cfg, ids)
    architecture = (ROBERTA_ARCHITECTURE if roberta else HF_ARCHITECTURE)[name]
    if name == "bert_pretraining" and not cfg.nsp and not roberta:
        architecture = "BertForMaskedLM"  # masked LM only: no NSP head, no pooler
    out = {
        "architectures": [architecture], "model_type": "roberta" if roberta else "bert",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.emb_dim,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim, "hidden_act": HF_ACTIVATION[cfg.activation],
        "hidden_dropout_prob": cfg.dropout_rate,
        "attention_probs_dropout_prob": cfg.attention_dropout_rate,
        "max_position_embeddings": cfg.max_len, "type_vocab_size": cfg.type_vocab_size,
        "initializer_range": cfg.initializer_range, "layer_norm_eps": cfg.layer_norm_eps,
        "pad_token_id": cfg.position_offset - 1 if roberta else ids.get("pad", 0),
        "position_embedding_type": "absolute", "dtype": "float32",
    }
    if roberta and {"cls", "sep"} <= set(ids):
        out.update(bos_token_id=ids["cls"], eos_token_id=ids["sep"])
    return out | _hf_labels(name, cfg)


def choose_head(hf: dict[str, Any], names: Iterable[str], name: str | None = None) -> str:
    """Our model name: `name` if given, else config.json's architecture, else what the tensor
    `names` (normalised) hold: an unknown or absent architecture does not stop a conversion."""
    if name is not None:
        if name not in HF_ARCHITECTURE:
            raise ValueError(f"--head={name!r}; choose one of {sorted(HF_ARCHITECTURE)}")
        return name
    archs = hf.get("architectures") or []
    if archs and archs[0] in ARCHITECTURES:
        return ARCHITECTURES[archs[0]]
    names = set(names)
    # (ModernBERT's names without `model.`: its MLM has a prediction head and no classifier.)
    if any(n.startswith("cls.") for n in names) or "decoder.bias" in names or (
            "head.dense.weight" in names and "classifier.weight" not in names):
        guess = "bert_pretraining"
    elif "qa_outputs.weight" in names:
        guess = "bert_span"
    elif "classifier.weight" in names:  # tagging and multiple choice look the same: --head
        guess = "bert_classification"
    else:
        guess = "bert"
    if archs:
        log.warning(f"warning: architecture {archs[0]!r} is unknown; converting as {guess} (from "
                    f"the tensors); pass --head with one of {sorted(HF_ARCHITECTURE)} to choose")
    return guess


def normalise_name(name: str) -> str:
    """HF tensor name relative to the encoder: TF-era gamma/beta spellings and the `bert.` or
    `roberta.` prefix of task models (a bare BertModel's names have none) taken away, and
    RoBERTa's head names as BERT's (ROBERTA_NAMES)."""
    name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
    name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
    name = name.removeprefix("bert.").removeprefix("roberta.")
    for theirs, ours in ROBERTA_NAMES.items():
        if name.startswith(theirs):
            return ours + name.removeprefix(theirs)
    return name


def roberta_name(name: str, model_name: str) -> str | None:
    """HF RoBERTa's name of the BERT tensor `name` (relative to the encoder, as normalise_name
    gives it) in our model `model_name`'s RoBERTa class, without the `roberta.` prefix; None
    where that class has no such tensor (RobertaForMaskedLM: no pooler, no NSP head)."""
    if model_name == "bert_pretraining" and name.startswith(("pooler.", "cls.seq_relationship.")):
        return None
    for theirs, ours in ROBERTA_NAMES.items():
        # The classification head's names only in the classification model.
        if name.startswith(ours) and (theirs.startswith("lm_head.")
                                      or model_name == "bert_classification"):
            return theirs + name.removeprefix(ours)
    return name


def _modernbert_renames(model_name: str, num_layers: int
                        ) -> list[tuple[str, str | tuple[str, ...], bool]]:
    """(ModernBERT name prefix, BERT name prefix or prefixes, whether in its encoder) of
    MODERNBERT_NAMES with each layer spelled out, then those of model `model_name`'s head."""
    out = []
    for theirs, ours in MODERNBERT_NAMES.items():
        for i in range(num_layers) if "{i}" in theirs else [0]:
            ours_i = tuple(o.format(i=i) for o in ours) if isinstance(ours, tuple) else ours.format(i=i)
            out.append((theirs.format(i=i), ours_i, True))
    return out + [(t, o, False) for t, o in MODERNBERT_HEAD_NAMES.get(model_name, {}).items()]


# Layer 0's attention norm, which HF's ModernBERT has not (ours has it, unused: MODERNBERT_NAMES).
_FIRST_ATTENTION_NORM = "encoder.layer.0.attention.output.LayerNorm."


def modernbert_to_bert(weights: dict[str, np.ndarray], model_name: str, num_layers: int
                       ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """HF ModernBERT tensors under BERT's names, fused ones split (MODERNBERT_NAMES), for our
    model `model_name`; and {BERT name: the checkpoint's name} for reports. Layer 0's attention
    norm (unused) is the identity, the MLM bias zero where HF's decoder has none."""
    renames = _modernbert_renames(model_name, num_layers)
    out, shown = {}, {}
    for name, value in weights.items():
        rel, parts = name.removeprefix("model."), None
        for theirs, ours, _ in renames:
            if rel.startswith(theirs):
                leaf = rel.removeprefix(theirs)
                if isinstance(ours, str):
                    parts = {ours + leaf: value}
                    break
                if value.shape[0] % len(ours):
                    raise ValueError(f"tensor {name} has shape {tuple(value.shape)}: it fuses "
                                     f"{len(ours)} tensors along its first axis, which must divide "
                                     "evenly; the config.json does not describe these weights")
                parts = {o + leaf: v for o, v in zip(ours, np.split(value, len(ours)))}
                break
        for k, v in (parts or {rel: value}).items():
            out[k], shown[k] = v, name
    norm = out.get("embeddings.LayerNorm.weight")
    if norm is not None and _FIRST_ATTENTION_NORM + "weight" not in out:
        fills = {"weight": np.ones_like(norm), "bias": np.zeros_like(norm)}
        for leaf in ("weight", "bias") if "embeddings.LayerNorm.bias" in out else ("weight",):
            out[_FIRST_ATTENTION_NORM + leaf] = fills[leaf]
            shown[_FIRST_ATTENTION_NORM + leaf] = "(none: HF's layer 0 has no attn_norm)"
    word = out.get("embeddings.word_embeddings.weight")
    if model_name == "bert_pretraining" and word is not None and "cls.predictions.bias" not in out:
        out["cls.predictions.bias"] = np.zeros(word.shape[0], np.float32)  # decoder_bias=false
        shown["cls.predictions.bias"] = "(none: decoder_bias is false)"
    return out, shown


def bert_to_modernbert(tensors: dict[str, np.ndarray], model_name: str, num_layers: int
                       ) -> dict[str, np.ndarray]:
    """The inverse of modernbert_to_bert, as HF's ModernBERT class of `model_name` names its
    tensors (the encoder's under `model.` in task models): BERT-named tensors renamed, fused."""
    prefix = "model." if models.encoder_path(model_name) else ""
    left = {k: v for k, v in tensors.items() if not k.startswith(_FIRST_ATTENTION_NORM)}
    out = {}
    for theirs, ours, encoder in _modernbert_renames(model_name, num_layers):
        parts = ours if isinstance(ours, tuple) else (ours,)
        for leaf in ("weight", "bias") if theirs.endswith(".") else ("",):
            if all(p + leaf in left for p in parts):
                out[(prefix if encoder else "") + theirs + leaf] = np.concatenate(
                    [left.pop(p + leaf) for p in parts])
    return out | left


def tf_to_hf(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Google's TF BERT variables under their HF names and layout (kernels [in, out] -> torch
    weights [out, in]); optimizer slots and step counters dropped."""
    out = {}
    for name, value in weights.items():
        if _TF_SKIP.search(name):
            continue
        if name in _TF_NAMES:
            out[_TF_NAMES[name]] = value
            continue
        parts = name.split("/")
        leaf = parts[-1]
        parts[-1] = {"kernel": "weight", "gamma": "weight", "beta": "bias"}.get(leaf, leaf)
        if leaf.endswith("_embeddings"):
            parts.append("weight")
        hf = re.sub(r"(^|\.)layer_(\d+)\.", r"\1layer.\2.", ".".join(parts))
        out[hf] = value.T if leaf == "kernel" else value
    return out


def _to_ours(weights: dict[str, np.ndarray], name: str, path: str, target_shape: tuple,
             shown: str) -> np.ndarray:
    """HF tensor `name` (`shown` in the checkpoint) in our layout: torch Linear weights are
    [out, in], ours [in, ...out]."""
    tensor = weights[name].T if path.endswith("kernel") else weights[name]
    if tensor.size != int(np.prod(target_shape)):
        raise ValueError(f"shape mismatch for {path} (checkpoint tensor {shown}): checkpoint has "
                         f"{tuple(weights[name].shape)}, the model config expects "
                         f"{tuple(target_shape)}; the config.json does not describe these weights "
                         "(use the one that came with them)")
    return tensor.reshape(target_shape)


def convert_hf_weights(weights: dict[str, np.ndarray], model_cfg: dict[str, Any], seed: int = 0,
                       file_names: dict[str, str] | None = None) -> tuple[dict, list[str], list[str]]:
    """(params, missing, unused): params for `model_cfg` filled from HF tensors; `missing`
    names our parameters the checkpoint lacks (left freshly initialised), `unused` the HF
    tensors nothing took. `file_names`: the checkpoint's name of each tensor where `weights`
    renamed them (modernbert_to_bert)."""
    file_names = file_names or {}
    # errors and reports use the file's names
    shown = {normalise_name(k): file_names.get(k, k) for k in weights}
    weights = {normalise_name(k): np.asarray(v, np.float32) for k, v in weights.items()}
    fresh = nnx.to_pure_dict(nnx.state(models.create_model(model_cfg, seed=seed), nnx.Param))
    flat = traverse_util.flatten_dict(fresh, sep="/")
    table = hf_names(model_cfg["name"], flat, model_cfg["num_layers"])
    if "mlm/bias" in flat and "cls.predictions.bias" not in weights:
        table["mlm/bias"] = ["cls.predictions.decoder.bias"]  # older checkpoints keep it there
    used, missing, out = set(), [], {}
    for path, value in flat.items():
        names = table[path]
        if not all(n in weights for n in names):
            missing.append(path)
            out[path] = np.asarray(value)
            continue
        stacked = "encoder/layers/" in path  # [L, ...]: one HF tensor per layer
        tensors = [_to_ours(weights, n, path, value.shape[stacked:], shown[n]) for n in names]
        out[path] = np.stack(tensors) if stacked else tensors[0]
        used.update(names)
    if "mlm/bias" in flat:  # our decoder is tied to the word embeddings, with the MLM bias
        decoder, word = (weights.get(n) for n in ("cls.predictions.decoder.weight",
                                                    "embeddings.word_embeddings.weight"))
        if decoder is not None and word is not None and not np.array_equal(decoder, word):
            log.warning("warning: cls.predictions.decoder.weight differs from the word "
                        "embeddings; this model ties them, so the word embeddings are used")
        used.update({"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"})
    unused = sorted({shown[k] for k in weights if k not in used and not k.endswith("position_ids")})
    return traverse_util.unflatten_dict(out, sep="/"), missing, unused


def tf_checkpoint_prefix(source: Path) -> Path | None:
    """The checkpoint prefix of an original TF BERT source (the prefix itself, or a folder with
    bert_config.json and no config.json), or None for anything else."""
    if Path(f"{source}.index").is_file():  # e.g. .../uncased_L-12_H-768_A-12/bert_model.ckpt
        return source
    if not (source / "bert_config.json").is_file() or (source / "config.json").is_file():
        return None
    state = source / "checkpoint"  # tf.train.Saver's record of the newest checkpoint
    match = state.is_file() and re.search(r'^model_checkpoint_path:\s*"(.+)"', state.read_text(), re.M)
    if match:  # the recorded path may be absolute on another machine: take it beside the file
        return source / Path(match.group(1)).name
    indexes = sorted(source.glob("*.index"))
    if not indexes:
        data = ", ".join(p.name for p in sorted(source.glob("*.data-*"))) or "no checkpoint files"
        raise FileNotFoundError(f"{source}: no TensorFlow checkpoint <prefix>.index beside "
                                f"bert_config.json (found {data}); a TF checkpoint is <prefix>.index "
                                "and <prefix>.data-00000-of-00001: copy its .index file there")
    if len(indexes) > 1:
        raise FileNotFoundError(f"{source}: several TensorFlow checkpoints beside bert_config.json: "
                                f"{', '.join(p.name for p in indexes)}; pass the prefix of one, "
                                f"e.g. tf:{indexes[-1].with_suffix('')}")
    return indexes[0].with_suffix("")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e}); expected the model's BERT config") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: found a JSON {type(value).__name__}, expected an object (the "
                         "model's BERT config)")
    return value


# config.json keys a BERT config must have, all positive integers.
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size")


def read_source(source: str | os.PathLike
                ) -> tuple[dict, dict[str, np.ndarray], tokenizer_lib.Tokenizer, str]:
    """(HF-style config, {HF tensor name: array}, tokenizer, "hf:<folder>" or "tf:<prefix>") of
    a HF folder or cache entry, or of an original TF BERT checkpoint."""
    source = Path(source)
    prefix = tf_checkpoint_prefix(source)
    if prefix is None:
        folder = resolve_model_dir(source)
        config_file = folder / "config.json"
        beside = sorted(p.name for p in source.parent.glob(f"{glob.escape(source.name)}.*"))
        if not source.is_dir() and (beside or (source.parent / "bert_config.json").is_file()):
            raise FileNotFoundError(  # a TF checkpoint prefix whose .index is missing
                f"{source}.index: not found; an original TensorFlow checkpoint is <prefix>.index "
                "and <prefix>.data-00000-of-00001 with bert_config.json and vocab.txt beside them "
                f"(found: {', '.join(beside) or 'no ' + source.name + '.* files'}); copy the "
                ".index file there, or give the prefix or folder that has it")
        if not config_file.is_file():
            raise FileNotFoundError(
                f"{config_file}: not found; expected a Hugging Face BERT folder (config.json, "
                "weights, vocab.txt), a Hugging Face cache entry (models--org--name), or an "
                "original TensorFlow BERT folder (bert_config.json, vocab.txt, bert_model.ckpt.*)")
        hf = _read_json(config_file)
        return (hf, load_hf_weights(folder), tokenizer_lib.load_hf_tokenizer(folder, hf.get("model_type")),
                f"hf:{folder}")
    config_file = prefix.parent / "bert_config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file}: not found; put the model's bert_config.json "
                                f"beside the checkpoint {prefix}")
    weights = read_tf_checkpoint(prefix, keep=lambda n: not _TF_SKIP.search(n))
    # The original release has no tokenizer_config.json: casing follows the vocabulary (cased
    # models have uppercase tokens), which load_tokenizer infers.
    return (_read_json(config_file), tf_to_hf(weights), tokenizer_lib.load_tokenizer(prefix.parent),
            f"tf:{prefix}")


@contextlib.contextmanager
def _local_source(source: str | os.PathLike) -> Iterator[str | os.PathLike]:
    """`source` itself when local; for a gs:// source, a temporary local copy of what
    read_source reads: the folder, or a TF checkpoint prefix's files with the folder's
    bert_config.json and tokenizer files (not the folder's other checkpoints)."""
    if not paths.is_remote(source):
        yield source
        return
    remote = paths.path(source)
    if paths.path(f"{source}.index").is_file():
        beside = {"bert_config.json", *tokenizer_lib.TOKENIZER_FILES}

        def keep(name: str) -> bool:
            return name.startswith(f"{remote.name}.") or name in beside
        with paths.local_copy(remote.parent, keep=keep) as local:
            yield local / remote.name
    elif remote.is_dir():
        with paths.local_copy(remote) as local:
            yield local
    else:
        raise FileNotFoundError(f"{source}: no such folder or TensorFlow checkpoint prefix "
                                "(<prefix>.index); expected a Hugging Face BERT folder or an "
                                "original TensorFlow BERT checkpoint")


def convert_hf(source: str | os.PathLike, out: str | os.PathLike, name: str | None = None
               ) -> dict[str, Any]:
    """Converts a HF BERT folder or cache entry, or an original TF BERT checkpoint, into a
    bert_jax checkpoint directory (either may be local or gs://); returns a report."""
    out = paths.path(out)
    if checkpoint.checkpoint_dir(out).exists():
        raise FileExistsError(f"{out}: already holds checkpoints; choose a new output folder")
    with _local_source(source) as local:
        hf_cfg, weights, tokenizer, origin = read_source(local)
        if local != source:  # name the source, not its temporary copy
            origin = origin[:3] + str(source) + origin[3 + len(str(local)):]
        modernbert = hf_cfg.get("model_type") == "modernbert"
        names = {(k.removeprefix("model.") if modernbert else normalise_name(k)): k for k in weights}
        name = choose_head(hf_cfg, names, name)
        if "classifier.weight" in names and not {"id2label", "num_labels"} & set(hf_cfg):
            # TF run_classifier.py checkpoints: bert_config.json does not say; the head does.
            hf_cfg = {**hf_cfg, "num_labels": weights[names["classifier.weight"]].shape[0]}
        # A bare encoder saved without its pooler (add_pooling_layer=False) stays without one.
        try:
            model_cfg = model_config_from_hf(hf_cfg, name, use_pooler=name != "bert" or
                                             "pooler.dense.weight" in names)
        except ValueError as e:
            raise ValueError(f"{origin[3:]}: {e}") from None
        if tokenizer.vocab_size > model_cfg["vocab_size"]:
            raise ValueError(f"{tokenizer.vocab_file} has {tokenizer.vocab_size} tokens but the model "
                             f"config says vocab_size={model_cfg['vocab_size']}; use the "
                             f"{tokenizer.vocab_file.name} that came with the model")
        file_names = None
        if modernbert:
            weights, file_names = modernbert_to_bert(weights, name, model_cfg["num_layers"])
        params, missing, unused = convert_hf_weights(weights, model_cfg, file_names=file_names)
        encoder = "".join(f"{k}/" for k in models.encoder_path(name))
        essential = [p for p in missing if p.startswith(encoder) and p.removeprefix(encoder) not in _POOLER]
        if essential:
            raise ValueError(f"{origin[3:]}: encoder weights missing from the checkpoint: {essential}")
        checkpoint.save_params(out, 0, params, {"model": model_cfg, "source": origin})
        tokenizer.save(out)
        return {"model": name, "missing": missing, "unused": unused, "out": str(out), "source": origin}
