"""`bert-jax vocab` and `prepare`: a vocabulary learned from text, a corpus tokenized into shards."""

from __future__ import annotations

import json

from bert_jax.commands.options import CONFIG, INPUT, LOWERCASE, OUT, SIZE, SP_MODEL, TYPE, require


def cmd_vocab(args: list[str]) -> None:
    """Trains a WordPiece or SentencePiece vocabulary on text files or a TFDS dataset."""
    from bert_jax import paths
    from bert_jax.data import sources
    from bert_jax.data import tokenizer as tokenizer_lib

    out_dir = require(OUT, "vocab")
    if found := [n for n in tokenizer_lib.TOKENIZER_FILES if (paths.path(out_dir) / n).is_file()]:
        raise ValueError(f"--out {out_dir} already holds a vocab ({', '.join(found)}); give another "
                         "--out, or remove that folder to train a new vocab there")
    spec = require(INPUT, "vocab")
    out = tokenizer_lib.train_vocab(sources.vocab_lines(spec), size=SIZE.value, kind=TYPE.value,
                                    out_dir=out_dir, lowercase=LOWERCASE.value,
                                    sp_model_type=SP_MODEL.value, source=f"--input={spec}",
                                    size_name="--size")
    tok = tokenizer_lib.load_tokenizer(out)
    print(json.dumps({"out": str(out), "kind": tok.kind, "vocab_size": tok.vocab_size}))


def cmd_prepare(args: list[str]) -> None:
    """Tokenizes the config's corpus into array_record shards for data.name=array_record."""
    from bert_jax import config as config_lib
    from bert_jax.data import sources

    out = require(OUT, "prepare")
    counts = sources.prepare(config_lib.resolve(require(CONFIG, "prepare")), out)
    print(json.dumps({"out": out, "documents": counts}))
    print(f"train with: --config.data.name=array_record --config.data.train_files='{out}/train-*'"
          + (f" --config.data.eval_files='{out}/validation-*'" if counts["validation"] else ""))
