"""Import of public BERT, RoBERTa and ModernBERT checkpoints (`bert-jax convert hf:<dir> <out>`),
and the one table of names between our parameters and BERT's tensor names that export.py uses
for the way back; each Hugging Face family (interop/families: one file each) renames its
tensors to and from BERT's and reads and writes its config.json.

Accepted sources: a Hugging Face BERT folder (config.json, vocab.txt or, as transformers 5 saves
it, tokenizer.json's WordPiece alone, and model.safetensors,
pytorch_model.bin or a sharded index of either; tensors with or without the `bert.` prefix,
LayerNorm `gamma`/`beta` or `weight`/`bias`), a Hugging Face cache entry (`models--org--name`
or one of its `snapshots/<hash>`), and Google's original TensorFlow release (bert_config.json,
vocab.txt, bert_model.ckpt.index + .data-*), read without TensorFlow. A Hugging Face RoBERTa
folder (model_type "roberta": tokenizer.json or vocab.json + merges.txt, tensors under `roberta.`)
becomes our BERT family with position_offset = pad id + 1 and hf_family roberta; a Hugging Face
ModernBERT folder (model_type "modernbert": tokenizer.json, tensors under `model.`) our BERT family
with ModernBERT's switches and hf_family modernbert. config.json's model_type picks the family; a
folder whose tensors are another family's is refused.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx, traverse_util

from bert_jax import models, paths
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.data.wordpiece import tokenizer_json_state
from bert_jax.interop import families
from bert_jax.interop.hf_weights import load_hf_weights, resolve_model_dir
from bert_jax.interop.tf_checkpoint import read_tf_checkpoint
from bert_jax.training import checkpoint

log = logging.getLogger(__name__)

# Our BERT models, each written as its family's class of the same head (families/*.py).
BERT_MODELS = tuple(n for n, c in models.CONFIGS.items() if c is models.BertConfig)

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


def hf_names(model_name: str, params: Mapping[str, Any], num_layers: int,
             hf_encoder_prefix: str = "") -> dict[str, list[str]]:
    """{our parameter path: [HF tensor name, one per row for the stacked layers]} of `params`
    ({path: array or shape struct}); a stacked leaf of n < num_layers rows holds the last n
    layers' (the first layer of a pre-norm stack after an embedding norm has no attention
    norm). HF encoder names carry `hf_encoder_prefix` ("bert." in HF task models)."""
    ours_at = "".join(f"{k}/" for k in models.encoder_path(model_name))
    table = {}
    for path, value in params.items():
        if not path.startswith(ours_at):
            table[path] = [HEAD_NAMES[path]]
            continue
        rel = path.removeprefix(ours_at)
        if rel.startswith("encoder/layers/"):
            module, leaf = rel.removeprefix("encoder/layers/").rsplit("/", 1)
            table[path] = [f"{hf_encoder_prefix}encoder.layer.{i}.{LAYER_NAMES[module]}.{_LEAF[leaf]}"
                           for i in range(num_layers - value.shape[0], num_layers)]
        else:
            table[path] = [hf_encoder_prefix + ENCODER_NAMES[rel]]
    return table


def model_config_from_hf(hf: dict[str, Any], name: str | None = None, use_pooler: bool = True
                         ) -> dict[str, Any]:
    """Our `model` config section (hf_family included) from a HF config.json of a family
    convert knows (config.json's model_type; none: BERT, as Google's bert_config.json)."""
    family = families.for_model_type(hf.get("model_type", "bert"))
    return family.config_from_hf(hf, name or choose_head(hf, ()), use_pooler)


def hf_config(model_cfg: dict[str, Any], special_ids: dict[str, int] | None = None
              ) -> dict[str, Any]:
    """The HF config.json of our `model` config section (the inverse of model_config_from_hf),
    as its model.hf_family writes it; `special_ids`: the tokenizer's pad, cls and sep ids where
    known. A model HF cannot express is a ValueError naming the field."""
    name, cfg = models.split_model_config(model_cfg)
    if name not in BERT_MODELS:
        raise ValueError(f"model.name={name!r} has no Hugging Face BERT equivalent; exportable: "
                         f"{sorted(BERT_MODELS)}")
    ids, family = special_ids or {}, families.get(cfg.hf_family)
    if bad := family.misfits(cfg, ids):
        raise ValueError(f"this model cannot be written as a Hugging Face {family.title}: " + "; ".join(bad))
    return family.config_to_hf(name, cfg, ids)


def architectures(hf: dict[str, Any]) -> list[str]:
    """config.json's architectures (HF class names); not a list of names is a ValueError."""
    archs = hf.get("architectures") or []
    if not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise ValueError(f"config.json: architectures={archs!r}, expected a list of Hugging Face "
                         'class names, e.g. ["BertForMaskedLM"]; use the config.json that came with '
                         "the weights")
    return archs


