"""`features` (extract_features) on a checkpoint whose tokenizer is SentencePiece, in-process;
what it and `attention` say when they cut a long input, and what features refuses."""

import json
import logging

import numpy as np
import pytest
from flax import nnx

from bert_jax import models
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.interop import features
from bert_jax.training import checkpoint
from bert_jax.viz import attention_maps

MAX_LEN = 64


@pytest.fixture(scope="module")
def spm_checkpoint(tmp_path_factory, english_lines):
    """A tiny BERT's checkpoint (a training workdir's layout: checkpoints/ plus the tokenizer
    files) with a SentencePiece tokenizer."""
    tmp = tmp_path_factory.mktemp("features")
    spm_dir = tokenizer_lib.train_vocab(english_lines, size=400, kind="sentencepiece",
                                        out_dir=tmp / "spm", lowercase=False)
    tok = tokenizer_lib.load_tokenizer(spm_dir)
    cfg = dict(name="bert", vocab_size=tok.vocab_size, emb_dim=16, num_layers=2, num_heads=2,
               head_dim=8, mlp_dim=32, max_len=MAX_LEN)
    params = nnx.to_pure_dict(nnx.state(models.create_model(cfg), nnx.Param))
    checkpoint.save_params(tmp / "ckpt", 0, params, {"model": cfg})
    assert "spm.model" in tokenizer_lib.copy_tokenizer(spm_dir, tmp / "ckpt")
    return tmp / "ckpt"


def test_features_on_a_sentencepiece_checkpoint(tmp_path, english_lines, spm_checkpoint, caplog):
    ckpt, tok = spm_checkpoint, tokenizer_lib.load_tokenizer(spm_checkpoint)
    lines = [english_lines[0][:60], f"{english_lines[1][:30]} ||| {english_lines[2][:30]}", ""]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", "utf-8")

    with caplog.at_level(logging.WARNING):
        n = features.extract_features(ckpt, tmp_path / "in.txt", tmp_path / "f.jsonl", layers=(-1, 0),
                                      max_seq_length=MAX_LEN, batch_size=2)
    assert "cut" not in caplog.text  # nothing cut: nothing said
    records = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text("utf-8").splitlines()]
    assert n == len(records) == 3 and [r["linex_index"] for r in records] == [0, 1, 2]
    ids_of = {piece: i for i, piece in enumerate(tok.pieces)}
    for record, line in zip(records, lines):
        a, sep, b = line.partition(" ||| ")
        tokens = [f["token"] for f in record["features"]]
        assert tokens == tok.encode_pair(a, b if sep else None, MAX_LEN).tokens
        assert len(tokens) < MAX_LEN  # not truncated, so the tokens give back the whole line
        ids = [ids_of[t] for t in tokens]
        parts = ["[CLS]", a, "[SEP]", *([b, "[SEP]"] if sep else [])]
        assert tok.decode(ids) == " ".join(p for p in parts if p)  # the empty line: "[CLS] [SEP]"
        values = np.array([[layer["values"] for layer in f["layers"]] for f in record["features"]])
        assert values.shape == (len(tokens), 2, 16) and np.isfinite(values).all()
        assert [layer["index"] for layer in record["features"][0]["layers"]] == [-1, 0]


def test_features_says_how_many_inputs_it_cut(tmp_path, english_lines, spm_checkpoint, caplog):
    tok = tokenizer_lib.load_tokenizer(spm_checkpoint)
    long_line = " ".join(english_lines[:3])
    longest = len(tok.encode_pair("short", long_line).tokens)
    lines = ["a short line", long_line, f"short ||| {long_line}"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", "utf-8")
    with caplog.at_level(logging.WARNING):
        features.extract_features(spm_checkpoint, tmp_path / "in.txt", tmp_path / "f.jsonl",
                                  layers=(-1,), max_seq_length=16)
    assert (f"in.txt: 2 of 3 inputs are longer than --max_seq_length=16 tokens (the longest: "
            f"{longest}) and were cut to 16; raise --max_seq_length (the model's position table "
            f"takes up to {MAX_LEN})") in caplog.text
    records = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text("utf-8").splitlines()]
    assert [len(r["features"]) for r in records] == [len(tok.encode_pair(lines[0]).tokens), 16, 16]
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # at the position table: nothing more to raise
        features.extract_features(spm_checkpoint, tmp_path / "in.txt", tmp_path / "f2.jsonl",
                                  layers=(-1,), max_seq_length=MAX_LEN)
    assert f"were cut to {MAX_LEN}; the model takes no more than {MAX_LEN} tokens" in caplog.text


def test_features_never_overwrites_its_output(tmp_path, spm_checkpoint):
    (tmp_path / "in.txt").write_text("the cat sat\n", "utf-8")
    (tmp_path / "f.jsonl").write_text("earlier features\n", "utf-8")
    with pytest.raises(FileExistsError, match=r"--output=.*f\.jsonl: already exists"):
        features.extract_features(spm_checkpoint, tmp_path / "in.txt", tmp_path / "f.jsonl")
    assert (tmp_path / "f.jsonl").read_text("utf-8") == "earlier features\n"


def test_attention_says_when_it_cuts_the_text(english_lines, spm_checkpoint, caplog):
    tok = tokenizer_lib.load_tokenizer(spm_checkpoint)
    text = " ".join(english_lines[:3])
    full = len(tok.encode_pair(text).tokens)
    with caplog.at_level(logging.WARNING):
        result = attention_maps.compute(str(spm_checkpoint), text, max_len=1000)
    assert len(result["maps"]["self-attention"]["keys"]) == MAX_LEN
    assert (f"--text: the input is {full} tokens; the maps show its first {MAX_LEN} "
            f"(--max_seq_length=1000); the model takes no more") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        attention_maps.compute(str(spm_checkpoint), text, max_len=16)
    assert f"show its first 16 (--max_seq_length=16); raise --max_seq_length to see more (up to {MAX_LEN})" \
        in caplog.text


@pytest.mark.parametrize("layers, said", [
    (None, "--layers is not given and its default -1,-2,-3,-4 asks for 4 layers; the model in ck "
           "has 2: give --layers (use -2..1, e.g. --layers=-1)"),
    ((-1, 2), "--layers: 2 is out of range for a 2-layer model (use -2..1)"),
    ((-1, 1), "--layers: -1 and 1 are the same layer of a 2-layer model; name each layer once"),
])
def test_layers_beyond_the_model_or_named_twice_are_refused(layers, said):
    with pytest.raises(ValueError, match="^" + said.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        features.check_layers(layers, 2, "ck")


def test_the_default_layers_fit_a_model_of_four():
    features.check_layers(None, 4, "ck")  # no error: -1..-4 are the four layers
