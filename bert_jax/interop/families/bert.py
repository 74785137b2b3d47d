"""BERT (model_type "bert"; Google's original TF release reads as it too): our BERT models as
HF's Bert* classes, the encoder's tensors under `bert.` in task models. Also the config.json
checks and fields the RoBERTa and ModernBERT families share."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from bert_jax import models
from bert_jax.interop.families import Family, register

# Our activation -> the HF hidden_act export writes; import reads these and the aliases.
HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}
HF_ACTIVATIONS = {v: k for k, v in HF_ACTIVATION.items()} | {"gelu_pytorch_tanh": "gelu_tanh"}

# config.json keys a BERT config must have, all positive integers.
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size")

# What HF's BERT and RoBERTa classes always are, of the switches our encoder has beyond them.
BERT_ONLY_VALUES = {"positions": "learned", "normalization": "layernorm", "norm_bias": True,
                    "use_bias": True, "mlp_layer": "mlp", "embedding_norm": True,
                    "task_head": "bert", "attention_window": 0, "attention_pattern": "full"}

# BERT's tensor names (relative to the encoder) that are the encoder's: the rest are the heads'.
ENCODER_PARTS = ("embeddings.", "encoder.", "pooler.", "final_norm.")


def check_sizes(hf: dict[str, Any], title: str) -> None:
    """config.json's sizes: present, positive integers, and a width the heads split evenly."""
    if missing := [k for k in REQUIRED if k not in hf]:
        raise ValueError(f"config.json: no {missing[0]!r}; expected a {title} config with {list(REQUIRED)}")
    for key in (*REQUIRED, "max_position_embeddings", "type_vocab_size"):
        value, least = hf.get(key, 1), 0 if key == "type_vocab_size" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"config.json: {key}={value!r}, expected an integer >= {least}")
    if hf["hidden_size"] % hf["num_attention_heads"]:
        raise ValueError(f"config.json: hidden_size={hf['hidden_size']} is not divisible by "
                         f"num_attention_heads={hf['num_attention_heads']}; a {title} config "
                         "splits the width evenly")


def num_labels(hf: dict[str, Any]) -> int:
    return len(hf["id2label"]) if "id2label" in hf else hf.get("num_labels", 2)


def hf_labels(name: str, cfg: models.BertConfig) -> dict[str, Any]:
    """config.json's label names (and regression) of a classification or tagging model."""
    if name not in ("bert_classification", "bert_tagging"):
        return {}
    out = {"id2label": {str(i): f"LABEL_{i}" for i in range(cfg.num_labels)},
           "label2id": {f"LABEL_{i}": i for i in range(cfg.num_labels)}}
    if name == "bert_classification" and cfg.num_labels == 1:
        out["problem_type"] = "regression"
    return out


def fixed_misfits(cfg: models.BertConfig, fixed: dict[str, Any], title: str) -> list[str]:
    """The fields of `cfg` that differ from the `fixed` values of HF's `title` classes, and a
    width its heads do not split evenly."""
    bad = [f"model.{k}={getattr(cfg, k)!r} (HF {title}: {v!r})"
           for k, v in fixed.items() if getattr(cfg, k) != v]
    if cfg.num_heads * cfg.head_dim != cfg.emb_dim:
        bad.append(f"model.num_heads*head_dim={cfg.num_heads * cfg.head_dim} (HF {title}: "
                   f"emb_dim={cfg.emb_dim})")
    return bad


def in_encoder(name: str) -> bool:
    """Whether BERT's tensor `name` (relative to the encoder) is the encoder's."""
    return name.startswith(ENCODER_PARTS)