def choose_head(hf: dict[str, Any], names: Iterable[str], name: str | None = None) -> str:
    """Our model name: `name` if given, else config.json's architecture, else what the tensor
    `names` (normalised) hold: an unknown or absent architecture does not stop a conversion."""
    if name is not None:
        if name not in BERT_MODELS:
            raise ValueError(f"--head={name!r}; choose one of {sorted(BERT_MODELS)}")
        return name
    archs, known = architectures(hf), families.architectures()
    if archs and archs[0] in known:
        return known[archs[0]]
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
                    f"the tensors); pass --head with one of {sorted(BERT_MODELS)} to choose")
    return guess


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
    """(params, missing, unused): params for `model_cfg` filled from tensors under BERT's names
    (relative to the encoder: a family's from_hf); `missing` names our parameters the
    checkpoint lacks (left freshly initialised), `unused` the tensors nothing took.
    `file_names`: the checkpoint's name of each tensor, for errors and reports."""
    shown = {k: (file_names or {}).get(k, k) for k in weights}
    kinds = {k: np.asarray(v).dtype for k, v in weights.items()}
    weights = {k: np.asarray(v, np.float32) for k, v in weights.items()}
    broken = [(shown[k], int(np.size(v) - np.isfinite(v).sum())) for k, v in weights.items()
              if not np.isfinite(v).all()]
    if broken:  # a damaged file (or a diverged run): its numbers would train nothing
        (name, count), more = broken[0], len(broken) - 1
        raise ValueError(f"tensor {name} holds {count} NaN or infinite values"
                         + (f" (and {more} more tensors)" if more else "")
                         + "; the weights file is damaged or the model diverged: download it again")
    # Shapes only: a fresh model is initialised (an eager program per parameter shape) only
    # when the checkpoint lacks a parameter, to fill it.
    abstract = nnx.to_pure_dict(nnx.state(models.abstract_model(model_cfg), nnx.Param))
    flat = traverse_util.flatten_dict(abstract, sep="/")
    fresh: dict[str, Any] = {}
    table = hf_names(model_cfg["name"], flat, model_cfg["num_layers"])
    if "mlm/bias" in flat and "cls.predictions.bias" not in weights:
        table["mlm/bias"] = ["cls.predictions.decoder.bias"]  # older checkpoints keep it there
    # Integer weights are a quantized checkpoint's (int8 and scales): as numbers they are not the
    # model's (the integer buffers beside the weights, e.g. position_ids, are no parameter's).
    if whole := [n for names in table.values() for n in names if n in kinds and kinds[n].kind in "iub"]:
        raise ValueError(f"tensor {shown[whole[0]]} is {kinds[whole[0]]}, not floating point: a "
                         "quantized checkpoint, whose integers are not the model's weights; convert "
                         "the model's unquantized (float32, float16 or bfloat16) weights")
    used, missing, out = set(), [], {}
    for path, value in flat.items():
        names = table[path]
        if not all(n in weights for n in names):
            missing.append(path)
            fresh = fresh or traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(
                models.create_model(model_cfg, seed=seed), nnx.Param)), sep="/")
            out[path] = np.asarray(fresh[path])
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


