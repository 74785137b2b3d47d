"""What convert says of a vocab.txt against the weights it comes with."""

import json
import logging

import pytest

from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.interop import convert

TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "in", "sat"]


def test_a_token_on_two_lines_is_said_once_by_its_line(tmp_path, caplog):
    """Not refused (published vocabs have such lines, read so by transformers), but a vocab.txt
    edited by hand shows: "in" replaced by a second "the" leaves row 7 reached by no token."""
    (tmp_path / "vocab.txt").write_text("\n".join(TOKENS) + "\n", "utf-8")
    with caplog.at_level(logging.WARNING):
        convert.warn_repeated_tokens(tokenizer_lib.load_tokenizer(tmp_path))
    assert not caplog.records
    (tmp_path / "vocab.txt").write_text("\n".join(t if t != "in" else "the" for t in TOKENS) + "\n",
                                        "utf-8")
    with caplog.at_level(logging.WARNING):
        convert.warn_repeated_tokens(tokenizer_lib.load_tokenizer(tmp_path))
    [record] = caplog.records
    assert (f"{tmp_path / 'vocab.txt'}:8: 'the' again (line 6; 1 repeated line(s)), so row 5 of the "
            "embedding table is reached by no token") in record.getMessage()


def test_a_table_with_more_rows_than_padding_leaves_is_said_with_both_counts(tmp_path, caplog):
    """Padding to a multiple of 128 is quiet (ModernBERT's 50,368 rows for 50,285 tokens);
    1,000 tokens for BERT's 30,522 rows is said, naming both files and the counts."""
    (tmp_path / "vocab.txt").write_text("\n".join(TOKENS) + "\n", "utf-8")
    tokenizer = tokenizer_lib.load_tokenizer(tmp_path)
    with caplog.at_level(logging.WARNING):
        convert.warn_unused_rows(tokenizer, len(TOKENS), tmp_path / "config.json")
        convert.warn_unused_rows(tokenizer, len(TOKENS) + 127, tmp_path / "config.json")
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        convert.warn_unused_rows(tokenizer, 30522, tmp_path / "config.json")
    [record] = caplog.records
    assert (f"{tmp_path / 'vocab.txt'} has 9 tokens but {tmp_path / 'config.json'} says "
            "vocab_size=30522: 30513 rows of the embedding table have no token") in record.getMessage()


def _tokenizer_json(folder, vocab: dict, added: list[str] = ()) -> None:
    """A tokenizer.json as transformers writes a BERT's: WordPiece, the specials also added."""
    state = {"model": {"type": "WordPiece", "vocab": vocab},
             "added_tokens": [{"id": vocab[t], "content": t} for t in added]}
    (folder / "tokenizer.json").write_text(json.dumps(state), "utf-8")


def test_a_tokenizer_json_beside_the_vocab_must_be_the_same_tokenizer(tmp_path):
    """transformers loads tokenizer.json first: one that agrees with vocab.txt (a repeated line
    too, whose later id HF keeps) passes; one with a token on another id is refused."""
    lines = [t if t != "in" else "the" for t in TOKENS]  # 'the' on lines 6 and 8
    (tmp_path / "vocab.txt").write_text("\n".join(lines) + "\n", "utf-8")
    as_hf = {t: i for i, t in enumerate(lines)}  # (the later id wins, as in HF's load_vocab)
    assert as_hf["the"] == 7
    _tokenizer_json(tmp_path, as_hf, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    convert.check_tokenizer_json(tokenizer_lib.load_hf_tokenizer(tmp_path))
    _tokenizer_json(tmp_path, {**as_hf, "[PAD]": 3, "[SEP]": 0})
    with pytest.raises(ValueError, match=r"tokenizer\.json: model\.vocab: '\[PAD\]' has the id 3, "
                                         r"but line 4 of .*vocab\.txt is '\[SEP\]'"):
        convert.check_tokenizer_json(tokenizer_lib.load_hf_tokenizer(tmp_path))
    _tokenizer_json(tmp_path, {t: i for t, i in as_hf.items() if t != "sat"})
    with pytest.raises(ValueError, match=r"model\.vocab lacks 'sat' \(line 9 of"):
        convert.check_tokenizer_json(tokenizer_lib.load_hf_tokenizer(tmp_path))


def test_tokens_added_past_the_vocab_are_said_not_refused(tmp_path, caplog):
    """tokenizer.add_tokens then save_pretrained: vocab.txt keeps its lines, the new tokens sit
    in tokenizer.json's added_tokens past them (the table grew by their rows)."""
    (tmp_path / "vocab.txt").write_text("\n".join(TOKENS) + "\n", "utf-8")
    vocab = {t: i for i, t in enumerate(TOKENS)}
    state = {"model": {"type": "WordPiece", "vocab": vocab},
             "added_tokens": [{"id": vocab["[PAD]"], "content": "[PAD]"},
                              {"id": len(TOKENS), "content": "[E1]"}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(state), "utf-8")
    with caplog.at_level(logging.WARNING):
        convert.check_tokenizer_json(tokenizer_lib.load_hf_tokenizer(tmp_path))
    assert "added_tokens: 1 token(s) past" in caplog.text and "'[E1]'" in caplog.text
    state["added_tokens"].append({"id": -1, "content": "[E2]"})  # an id no table has: refused
    (tmp_path / "tokenizer.json").write_text(json.dumps(state), "utf-8")
    with pytest.raises(ValueError, match=r"added_tokens: '\[E2\]' has the id -1, outside"):
        convert.check_tokenizer_json(tokenizer_lib.load_hf_tokenizer(tmp_path))
