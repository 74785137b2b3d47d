"""RoBERTa (model_type "roberta"): our BERT models with position_offset = pad id + 1 as HF's
Roberta* classes: the encoder's tensors under `roberta.`, the heads renamed (NAMES), no NSP
head, a byte-level BPE tokenizer."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from bert_jax import models
from bert_jax.interop.families import register
from bert_jax.interop.families.bert import Bert, in_encoder

# RoBERTa's tensor name prefixes where BERT's differ (its encoder is BERT's, under `roberta.`):
# the MLM head, and the classification head, whose dense + tanh on <s> is BERT's pooler.
NAMES = {
    "lm_head.dense.": "cls.predictions.transform.dense.",
    "lm_head.layer_norm.": "cls.predictions.transform.LayerNorm.",
    "lm_head.bias": "cls.predictions.bias",
    "lm_head.decoder.": "cls.predictions.decoder.",
    "classifier.dense.": "pooler.dense.",
    "classifier.out_proj.": "classifier.",
}


def roberta_name(name: str, model_name: str) -> str | None:
    """HF RoBERTa's name of the BERT tensor `name` (relative to the encoder) in our model
    `model_name`'s RoBERTa class, without the `roberta.` prefix; None where that class has no
    such tensor (RobertaForMaskedLM: no pooler, no NSP head)."""
    if model_name == "bert_pretraining" and name.startswith(("pooler.", "cls.seq_relationship.")):
        return None
    for theirs, ours in NAMES.items():
        # The classification head's names only in the classification model.
        if name.startswith(ours) and (theirs.startswith("lm_head.")
                                      or model_name == "bert_classification"):
            return theirs + name.removeprefix(ours)
    return name


@dataclasses.dataclass(frozen=True)
class Roberta(Bert):
    """HF's RoBERTa classes: BERT's with positions after the pad id and RoBERTa's head names."""

    def position_offset(self, hf: dict[str, Any]) -> int:
        """Positions from pad id + 1 (HF RobertaConfig's default pad: 1)."""
        pad = hf.get("pad_token_id", 1)
        if not isinstance(pad, int) or isinstance(pad, bool) or not 0 <= pad < hf.get(
                "max_position_embeddings", 512) - 1:
            raise ValueError(f"config.json: pad_token_id={pad!r}; a RoBERTa's positions start "
                             "after it, so it must be an integer < max_position_embeddings - 1")
        return pad + 1

    def offset_fixed(self) -> dict[str, Any]:
        return {}

    def position_misfits(self, cfg: models.BertConfig, ids: dict[str, int]) -> list[str]:
        # HF's RoBERTa finds padding by its pad id, whose position row is the one before the first.
        if "pad" in ids and cfg.position_offset != ids["pad"] + 1:
            return [f"model.position_offset={cfg.position_offset} (HF RoBERTa: the tokenizer's pad "
                    f"id + 1 = {ids['pad'] + 1})"]
        if cfg.position_offset < 1:
            return [f"model.position_offset={cfg.position_offset} (HF RoBERTa: the pad id + 1, at "
                    "least 1)"]
        return []

    def pad_id(self, cfg: models.BertConfig, ids: dict[str, int]) -> int:
        return cfg.position_offset - 1

    def special_ids(self, ids: dict[str, int]) -> dict[str, int]:
        return {"bos_token_id": ids["cls"], "eos_token_id": ids["sep"]} if {"cls", "sep"} <= set(ids) else {}

    def normalise(self, name: str) -> str:
        name = super().normalise(name)
        for theirs, ours in NAMES.items():
            if name.startswith(theirs):
                return ours + name.removeprefix(theirs)
        return name

    def to_hf(self, tensors: dict[str, np.ndarray], model_name: str, num_layers: int
              ) -> dict[str, np.ndarray]:
        prefix = self.prefix if models.encoder_path(model_name) else ""
        out = {}
        for name, value in tensors.items():
            theirs = roberta_name(name, model_name)
            if theirs is None:  # e.g. the NSP head: RobertaForMaskedLM has none
                continue
            # (RoBERTa's classifier.dense, at the root, is our classification model's pooler.)
            encoder = in_encoder(name) and not theirs.startswith("classifier.")
            out[prefix + theirs if encoder else theirs] = value
        return out


ROBERTA = register(Roberta(
    name="roberta", model_type="roberta", title="RoBERTa", prefix="roberta.", signature=("roberta.",),
    nsp=False,
    tokenizer="bpe", tokenizers=("bpe",),
    # It has no NSP head, so pretraining is its MLM.
    architectures={
        "bert": "RobertaModel",
        "bert_pretraining": "RobertaForMaskedLM",
        "bert_classification": "RobertaForSequenceClassification",
        "bert_tagging": "RobertaForTokenClassification",
        "bert_span": "RobertaForQuestionAnswering",
        "bert_choice": "RobertaForMultipleChoice",
    }))