# Sizes config.json states that a tensor's shape shows: (BERT's tensor name, axis, our model
# field, config.json's key).
EVIDENCE = (
    ("embeddings.word_embeddings.weight", 0, "vocab_size", "vocab_size"),
    ("embeddings.word_embeddings.weight", 1, "emb_dim", "hidden_size"),
    ("embeddings.position_embeddings.weight", 0, "max_len", "max_position_embeddings"),
    ("embeddings.token_type_embeddings.weight", 0, "type_vocab_size", "type_vocab_size"),
    ("encoder.layer.0.intermediate.dense.weight", 0, "mlp_dim", "intermediate_size"),
)
# A layer's index in any family's tensor names (BERT's and RoBERTa's encoder.layer.{i}.,
# ModernBERT's layers.{i}.).
_LAYER = re.compile(r"(?:^|\.)layers?\.(\d+)\.")


def check_config_sizes(weights: dict[str, np.ndarray], model_cfg: dict[str, Any],
                       file_names: dict[str, str], config_file: object) -> None:
    """config.json's sizes against the tensors' shapes (`weights` under BERT's names,
    `file_names`: {BERT name: the checkpoint's name} of every tensor in the checkpoint), and
    its layer count against the layers the tensors hold: a contradiction is a ValueError
    naming both sides."""
    def refuse(said: str, shown: str) -> ValueError:
        return ValueError(f"{config_file}: {said} but {shown}; the config does not belong to these "
                          "weights: use the config.json that came with them")

    for name, axis, field, key in EVIDENCE:
        tensor = weights.get(name)
        if tensor is None or tensor.ndim != 2 or tensor.shape[axis] == model_cfg[field]:
            continue
        raise refuse(f"{key}={model_cfg[field]}", f"{file_names.get(name, name)} has shape "
                     f"{tuple(tensor.shape)} ({tensor.shape[axis]} {'rows' if axis == 0 else 'columns'})")
    layers = {int(m.group(1)) for n in file_names.values() if (m := _LAYER.search(n))}
    if layers and max(layers) + 1 != model_cfg["num_layers"]:
        count = max(layers) + 1
        raise refuse(f"num_hidden_layers={model_cfg['num_layers']}", f"the weights hold {count} "
                     f"layer{'s' if count > 1 else ''} (0 to {count - 1})")


def check_padding_row(weights: dict[str, np.ndarray], model_cfg: dict[str, Any],
                      file_names: dict[str, str], config_file: object) -> None:
    """Positions after the pad id (RoBERTa's: model.position_offset = pad id + 1) have the
    pad id's row of the position table as their padding row, which the HF classes create
    and keep at zero (nn.Embedding's padding_idx): an all-zero row elsewhere and not there is
    a config.json whose pad_token_id does not belong to these weights (positions would be
    shifted by the difference)."""
    offset, name = model_cfg["position_offset"], "embeddings.position_embeddings.weight"
    table = weights.get(name)
    if table is None or table.ndim != 2:
        return
    zero = [i for i in range(table.shape[0]) if not np.any(table[i])]
    if not offset:  # positions from row 0: a padding row marks a table read after a pad id
        if len(zero) == 1 and table.shape[0] > 1:
            raise ValueError(f"{config_file}: model_type={model_cfg['hf_family']!r} reads positions "
                             f"from row 0 of {file_names.get(name, name)}, but its row {zero[0]} is "
                             f"all zero: a padding row, as a RoBERTa's (positions after pad_token_id="
                             f"{zero[0]}); use the config.json that came with these weights")
        return
    if zero and offset - 1 not in zero:
        raise ValueError(f"{config_file}: pad_token_id={offset - 1} makes row {offset - 1} of "
                         f"{file_names.get(name, name)} the padding row, but the table's all-zero "
                         f"(padding) row is {zero[0]}: the config's pad_token_id does not belong to "
                         f"these weights; use the config.json that came with them "
                         f"(pad_token_id={zero[0]})")


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


