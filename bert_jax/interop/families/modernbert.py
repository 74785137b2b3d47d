"""ModernBERT (model_type "modernbert"): our BERT models with ModernBERT's switches
(models.modernbert_model_fields: rope, GeGLU, pre-norm, task_head modernbert) as HF's ModernBert*
classes: the encoder's tensors under `model.` in task models, renamed from BERT's and fused
(NAMES: Wqkv, Wi), no NSP head and no pooler, its tokenizer.json (BPE, or WordPiece) as it is."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from bert_jax import models
from bert_jax.interop.families import Family, register
from bert_jax.interop.families.bert import (
    HF_ACTIVATION,
    HF_ACTIVATIONS,
    check_sizes,
    fixed_misfits,
    hf_labels,
    num_labels,
)
from bert_jax.models.config import MODERNBERT_FIXED

# HF ModernBERT's tensor names (its encoder's relative to `model.` in its task models) -> the
# BERT names of convert.py's tables, for both directions; {i}: the layer; a tuple: one fused tensor,
# those BERT tensors concatenated along its first (output) axis (Wqkv: query, key, value; Wi:
# the activated half, then the gate). Its layer 0 has no attn_norm (it reads the normalised
# embeddings), nor has ours (the stacked norm holds layers 1..: convert.hf_names).
NAMES = {
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
HEAD_NAMES = {
    "bert_pretraining": {"head.dense.": "cls.predictions.transform.dense.",
                         "head.norm.": "cls.predictions.transform.LayerNorm.",
                         "decoder.bias": "cls.predictions.bias",
                         "decoder.weight": "cls.predictions.decoder.weight"},
    "bert_span": {"classifier.": "qa_outputs."},
}

# HF ModernBERT's layer kinds (config.json layer_types).
_GLOBAL, _LOCAL = "full_attention", "sliding_attention"


def _pattern(hf: dict[str, Any]) -> tuple[int, int]:
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
    positions = hf.get("max_position_embeddings", 8192)
    if isinstance(positions, int) and local > positions:  # (a window wider than any input)
        raise ValueError(f"config.json: local_attention={local} exceeds max_position_embeddings="
                         f"{positions}: the window (over both sides) must fit in the model's "
                         "positions; use the config.json that came with the weights (ModernBERT's "
                         "is 128)")
    globals_ = [i for i, kind in enumerate(kinds) if kind == _GLOBAL]
    # Ours: layer i is global when i % every == 0 (every=0: none); a lone layer 0: every = layers.
    every = 0 if not globals_ else (globals_[1] if len(globals_) > 1 else layers)
    if kinds != [_GLOBAL if every and i % every == 0 else _LOCAL for i in range(layers)]:
        raise ValueError(f"config.json: layer_types={kinds!r} cannot be expressed: our model makes "
                         "layer i global when i % model.attention_global_every == 0 (layer 0 and "
                         "every n-th after it, or none); use such a pattern")
    return local // 2, every


def _thetas(hf: dict[str, Any]) -> tuple[float, float]:
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


VALUES = MODERNBERT_FIXED  # what HF's ModernBERT classes always are


def _renames(model_name: str, num_layers: int) -> list[tuple[str, str | tuple[str, ...], bool]]:
    """(ModernBERT name prefix, BERT name prefix or prefixes, whether in its encoder) of
    NAMES with each layer spelled out, then those of model `model_name`'s head."""
    out = []
    for theirs, ours in NAMES.items():
        for i in range(num_layers) if "{i}" in theirs else [0]:
            ours_i = tuple(o.format(i=i) for o in ours) if isinstance(ours, tuple) else ours.format(i=i)
            out.append((theirs.format(i=i), ours_i, True))
    return out + [(t, o, False) for t, o in HEAD_NAMES.get(model_name, {}).items()]