@dataclasses.dataclass(frozen=True)
class Bert(Family):
    """HF's BERT classes; RoBERTa's differ in positions, tokenizer and head names (roberta.py)."""

    def config_from_hf(self, hf: dict[str, Any], name: str, use_pooler: bool) -> dict[str, Any]:
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("config.json: position_embedding_type="
                             f"{hf['position_embedding_type']!r} is not supported (only 'absolute')")
        if hf.get("is_decoder") or hf.get("add_cross_attention"):
            raise ValueError("config.json: is_decoder/add_cross_attention is set (a causal BERT "
                             "decoder); only the bidirectional BERT encoder converts")
        act = hf.get("hidden_act", "gelu")
        if act not in HF_ACTIVATIONS:
            raise ValueError(f"config.json: hidden_act={act!r}; supported: {sorted(HF_ACTIVATIONS)}")
        check_sizes(hf, "BERT")
        if hf.get("type_vocab_size", 2) < 1:
            raise ValueError(f"config.json: type_vocab_size=0, but HF's {self.title} always has "
                             "token type embeddings (every token reads row 0); use the config.json "
                             "that came with the weights")
        hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
        # The fields model `name` reads: the pooler and the label count only where it has them.
        return models.model_section(name, dict(
            vocab_size=hf["vocab_size"], emb_dim=hidden,
            num_layers=hf["num_hidden_layers"], num_heads=heads, head_dim=hidden // heads,
            mlp_dim=hf["intermediate_size"], max_len=hf.get("max_position_embeddings", 512),
            type_vocab_size=hf.get("type_vocab_size", 2), position_offset=self.position_offset(hf),
            dropout_rate=hf.get("hidden_dropout_prob", 0.1),
            attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
            activation=HF_ACTIVATIONS[act], layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
            initializer_range=hf.get("initializer_range", 0.02), use_pooler=use_pooler,
            num_labels=num_labels(hf), hf_family=self.name,
            # BERT's published MaskedLM checkpoints (bert-base-uncased) carry the NSP head too
            nsp=self.nsp))

    def position_offset(self, hf: dict[str, Any]) -> int:
        """model.position_offset of config.json `hf`: BERT's positions start at row 0."""
        return 0

    def misfits(self, cfg: models.BertConfig, ids: dict[str, int]) -> list[str]:
        bad = fixed_misfits(cfg, {"norm": "post", **BERT_ONLY_VALUES, **self.offset_fixed()},
                            self.title)
        if cfg.type_vocab_size == 0:
            bad.append(f"model.type_vocab_size=0 (HF {self.title} always has segment embeddings)")
        return bad + self.position_misfits(cfg, ids)

    def offset_fixed(self) -> dict[str, Any]:
        return {"position_offset": 0}

    def position_misfits(self, cfg: models.BertConfig, ids: dict[str, int]) -> list[str]:
        return []

    def config_to_hf(self, name: str, cfg: models.BertConfig, ids: dict[str, int]) -> dict[str, Any]:
        architecture = self.architectures[name]
        if name == "bert_pretraining" and not cfg.nsp and self.nsp:
            architecture = "BertForMaskedLM"  # masked LM only: no NSP head, no pooler
        return {
            "architectures": [architecture], "model_type": self.model_type,
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.emb_dim,
            "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
            "intermediate_size": cfg.mlp_dim, "hidden_act": HF_ACTIVATION[cfg.activation],
            "hidden_dropout_prob": cfg.dropout_rate,
            "attention_probs_dropout_prob": cfg.attention_dropout_rate,
            "max_position_embeddings": cfg.max_len, "type_vocab_size": cfg.type_vocab_size,
            "initializer_range": cfg.initializer_range, "layer_norm_eps": cfg.layer_norm_eps,
            "pad_token_id": self.pad_id(cfg, ids), "position_embedding_type": "absolute",
            "dtype": "float32", **self.special_ids(ids),
        } | hf_labels(name, cfg)

    def pad_id(self, cfg: models.BertConfig, ids: dict[str, int]) -> int:
        return ids.get("pad", 0)

    def special_ids(self, ids: dict[str, int]) -> dict[str, int]:
        """config.json's ids beyond the pad's (BERT's has none)."""
        return {}

    def normalise(self, name: str) -> str:
        # TF-era LayerNorm spellings (gamma, beta) as torch's
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
        name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
        return name.removeprefix(self.prefix)

    def to_hf(self, tensors: dict[str, np.ndarray], model_name: str, num_layers: int
              ) -> dict[str, np.ndarray]:
        prefix = self.prefix if models.encoder_path(model_name) else ""
        return {prefix + k if in_encoder(k) else k: v for k, v in tensors.items()}


BERT = register(Bert(
    name="bert", model_type="bert", title="BERT", prefix="bert.", signature=("bert.",),
    architectures={
        "bert": "BertModel",
        "bert_pretraining": "BertForPreTraining",
        "bert_classification": "BertForSequenceClassification",
        "bert_tagging": "BertForTokenClassification",
        "bert_span": "BertForQuestionAnswering",
        "bert_choice": "BertForMultipleChoice",
    },
    aliases={"BertForMaskedLM": "bert_pretraining", "BertForNextSentencePrediction": "bert_pretraining"}))