_CONFIG_WHAT = "expected the model's BERT config"


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
        hf = paths.read_json(config_file, _CONFIG_WHAT)
        try:
            kind = families.for_model_type(hf.get("model_type", "bert")).tokenizer
        except ValueError:  # (convert_hf names the model_type)
            kind = "wordpiece"
        return (hf, load_hf_weights(folder), tokenizer_lib.load_hf_tokenizer(folder, kind), f"hf:{folder}")
    config_file = prefix.parent / "bert_config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file}: not found; put the model's bert_config.json "
                                f"beside the checkpoint {prefix}")
    weights = read_tf_checkpoint(prefix, keep=lambda n: not _TF_SKIP.search(n))
    # The original release has no tokenizer_config.json: casing follows the vocabulary (cased
    # models have uppercase tokens), which load_tokenizer infers.
    return (paths.read_json(config_file, _CONFIG_WHAT), tf_to_hf(weights),
            tokenizer_lib.load_tokenizer(prefix.parent), f"tf:{prefix}")


def _config_file(origin: str) -> Path:
    """The config file of source `origin` ("hf:<folder>" or "tf:<prefix>", as read_source says)."""
    where = Path(origin[3:])
    return where / "config.json" if origin.startswith("hf:") else where.parent / "bert_config.json"


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


def check_tokenizer_json(tokenizer: tokenizer_lib.Tokenizer) -> None:
    """Where an HF folder's vocab.txt, which convert reads, has a tokenizer.json beside it (what
    transformers' AutoTokenizer loads first): the two must be one tokenizer, WordPiece with the
    same token at every id, or the converted model would tokenize otherwise than the HF one.
    One that is not (unreadable, another model type, a token missing, an id repeated, out of
    range or on another token) is a ValueError naming the file, the field and the token."""
    path = tokenizer.vocab_file.with_name(tokenizer_lib.BPE_JSON)
    if tokenizer.kind != "wordpiece" or tokenizer.vocab_file.name != tokenizer_lib.VOCAB_NAME \
            or not path.is_file():
        return
    vocab_file, pieces = tokenizer.vocab_file, tokenizer.pieces
    advice = (f"transformers loads {path.name} before {vocab_file.name}, so the two must be one "
              f"tokenizer: use the files that came with the model (download them again), or remove "
              f"the one that is not the model's")
    state = tokenizer_json_state(path)
    kind = state["model"]["type"]
    if kind != "WordPiece":
        raise ValueError(f"{path}: model.type={kind!r}, but {vocab_file} is a WordPiece vocab; {advice}")
    ids = state["model"].get("vocab")
    added = state.get("added_tokens") or []
    if not isinstance(ids, dict) or not isinstance(added, list) or not all(
            isinstance(a, dict) for a in added):
        raise ValueError(f"{path}: model.vocab is not an object of tokens and ids, or added_tokens "
                         f"not a list of objects; {advice}")
    entries = [("model.vocab", t, i) for t, i in ids.items()]
    entries += [("added_tokens", a.get("content"), a.get("id")) for a in added]
    added_ids: dict[int, str] = {}
    # Tokens added after the vocab (tokenizer.add_tokens, then save_pretrained) sit past
    # vocab.txt's ids, in the rows the model's table grew by: transformers' tokenizer produces
    # them, ours (reading vocab.txt) splits them as text. Said, not refused.
    def past(field, i) -> bool:
        return field == "added_tokens" and type(i) is int and i >= len(pieces)

    if beyond := [token for field, token, i in entries if past(field, i)]:
        log.warning(f"warning: {path}: added_tokens: {len(beyond)} token(s) past {vocab_file}'s "
                    f"{len(pieces)} (e.g. {beyond[0]!r}): bert_jax's tokenizer reads "
                    f"{vocab_file.name}, so it splits them as ordinary text; their rows of the "
                    "embedding table are converted all the same")
        entries = [(field, token, i) for field, token, i in entries if not past(field, i)]
    for field, token, i in entries:
        if type(i) is not int or not 0 <= i < len(pieces):
            raise ValueError(f"{path}: {field}: {token!r} has the id {i!r}, outside {vocab_file}'s "
                             f"{len(pieces)} tokens (ids 0 to {len(pieces) - 1}); {advice}")
        if field == "added_tokens" and added_ids.setdefault(i, token) != token:
            raise ValueError(f"{path}: added_tokens: {added_ids[i]!r} and {token!r} both have the "
                             f"id {i}; {advice}")
        if pieces[i] != token:
            raise ValueError(f"{path}: {field}: {token!r} has the id {i}, but line {i + 1} of "
                             f"{vocab_file} is {pieces[i]!r}; {advice}")
    known = set(ids) | set(added_ids.values())
    lacking = [(line, t) for line, t in enumerate(pieces, 1) if t not in known]
    if lacking:
        line, token = lacking[0]
        raise ValueError(f"{path}: model.vocab lacks {token!r} (line {line} of {vocab_file}; "
                         f"{len(lacking)} token(s) missing); {advice}")


