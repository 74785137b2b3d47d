"""What convert says of a vocab.txt against the weights it comes with: a token on two lines
(the one vocab.txt reader refuses it, naming both lines) and a tokenizer that leaves more rows
of the embedding table without a token than published padding does."""

from pathlib import Path

import pytest

from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.data import wordpiece
from bert_jax.interop import convert

TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "in", "sat"]


def test_a_token_on_two_lines_is_refused_naming_both_lines(tmp_path):
    """"in" replaced by a second "the" (as in an edited vocab.txt) leaves row 5 reached by no token."""
    (tmp_path / "vocab.txt").write_text("\n".join(t if t != "in" else "the" for t in TOKENS) + "\n",
                                        "utf-8")
    with pytest.raises(ValueError) as e:
        tokenizer_lib.load_tokenizer(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'vocab.txt'}:8: token 'the' is also on line 6, so "
                                   "row 5 of the embedding table would be reached by no token")
    assert "use the model's own vocab.txt" in str(e.value)


def test_repeated_blank_lines_of_a_published_vocab_are_read():
    # (no text reaches a token holding whitespace, so neither row is lost: chiTra's vocab has two)
    vocab = [*TOKENS, "", "", "\u3000", "\u3000"]
    wordpiece.check_no_repeated_token(vocab, "vocab.txt")


class Vocab:
    """What check_vocab_covers_table reads of a tokenizer."""

    def __init__(self, size: int) -> None:
        self.vocab_size, self.vocab_file = size, Path("m/vocab.txt")


@pytest.mark.parametrize("tokens, rows", [
    (30522, 30522),  # bert-base-uncased
    (50265, 50265),  # roberta-base
    (50285, 50368),  # ModernBERT-base's tokenizer.json and embedding table
    (30522, 30592),  # a table padded to the next multiple of 128
    (1001, 1128),  # 127 rows of padding, the most a multiple of 128 adds
])
def test_published_padding_of_the_table_passes(tokens, rows):
    convert.check_vocab_covers_table(Vocab(tokens), rows, Path("m/config.json"))


def test_a_cut_vocab_is_refused_naming_both_files_and_counts():
    with pytest.raises(ValueError) as e:
        convert.check_vocab_covers_table(Vocab(1000), 30522, Path("m/config.json"))
    assert str(e.value) == (
        "m/vocab.txt has 1000 tokens but m/config.json says vocab_size=30522 (the embedding "
        "table's rows): 29522 rows without a token, more than the padding to a multiple of 128 a "
        "published table has (at most 127), so the vocab is cut or another model's; use the "
        "vocab.txt that came with the model")
    with pytest.raises(ValueError, match=r"^m/vocab.txt has 1000 tokens .* 128 rows without a token"):
        convert.check_vocab_covers_table(Vocab(1000), 1128, Path("m/config.json"))


def test_a_vocab_longer_than_the_table_is_refused():
    with pytest.raises(ValueError, match=r"^m/vocab.txt has 30523 tokens but m/config.json says "
                                         r"vocab_size=30522 .*: ids past the table"):
        convert.check_vocab_covers_table(Vocab(30523), 30522, Path("m/config.json"))
