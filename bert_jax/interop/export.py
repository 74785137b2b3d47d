"""Export to a Hugging Face folder (`bert-jax export <checkpoint_dir> hf:<out_dir>`): config.json,
model.safetensors and the WordPiece tokenizer (vocab.txt, tokenizer_config.json,
special_tokens_map.json, tokenizer.json) as a published BERT checkpoint has them, so that
transformers' `from_pretrained` loads the model and its fast and slow tokenizers the same as
the original's. The model's family (model.hf_family; interop/families) picks the classes: a
RoBERTa is written as transformers' RoBERTa classes with its byte-level BPE tokenizer
(tokenizer.json, vocab.json, merges.txt), a ModernBERT as transformers' ModernBERT classes with
its tokenizer.json (BPE, or WordPiece with vocab.txt); any switch the family's classes cannot
express is an error naming the field.

The source is a `bert-jax convert` output or a training workdir (same layout); names go
through convert.py's table, the one both directions share.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy
from flax import nnx, traverse_util
from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers import models as tokenizer_models

from bert_jax import models, paths
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.interop import families
from bert_jax.interop.convert import hf_config, hf_names
from bert_jax.training import checkpoint, state

log = logging.getLogger(__name__)


def hf_state_dict(model_cfg: dict[str, Any], params: dict) -> dict[str, np.ndarray]:
    """{HF tensor name: float32 array} of our params (torch layout: Linear weights [out, in]),
    named as the class of its family (model.hf_family) names them."""
    name = model_cfg["name"]
    flat = traverse_util.flatten_dict(params, sep="/")
    out = {}  # under BERT's names relative to the encoder, until the family renames them
    for path, names in hf_names(name, flat, model_cfg["num_layers"]).items():
        value = np.asarray(flat[path], np.float32)
        stacked = "encoder/layers/" in path  # [L, ...]: one HF tensor per layer
        for i, hf_name in enumerate(names):
            v = value[i] if stacked else value
            if path.endswith("kernel"):  # ours [in, out...]; the attention output's [N, K, out]
                n_out = v.shape[-1] if path.endswith("attention/out/kernel") else int(np.prod(v.shape[1:]))
                v = v.reshape(-1, n_out).T
            elif not path.endswith("embedding"):  # biases, e.g. the query's [N, K], and scales
                v = v.reshape(-1)
            out[hf_name] = np.ascontiguousarray(v)
    # As transformers saves it: the MLM decoder (tied to the word embeddings and to
    # cls.predictions.bias) is left out.
    return families.get(model_cfg["hf_family"]).to_hf(out, name, model_cfg["num_layers"])


# tokenizer_config.json's names of the special tokens, as HF's BertTokenizer takes them.
SPECIAL_KEYS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def hf_tokenizer_json(vocab: list[str], options: dict[str, Any]) -> Tokenizer:
    """The fast tokenizer (tokenizer.json) a published BERT checkpoint carries, for `vocab` and
    the tokenizer_config.json `options`: what transformers' BERT converter builds."""
    ids = {token: i for i, token in enumerate(vocab)}  # later duplicates win, as HF's load_vocab
    tok = Tokenizer(tokenizer_models.WordPiece(ids, unk_token=options["unk_token"],
                                               continuing_subword_prefix="##",
                                               max_input_chars_per_word=100))
    # As published: one BertNormalizer, no NFC step (our tokenizer and HF's slow one compose
    # first, so they can differ from any published fast tokenizer on non-NFC text).
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=options["tokenize_chinese_chars"],
        strip_accents=options["strip_accents"], lowercase=options["do_lower_case"])
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = options["cls_token"], options["sep_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, ids[cls]), (sep, ids[sep])])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    specials = sorted({options[k] for k in SPECIAL_KEYS if options.get(k) in ids}, key=ids.get)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def write_hf_tokenizer(tokenizer: tokenizer_lib.Tokenizer, model_max_length: int,
                       directory: os.PathLike) -> None:
    """Writes a WordPiece tokenizer into a local folder as a published BERT checkpoint has it."""
    directory = paths.path(directory)
    tokenizer.save(directory)  # vocab.txt and a tokenizer_config.json stating every option
    config_file = directory / tokenizer_lib.CONFIG_NAME
    options = json.loads(config_file.read_text("utf-8"))
    # Without model_max_length transformers assumes 1e30, and truncation=True cuts nothing.
    # clean_up_tokenization_spaces as the published BERT checkpoints set it ("life's", not
    # "life ' s"); transformers' default for it has changed between versions.
    options.update(model_max_length=model_max_length, clean_up_tokenization_spaces=True)
    config_file.write_text(json.dumps(options, indent=2) + "\n", "utf-8")
    specials = {k: options[k] for k in SPECIAL_KEYS if options.get(k) in tokenizer.pieces}
    (directory / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n", "utf-8")
    hf_tokenizer_json(tokenizer.pieces, options).save(str(directory / "tokenizer.json"))


_TOKENIZER_NAMES = {"wordpiece": "a WordPiece vocab.txt", "sentencepiece": "a SentencePiece model",
                    "bpe": "a byte-level BPE tokenizer"}


def write_hf_bpe_tokenizer(tokenizer: tokenizer_lib.Tokenizer, model_max_length: int,
                           directory: os.PathLike) -> None:
    """Writes a byte-level BPE tokenizer into a local folder as a published RoBERTa has it."""
    directory = paths.path(directory)
    tokenizer.save(directory)  # tokenizer.json, vocab.json, merges.txt, tokenizer_config.json
    (directory / tokenizer_lib.META_NAME).unlink()  # transformers' folder, as transformers writes one
    config_file = directory / tokenizer_lib.CONFIG_NAME
    options = json.loads(config_file.read_text("utf-8"))
    options["model_max_length"] = model_max_length  # else transformers assumes 1e30
    config_file.write_text(json.dumps(options, indent=2) + "\n", "utf-8")
    specials = {k: v for k, v in options.items() if k.endswith("_token")}
    (directory / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n", "utf-8")


# What a converted Hugging Face folder's tokenizer_config.json said about decoding and length,
# written back as it was (set or left out): transformers 5 decodes "it ' s" without
# clean_up_tokenization_spaces and "it's" with it, and cuts at model_max_length.
SOURCE_SETTINGS = ("clean_up_tokenization_spaces", "model_max_length")


def keep_source_settings(source_file: os.PathLike, directory: os.PathLike) -> None:
    """The exported tokenizer_config.json (and special_tokens_map.json) in `directory` with the
    source folder's SOURCE_SETTINGS and special tokens, so the export tokenizes and decodes as
    the folder it was converted from."""
    source = paths.read_json(source_file, "the tokenizer_config.json kept from the converted folder")
    config_file = paths.path(directory) / tokenizer_lib.CONFIG_NAME
    options = json.loads(config_file.read_text("utf-8"))
    for key in SOURCE_SETTINGS:
        if key in source:
            options[key] = source[key]
        else:
            options.pop(key, None)
    specials = {k: v for k, v in source.items() if k in options and k.endswith("_token")}
    options.update(specials)
    config_file.write_text(json.dumps(options, indent=2) + "\n", "utf-8")
    specials_file = paths.path(directory) / "special_tokens_map.json"
    if specials and specials_file.is_file():
        written = json.loads(specials_file.read_text("utf-8"))
        written.update({k: v for k, v in specials.items() if k in written})
        specials_file.write_text(json.dumps(written, indent=2) + "\n", "utf-8")


def save_safetensors(tensors: dict[str, Any], path: Path) -> None:
    """Writes `tensors` as a safetensors file with the mode any other file gets (0666 less the
    umask): the safetensors library writes through a private temporary file (mode 0600), and
    a folder exported to share must be readable by those the umask lets read it."""
    # transformers refuses safetensors files without format metadata.
    safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def export_hf(source: str | os.PathLike, out: str | os.PathLike, step: int | None = None
              ) -> dict[str, Any]:
    """Writes checkpoint `step` (latest by default) of `source` as a Hugging Face folder `out`;
    returns a report. `source` and `out` may be local or gs:// (the files are written locally,
    then uploaded)."""
    paths.check_new_folder(out, "<out_dir>")
    out = paths.path(out)
    model_cfg = models.complete_model_config(checkpoint.read_config(source, step)["model"])
    name = model_cfg["name"]
    try:
        tokenizer = tokenizer_lib.load_tokenizer(source)
    except FileNotFoundError:
        tokenizer = None
    family = families.get(model_cfg.get("hf_family", "bert"))  # (a transformer: hf_config says)
    # The tokenizer HF's class of this model reads: WordPiece for BERT, byte-level BPE for RoBERTa,
    # the tokenizer.json of either for ModernBERT.
    written = tokenizer is not None and tokenizer.kind in family.tokenizers
    kind = tokenizer.kind if written else family.tokenizers[0]
    ids = {"pad": tokenizer.pad_id} if tokenizer else {}
    if written:  # (RoBERTa's and ModernBERT's config.json name these too)
        ids.update(cls=tokenizer.cls_id, sep=tokenizer.sep_id)
    _, model = state.load_model(source, step, model_cfg)
    # A model HF has no class for (bert_embedding, whose sentence-transformers folder holds
    # its encoder as the Transformer module): the encoder, bare.
    bare = name not in family.architectures and bool(models.encoder_path(name))
    if bare:
        model = functools.reduce(getattr, models.encoder_path(name), model)
        model_cfg = models.model_section("bert", {k: v for k, v in model_cfg.items() if k != "name"},
                                         use_pooler=False)
        name = "bert"
    config = hf_config(model_cfg, ids)
    architecture = config["architectures"][0]
    if name == "bert" and not bare and not model_cfg["use_pooler"] and family.pooler:
        log.warning(f"warning: this encoder has no pooler; transformers' {architecture} will "
                    "initialise one (pooler_output is meaningless, last_hidden_state is exact)")
    if name == "bert_pretraining" and not family.nsp:
        log.warning(f"warning: {architecture} has no NSP head and no pooler; they are left out")
    tensors = hf_state_dict(model_cfg, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    with paths.staged_output(out) as local:
        local.mkdir(parents=True, exist_ok=True)
        (local / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_safetensors(tensors, local / "model.safetensors")
        if written and kind == "wordpiece":
            write_hf_tokenizer(tokenizer, config["max_position_embeddings"], local)
        elif written:
            write_hf_bpe_tokenizer(tokenizer, model_cfg["max_len"] - model_cfg["position_offset"], local)
        if written and family.tokenizer_options:
            config_file = local / tokenizer_lib.CONFIG_NAME
            options = json.loads(config_file.read_text("utf-8"))
            options.update(family.tokenizer_options)
            config_file.write_text(json.dumps(options, indent=2) + "\n", "utf-8")
        if written and (paths.path(source) / tokenizer_lib.HF_SOURCE_NAME).is_file():
            keep_source_settings(paths.path(source) / tokenizer_lib.HF_SOURCE_NAME, local)
    if not written:
        what = _TOKENIZER_NAMES[tokenizer.kind] if tokenizer else "no tokenizer"
        log.warning(f"warning: {source} has {what}; {out} gets no tokenizer files (HF {family.title} "
                    f"reads {_TOKENIZER_NAMES[kind]})")
    return {"architecture": architecture, "out": str(out), "tensors": len(tensors),
            "tokenizer": written}