def warn_repeated_tokens(tokenizer: tokenizer_lib.Tokenizer) -> None:
    """One warning where a WordPiece vocab.txt has a token on two lines: not refused, as some
    published vocabs have one and transformers reads it the same way (the earlier line's row of
    the embedding table is then reached by no token), but a vocab.txt edited by hand, or another
    model's, shows so: its vectors would be wrong."""
    if tokenizer.vocab_file.name != tokenizer_lib.VOCAB_NAME:
        return
    first: dict[str, int] = {}
    twice = [(line, first[t], t) for line, t in enumerate(tokenizer.pieces, 1)
             if first.setdefault(t, line) != line]
    if twice:
        line, earlier, token = twice[0]
        log.warning(f"warning: {tokenizer.vocab_file}:{line}: {token!r} again (line {earlier}; "
                    f"{len(twice)} repeated line(s)), so row {earlier - 1} of the embedding table "
                    "is reached by no token; if this is not the vocab.txt that came with the "
                    "weights, the vectors will be wrong: use the model's own")


# A published embedding table may have more rows than its tokenizer has tokens: padded up to a
# multiple of 64 or 128 for the matrix units (ModernBERT: 50,368 rows for 50,285 tokens). More
# rows without a token than that padding leaves is said, not refused: a model trained with a
# table larger than its vocab (ours, `model.vocab_size` 4,096 with a 1,500-token vocab, exports
# so) looks the same as a vocab cut short or taken from another model (1,000 of BERT's 30,522).
PADDING_ROWS = 128


def warn_unused_rows(tokenizer: tokenizer_lib.Tokenizer, vocab_size: int, config_file) -> None:
    """One warning where the tokenizer leaves PADDING_ROWS or more of the table's rows without
    a token, naming both files and counts."""
    unused = vocab_size - tokenizer.vocab_size
    if unused >= PADDING_ROWS:
        log.warning(f"warning: {tokenizer.vocab_file} has {tokenizer.vocab_size} tokens but "
                    f"{config_file} says vocab_size={vocab_size}: {unused} rows of the embedding "
                    f"table have no token, more than a published table's padding (at most "
                    f"{PADDING_ROWS - 1}); fine for a model trained with a larger table, but if "
                    f"this {tokenizer.vocab_file.name} is not the one that came with the weights "
                    f"(cut, or another model's), the vectors will be wrong: use the model's own")