def modernbert_to_bert(weights: dict[str, np.ndarray], model_name: str, num_layers: int
                       ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """HF ModernBERT tensors under BERT's names, fused ones split (NAMES), for our
    model `model_name`; and {BERT name: the checkpoint's name} for reports. The MLM bias is
    zero where HF's decoder has none."""
    renames = _renames(model_name, num_layers)
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
    left = dict(tensors)
    out = {}
    for theirs, ours, encoder in _renames(model_name, num_layers):
        parts = ours if isinstance(ours, tuple) else (ours,)
        for leaf in ("weight", "bias") if theirs.endswith(".") else ("",):
            if all(p + leaf in left for p in parts):
                out[(prefix if encoder else "") + theirs + leaf] = np.concatenate(
                    [left.pop(p + leaf) for p in parts])
    return out | left


@dataclasses.dataclass(frozen=True)
class ModernBert(Family):
    """HF's ModernBERT classes."""

    def config_from_hf(self, hf: dict[str, Any], name: str, use_pooler: bool) -> dict[str, Any]:
        """Our BERT family with ModernBERT's switches; what our model cannot express is a
        ValueError naming the field."""
        check_sizes(hf, "ModernBERT")
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
        window, every = _pattern(hf)
        theta, local_theta = _thetas(hf)
        if hf.get("type_vocab_size", 0):  # (HF's ModernBertConfig has no such field: a BERT's config.json)
            raise ValueError(f"config.json: type_vocab_size={hf['type_vocab_size']!r}, but HF's "
                             "ModernBERT has no token type embeddings; use the config.json that "
                             "came with the weights, or remove type_vocab_size")
        hidden, heads, vocab = hf["hidden_size"], hf["num_attention_heads"], hf["vocab_size"]
        dropout = max(hf.get(k, 0.0) for k in ("embedding_dropout", "mlp_dropout", "classifier_dropout"))
        return models.model_section(name, {
            **models.modernbert_model_fields("base"),  # the switches (hf_family too); the sizes follow
            # ModernBERT's table is a multiple of 64 rows: keep saying so where it is.
            "vocab_size": vocab, "vocab_multiple": 64 if vocab % 64 == 0 else 1,
            "emb_dim": hidden, "num_layers": hf["num_hidden_layers"], "num_heads": heads,
            "head_dim": hidden // heads, "mlp_dim": hf["intermediate_size"],
            "max_len": hf.get("max_position_embeddings", 8192), "activation": HF_ACTIVATIONS[act],
            "norm_bias": bool(hf.get("norm_bias", False)), "use_bias": bool(biases["attention_bias"]),
            "layer_norm_eps": hf.get("norm_eps", 1e-5), "attention_window": window,
            "attention_global_every": every, "rope_theta": theta, "rope_local_theta": local_theta,
            "pooling": pooling, "dropout_rate": dropout,
            # HF's attention_dropout drops both the probabilities and the output projection's
            # output (ModernBertAttention's out_drop): ours are two fields.
            "attention_dropout_rate": hf.get("attention_dropout", 0.0),
            "attention_output_dropout_rate": hf.get("attention_dropout", 0.0),
            "initializer_range": hf.get("initializer_range", 0.02), "num_labels": num_labels(hf)})

    def misfits(self, cfg: models.BertConfig, ids: dict[str, int]) -> list[str]:
        return fixed_misfits(cfg, VALUES, self.title)

    def config_to_hf(self, name: str, cfg: models.BertConfig, ids: dict[str, int]) -> dict[str, Any]:
        """ids absent: null."""
        layers, window, every = cfg.num_layers, cfg.attention_window, cfg.attention_global_every
        kinds = [_GLOBAL if not window or (every and i % every == 0) else _LOCAL for i in range(layers)]
        theta, local_theta = cfg.rope_theta, cfg.rope_local_theta or cfg.rope_theta
        act = HF_ACTIVATION[cfg.activation]
        out = {
            "architectures": [self.architectures[name]], "model_type": self.model_type,
            "vocab_size": cfg.vocab_rows, "hidden_size": cfg.emb_dim,
            "num_hidden_layers": layers, "num_attention_heads": cfg.num_heads,
            "intermediate_size": cfg.mlp_dim, "hidden_activation": act, "classifier_activation": act,
            "max_position_embeddings": cfg.max_len, "initializer_range": cfg.initializer_range,
            "norm_eps": cfg.layer_norm_eps, "norm_bias": cfg.norm_bias,
            "attention_bias": cfg.use_bias, "mlp_bias": cfg.use_bias, "classifier_bias": cfg.use_bias,
            "decoder_bias": True, "embedding_dropout": cfg.dropout_rate, "mlp_dropout": cfg.dropout_rate,
            "classifier_dropout": cfg.dropout_rate,
            # (one rate for both of ours: the larger, as dropout_rate is read from the largest)
            "attention_dropout": max(cfg.attention_dropout_rate, cfg.attention_output_dropout),
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
        return out | hf_labels(name, cfg)

    def from_hf(self, weights: dict[str, np.ndarray], model_name: str, num_layers: int
                ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        return modernbert_to_bert(weights, model_name, num_layers)

    def to_hf(self, tensors: dict[str, np.ndarray], model_name: str, num_layers: int
              ) -> dict[str, np.ndarray]:
        # (ModernBertForMaskedLM has no NSP head)
        kept = {k: v for k, v in tensors.items() if not k.startswith("cls.seq_relationship.")}
        return bert_to_modernbert(kept, model_name, num_layers)


MODERNBERT = register(ModernBert(
    name="modernbert", model_type="modernbert", title="ModernBERT", prefix="model.", nsp=False,
    signature=tuple(p + n for p in ("model.", "") for n in ("embeddings.tok_embeddings.", "layers.")),
    pooler=False, tokenizer="bpe", tokenizers=("wordpiece", "bpe"),
    # transformers reads a ModernBERT's tokenizer.json as it is
    tokenizer_options={"tokenizer_class": "PreTrainedTokenizerFast",
                       "model_input_names": ["input_ids", "attention_mask"]},
    architectures={
        "bert": "ModernBertModel",
        "bert_pretraining": "ModernBertForMaskedLM",
        "bert_classification": "ModernBertForSequenceClassification",
        "bert_tagging": "ModernBertForTokenClassification",
        "bert_span": "ModernBertForQuestionAnswering",
        "bert_choice": "ModernBertForMultipleChoice",
    }))
