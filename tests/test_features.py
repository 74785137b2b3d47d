"""`features` (extract_features) on a checkpoint whose tokenizer is SentencePiece, in-process."""

import json

import numpy as np
from flax import nnx

from bert_jax import models
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.interop import features
from bert_jax.training import checkpoint

MAX_LEN = 64


def test_features_on_a_sentencepiece_checkpoint(tmp_path, english_lines):
    spm_dir = tokenizer_lib.train_vocab(english_lines, size=400, kind="sentencepiece",
                                        out_dir=tmp_path / "spm", lowercase=False)
    tok = tokenizer_lib.load_tokenizer(spm_dir)
    cfg = dict(name="bert", vocab_size=tok.vocab_size, emb_dim=16, num_layers=2, num_heads=2,
               head_dim=8, mlp_dim=32, max_len=MAX_LEN)
    params = nnx.to_pure_dict(nnx.state(models.create_model(cfg), nnx.Param))
    ckpt = tmp_path / "ckpt"  # a training workdir's layout: checkpoints/ plus the tokenizer files
    checkpoint.save_params(ckpt, 0, params, {"model": cfg})
    assert "spm.model" in tokenizer_lib.copy_tokenizer(spm_dir, ckpt)
    lines = [english_lines[0][:60], f"{english_lines[1][:30]} ||| {english_lines[2][:30]}", ""]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", "utf-8")

    n = features.extract_features(ckpt, tmp_path / "in.txt", tmp_path / "f.jsonl", layers=(-1, 0),
                                  max_seq_length=MAX_LEN, batch_size=2)
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
