"""Import of public Hugging Face BERT checkpoints (`bert-jax convert hf:<dir> <out>`)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx, traverse_util

from bert_jax import checkpoint, models
from bert_jax.data import vocab
from bert_jax.hf_weights import load_hf_weights

# HF architecture -> our model name.
ARCHITECTURES = {
    "BertModel": "bert",
    "BertForPreTraining": "bert_pretraining",
    "BertForMaskedLM": "bert_pretraining",
    "BertForSequenceClassification": "bert_classification",
    "BertForTokenClassification": "bert_tagging",
    "BertForQuestionAnswering": "bert_span",
    "BertForMultipleChoice": "bert_choice",
}
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "relu": "relu"}

# Our parameter path (under the task model) -> HF tensor name (after normalisation), for
# everything outside the stacked encoder layers.
_OUTER = {
    "bert/embeddings/word/embedding": "bert.embeddings.word_embeddings.weight",
    "bert/embeddings/position/embedding": "bert.embeddings.position_embeddings.weight",
    "bert/embeddings/token_type/embedding": "bert.embeddings.token_type_embeddings.weight",
    "bert/embeddings/norm/scale": "bert.embeddings.LayerNorm.weight",
    "bert/embeddings/norm/bias": "bert.embeddings.LayerNorm.bias",
    "bert/pooler/kernel": "bert.pooler.dense.weight",
    "bert/pooler/bias": "bert.pooler.dense.bias",
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
}
# Per encoder layer: our path under bert/encoder/layers -> HF name under encoder.layer.{i}.
_LAYER = {
    "attention/query": "attention.self.query",
    "attention/key": "attention.self.key",
    "attention/value": "attention.self.value",
    "attention/out": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "mlp/wi": "intermediate.dense",
    "mlp/wo": "output.dense",
    "mlp_norm": "output.LayerNorm",
}


def model_config_from_hf(hf: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """Our `model` config section from a HF BERT config.json."""
    if hf.get("model_type", "bert") != "bert":
        raise ValueError(f"config.json: model_type={hf.get('model_type')!r}; only 'bert' converts")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("config.json: position_embedding_type="
                         f"{hf['position_embedding_type']!r} is not supported (only 'absolute')")
    act = hf.get("hidden_act", "gelu")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"config.json: hidden_act={act!r}; supported: {sorted(HF_ACTIVATIONS)}")
    if name is None:
        arch = (hf.get("architectures") or ["BertForPreTraining"])[0]
        if arch not in ARCHITECTURES:
            raise ValueError(f"config.json: architecture {arch!r} unknown; pass --head with one "
                             f"of {sorted(set(ARCHITECTURES.values()))}")
        name = ARCHITECTURES[arch]
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    num_labels = len(hf["id2label"]) if "id2label" in hf else hf.get("num_labels", 2)
    return dict(
        name=name, vocab_size=hf["vocab_size"], emb_dim=hidden,
        num_layers=hf["num_hidden_layers"], num_heads=heads, head_dim=hidden // heads,
        mlp_dim=hf["intermediate_size"], max_len=hf.get("max_position_embeddings", 512),
        type_vocab_size=hf.get("type_vocab_size", 2),
        dropout_rate=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
        activation=HF_ACTIVATIONS[act], layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        initializer_range=hf.get("initializer_range", 0.02),
        num_labels=1 if name == "bert_choice" else num_labels,
    )


def _normalise(name: str) -> str:
    """Canonical HF name: TF-era gamma/beta spellings, and `bert.` on encoder weights."""
    name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
    name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
    if name.startswith(("embeddings.", "encoder.", "pooler.")):
        name = "bert." + name
    return name


def _to_ours(weights: dict[str, np.ndarray], name: str, path: str, target_shape: tuple
             ) -> np.ndarray:
    """HF tensor `name` in our layout: torch Linear weights are [out, in], ours [in, ...out]."""
    tensor = weights[name].T if path.endswith("kernel") else weights[name]
    if tensor.size != int(np.prod(target_shape)):
        raise ValueError(f"shape mismatch for {path} (checkpoint tensor {name}): checkpoint has "
                         f"{tuple(weights[name].shape)}, the model config expects "
                         f"{tuple(target_shape)}")
    return tensor.reshape(target_shape)


def convert_hf_weights(weights: dict[str, np.ndarray], model_cfg: dict[str, Any], seed: int = 0
                       ) -> tuple[dict, list[str], list[str]]:
    """(params, missing, unused): params for `model_cfg` filled from HF tensors; `missing`
    names our parameters the checkpoint lacks (left freshly initialised), `unused` the HF
    tensors nothing took."""
    weights = {_normalise(k): np.asarray(v, np.float32) for k, v in weights.items()}
    fresh = nnx.to_pure_dict(nnx.state(models.create_model(model_cfg, seed=seed), nnx.Param))
    flat = traverse_util.flatten_dict(fresh, sep="/")
    used, missing, out = set(), [], {}
    num_layers = model_cfg["num_layers"]
    for path, value in flat.items():
        layer_key = path.removeprefix("bert/encoder/layers/")
        if layer_key != path:  # stacked [L, ...]: one HF tensor per layer
            module, leaf = layer_key.rsplit("/", 1)
            suffix = {"kernel": "weight", "scale": "weight", "bias": "bias"}[leaf]
            names = [f"bert.encoder.layer.{i}.{_LAYER[module]}.{suffix}" for i in range(num_layers)]
            if all(n in weights for n in names):
                out[path] = np.stack([_to_ours(weights, n, path, value.shape[1:]) for n in names])
                used.update(names)
                continue
        else:
            name = _OUTER[path]
            if path == "mlm/bias" and name not in weights:
                name = "cls.predictions.decoder.bias"
            if name in weights:
                out[path] = _to_ours(weights, name, path, value.shape)
                used.add(name)
                continue
        missing.append(path)
        out[path] = np.asarray(value)
    if "mlm/bias" in flat:  # the decoder is tied to the word embeddings and the MLM bias
        used.update({"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"})
    unused = sorted(k for k in weights if k not in used and not k.endswith("position_ids"))
    return traverse_util.unflatten_dict(out, sep="/"), missing, unused


def convert_hf(source: str | os.PathLike, out: str | os.PathLike, name: str | None = None
               ) -> dict[str, Any]:
    """Converts a HF BERT directory into a bert_jax checkpoint directory; returns a report."""
    source, out = Path(source), Path(out)
    config_file = source / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file}: not found; expected a Hugging Face BERT folder "
                                "with config.json, model weights and vocab.txt")
    if checkpoint.checkpoint_dir(out).exists():
        raise FileExistsError(f"{out}: already holds checkpoints; choose a new output folder")
    hf_cfg = json.loads(config_file.read_text())
    model_cfg = model_config_from_hf(hf_cfg, name)
    tokenizer = vocab.load_hf_tokenizer(source)
    if tokenizer.vocab_size != model_cfg["vocab_size"]:
        raise ValueError(f"{source / 'vocab.txt'} has {tokenizer.vocab_size} tokens but "
                         f"config.json says vocab_size={model_cfg['vocab_size']}")
    params, missing, unused = convert_hf_weights(load_hf_weights(source), model_cfg)
    essential = [p for p in missing if p.startswith("bert/")]
    if essential:
        raise ValueError(f"{source}: encoder weights missing from the checkpoint: {essential}")
    checkpoint.save_params(out, 0, params, {"model": model_cfg, "source": f"hf:{source}"})
    tokenizer.save(out)
    return {"model": model_cfg["name"], "missing": missing, "unused": unused, "out": str(out)}