def convert_hf(source: str | os.PathLike, out: str | os.PathLike, name: str | None = None,
               *, check_model: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Converts a HF BERT folder or cache entry, or an original TF BERT checkpoint, into a
    bert_jax checkpoint directory (either may be local or gs://); returns a report.
    `check_model(model config)`: a caller's check of the model, before anything is written."""
    out = paths.path(out)
    if checkpoint.checkpoint_dir(out).exists():
        raise FileExistsError(f"{out}: already holds checkpoints; choose a new output folder")
    paths.check_new_folder(out, "<out_dir>")  # (a vocab, another model's files: never replaced)
    with _local_source(source) as local:
        hf_cfg, weights, tokenizer, origin = read_source(local)
        source_options = Path(origin[3:]) / tokenizer_lib.CONFIG_NAME if origin.startswith("hf:") else None
        if local != source:  # name the source, not its temporary copy
            origin = origin[:3] + str(source) + origin[3 + len(str(local)):]
        try:
            family = families.for_model_type(hf_cfg.get("model_type", "bert"))
            architectures(hf_cfg)  # (choose_head reads them)
        except ValueError as e:
            raise ValueError(f"{origin[3:]}: {e}") from None
        names = {family.normalise(k): k for k in weights}
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
        family.check_weights(weights, _config_file(origin))  # (config.json's own errors first)
        if check_model is not None:
            check_model(model_cfg)
        if tokenizer.vocab_size > model_cfg["vocab_size"]:
            raise ValueError(f"{tokenizer.vocab_file} has {tokenizer.vocab_size} tokens but the model "
                             f"config says vocab_size={model_cfg['vocab_size']}; use the "
                             f"{tokenizer.vocab_file.name} that came with the model")
        check_tokenizer_json(tokenizer)
        warn_repeated_tokens(tokenizer)
        warn_unused_rows(tokenizer, model_cfg["vocab_size"], _config_file(origin))
        if missing_tokens := tokenizer.missing():  # every input would fail, after the conversion
            raise ValueError(f"{tokenizer.vocab_file}: the vocab lacks {', '.join(missing_tokens)}, "
                             "which every input of this model holds; use the "
                             f"{tokenizer.vocab_file.name} that came with the model")
        if name == "bert_pretraining" and (no_mask := tokenizer.missing(("[MASK]",))):
            raise ValueError(f"{tokenizer.vocab_file}: the vocab has no mask token ({no_mask[0]}), "
                             f"which this masked-LM model ({', '.join(architectures(hf_cfg)) or name}) is "
                             f"trained to fill; use the tokenizer files that came with the model, "
                             f"or convert its encoder alone with --head bert")
        in_file = list(weights)
        weights, file_names = family.from_hf(weights, name, model_cfg["num_layers"])
        # (the tensors from_hf did not take too: a layer past the config's count)
        check_config_sizes(weights, model_cfg, {**{n: n for n in in_file}, **file_names},
                           _config_file(origin))
        check_padding_row(weights, model_cfg, file_names, _config_file(origin))
        try:
            params, missing, unused = convert_hf_weights(weights, model_cfg, file_names=file_names)
        except ValueError as e:  # (it names the tensor: say whose)
            raise ValueError(f"{origin[3:]}: {e}") from None
        encoder = "".join(f"{k}/" for k in models.encoder_path(name))
        essential = [p for p in missing if p.startswith(encoder) and p.removeprefix(encoder) not in _POOLER]
        if essential:
            raise ValueError(f"{origin[3:]}: encoder weights missing from the checkpoint: {essential}")
        checkpoint.save_params(out, 0, params, {"model": model_cfg, "source": origin})
        tokenizer.save(out)
        if source_options is not None and source_options.is_file():  # for export, as it was
            paths.copy_file(source_options, paths.path(out) / tokenizer_lib.HF_SOURCE_NAME)
        return {"model": name, "missing": missing, "unused": unused, "out": str(out), "source": origin}
