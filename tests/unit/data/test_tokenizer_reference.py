"""The reference tokenizer test cases of Google's BERT and of Hugging Face transformers, transcribed
with their inputs and expected outputs, run against our tokenizer (bert_jax/data/tokenizer.py and
its WordPiece engine). Each case passes with our defaults or with the documented option named in
it (docs/pretraining.md, "Tokenizer options").

Sources (Apache License 2.0; the cases are theirs, the test code here is ours):
- google-research/bert tokenization_test.py, Copyright 2018 The Google AI Language Team Authors
  (commit 281d86ed); cited as "google: <test name>".
- huggingface/transformers tests/models/bert/test_tokenization_bert.py, Copyright 2020 The
  HuggingFace Team (commits c8dfc84e and 02d54151); cited as "hf: <test name>".
Their helpers _is_whitespace, _is_control and _is_punctuation are private to those tokenizers;
here each is checked by what it does to "a<c>b" (see char_class). HF's character offsets
(return_offsets_mapping) are our Tokenizer.encode_with_offsets.
"""

import json

import pytest

from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.data.wordpiece import WordPieceTokenizer, reference_basic_tokenize

# google: test_full_tokenizer's vocab (no [PAD], no [MASK]), test_wordpiece_tokenizer's without ",".
GOOGLE_VOCAB = ["[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn", "##ing", ","]
WORDPIECE_VOCAB = GOOGLE_VOCAB[:-1]
# hf: BertTokenizationTest.setUp's vocab.
HF_VOCAB = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "want", "##want", "##ed", "wa", "un", "runn",
            "##ing", ",", "low", "lowest"]
HELLO = " \tHeLLo!how  \n Are yoU?  "
HALLO = " \tHäLLo!how  \n Are yoU?  "


def tokenizer(tmp_path, vocab: list[str], config: dict | None = None, **options):
    """load_tokenizer of a folder with this vocab.txt (and tokenizer_config.json)."""
    folder = tmp_path / "tok"
    folder.mkdir(exist_ok=True)
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in vocab), "utf-8")
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config), "utf-8")
    return load_tokenizer(folder, **options)


def tokens(tok, text: str) -> list[str]:
    return tok.tokens(tok.encode(text))


def basic(text: str, lowercase: bool = True, strip_accents: bool | None = None,
          chinese: bool = True) -> list[str]:
    """Our basic tokenization (BasicTokenizer's), the Rust fast path and the Python reference agreeing."""
    words = WordPieceTokenizer(["[UNK]"], lowercase=lowercase, strip_accents=strip_accents,
                               tokenize_chinese_chars=chinese).basic_tokenize(text)
    assert words == reference_basic_tokenize(text, lowercase, strip_accents, chinese)
    return words


def char_class(c: str) -> str:
    """What basic tokenization does with c between two letters: whitespace separates them, a
    control character is dropped, punctuation becomes a word of its own, anything else is kept."""
    return {("a", "b"): "whitespace", ("ab",): "control", ("a", c, "b"): "punctuation"}.get(
        tuple(basic(f"a{c}b", lowercase=False)), "other")


BASIC_CASES = [  # (source, text, lowercase, strip_accents, expected)
    ("google: test_chinese", "ah\u535A\u63A8zz", True, None, ["ah", "\u535A", "\u63A8", "zz"]),
    ("google: test_basic_tokenizer_lower", HELLO, True, None, ["hello", "!", "how", "are", "you", "?"]),
    ("google: test_basic_tokenizer_lower", "H\u00E9llo", True, None, ["hello"]),
    ("google: test_basic_tokenizer_no_lower", HELLO, False, None, ["HeLLo", "!", "how", "Are", "yoU", "?"]),
    ("hf: test_chinese", "ah\u535A\u63A8zz", True, None, ["ah", "\u535A", "\u63A8", "zz"]),
    ("hf: test_basic_tokenizer_lower", HELLO, True, None, ["hello", "!", "how", "are", "you", "?"]),
    ("hf: test_basic_tokenizer_lower", "H\u00E9llo", True, None, ["hello"]),
    ("hf: test_basic_tokenizer_lower_strip_accents_false", HALLO, True, False,
     ["hällo", "!", "how", "are", "you", "?"]),
    ("hf: test_basic_tokenizer_lower_strip_accents_false", "H\u00E9llo", True, False, ["h\u00E9llo"]),
    ("hf: test_basic_tokenizer_lower_strip_accents_true", HALLO, True, True,
     ["hallo", "!", "how", "are", "you", "?"]),
    ("hf: test_basic_tokenizer_lower_strip_accents_true", "H\u00E9llo", True, True, ["hello"]),
    ("hf: test_basic_tokenizer_lower_strip_accents_default", HALLO, True, None,
     ["hallo", "!", "how", "are", "you", "?"]),
    ("hf: test_basic_tokenizer_lower_strip_accents_default", "H\u00E9llo", True, None, ["hello"]),
    ("hf: test_basic_tokenizer_no_lower", HELLO, False, None, ["HeLLo", "!", "how", "Are", "yoU", "?"]),
    ("hf: test_basic_tokenizer_no_lower_strip_accents_false", HALLO, False, False,
     ["HäLLo", "!", "how", "Are", "yoU", "?"]),
    ("hf: test_basic_tokenizer_no_lower_strip_accents_true", HALLO, False, True,
     ["HaLLo", "!", "how", "Are", "yoU", "?"]),
    ("hf: test_basic_tokenizer_splits_on_punctuation", "a\n'll !!to?'d of, can't.", True, None,
     ["a", "'", "ll", "!", "!", "to", "?", "'", "d", "of", ",", "can", "'", "t", "."]),
    # 02d54151 only; BasicTokenizer(remove_control_chars=True). Its remove_control_chars=False
    # case (["\u200E\u200F"] kept) is an option neither Google nor transformers 5 has: not offered.
    ("hf: test_basic_tokenizer_remove_control_chars_true", "\u200E\u200F", True, None, []),
]


@pytest.mark.parametrize("source,text,lowercase,strip_accents,expected", BASIC_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(BASIC_CASES)])
def test_basic_tokenizer(source, text, lowercase, strip_accents, expected):
    assert basic(text, lowercase, strip_accents) == expected


CHAR_CASES = [  # (source, char, class, expected: the reference's assertTrue / assertFalse)
    *(("google: test_is_whitespace", c, "whitespace", True) for c in (" ", "\t", "\r", "\n", "\u00A0")),
    *(("google: test_is_whitespace", c, "whitespace", False) for c in ("A", "-")),
    ("google: test_is_control", "\u0005", "control", True),
    *(("google: test_is_control", c, "control", False) for c in ("A", " ", "\t", "\r")),
    *(("google: test_is_punctuation", c, "punctuation", True) for c in ("-", "$", "`", ".")),
    *(("google: test_is_punctuation", c, "punctuation", False) for c in ("A", " ")),
]
CHAR_CASES += [("hf" + source.removeprefix("google"), *rest) for source, *rest in CHAR_CASES]


@pytest.mark.parametrize("source,char,cls,expected", CHAR_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CHAR_CASES)])
def test_character_classes(source, char, cls, expected):
    assert (char_class(char) == cls) is expected


@pytest.mark.parametrize("source", ["google: test_wordpiece_tokenizer", "hf: test_wordpiece_tokenizer"])
def test_wordpiece_tokenizer(source, tmp_path):
    # WordpieceTokenizer alone neither lowercases nor splits punctuation: cased here, so "X" stays X.
    tok = tokenizer(tmp_path, WORDPIECE_VOCAB, lowercase=False)
    assert tokens(tok, "") == []
    assert tokens(tok, "unwanted running") == ["un", "##want", "##ed", "runn", "##ing"]
    assert tokens(tok, "unwantedX running") == ["[UNK]", "runn", "##ing"]


def test_google_full_tokenizer(tmp_path):
    """google: test_full_tokenizer, with its vocab that has no [PAD] and no [MASK]."""
    tok = tokenizer(tmp_path, GOOGLE_VOCAB)
    ids = tok.encode("UNwant\u00E9d,running")
    assert tok.tokens(ids) == ["un", "##want", "##ed", ",", "runn", "##ing"]
    assert ids.tolist() == [7, 4, 5, 10, 8, 9]
    # Where a missing special token is used: one line naming the vocab file and the token.
    with pytest.raises(ValueError, match=r"tok/vocab\.txt: the vocab has no \[MASK\] token"):
        _ = tok.mask_id
    with pytest.raises(ValueError, match=r"tok/vocab\.txt: the vocab has no \[PAD\] token"):
        tok.encode_pairs(["want"], [None], max_seq_length=8)  # padding needs [PAD]
    assert tok.encode_pair("want", "un").input_ids == [1, 3, 2, 7, 2]  # no padding: no [PAD]


def test_google_convert_tokens_to_ids():
    """google: test_convert_tokens_to_ids."""
    wp = WordPieceTokenizer(WORDPIECE_VOCAB, lowercase=True)
    assert wp.tokens_to_ids(["un", "##want", "##ed", "runn", "##ing"]) == [7, 4, 5, 8, 9]


def test_hf_full_tokenizer(tmp_path):
    """hf: test_full_tokenizer, and test_rust_and_python_full_tokenizers (which wants the slow and
    fast tokenizers equal, cased default and do_lower_case=True: here, the slow one's values)."""
    tok = tokenizer(tmp_path, HF_VOCAB)
    ids = tok.encode("UNwant\u00E9d,running")
    assert tok.tokens(ids) == ["un", "##want", "##ed", ",", "runn", "##ing"]
    assert ids.tolist() == [9, 6, 7, 12, 10, 11]
    for lower in (tok, tokenizer(tmp_path, HF_VOCAB, lowercase=True)):
        ids = lower.encode("UNwant\u00E9d,running")
        assert lower.tokens(ids) == ["un", "##want", "##ed", ",", "runn", "##ing"]
        assert ids.tolist() == [9, 6, 7, 12, 10, 11]
        assert lower.encode_pair("UNwant\u00E9d,running").input_ids == [1, 9, 6, 7, 12, 10, 11, 2]


def test_hf_decode_spacing(tmp_path):
    """hf: get_input_output_texts (TokenizerTesterMixin.test_internal_consistency decodes the
    input's ids to this text): with the option decode(clean_up_spaces=True)."""
    tok = tokenizer(tmp_path, HF_VOCAB)
    ids = tok.encode("UNwant\u00E9d,running")
    assert tok.decode(ids, clean_up_spaces=True) == "unwanted, running"
    assert tok.decode(ids) == "unwanted , running"  # the default: every token, space-separated


def test_hf_clean_text(tmp_path):
    """hf: test_clean_text (the slow and the Rust tokenizer: here our Rust path and Python reference)."""
    tok = tokenizer(tmp_path, HF_VOCAB)
    texts = ["Test", "\xad", "test"]
    assert [tokens(tok, t) for t in texts] == [["[UNK]"], [], ["[UNK]"]]
    assert [reference_basic_tokenize(t, True) for t in texts] == [["test"], [], ["test"]]


def test_hf_never_split(tmp_path):
    """hf: test_basic_tokenizer_respects_never_split_tokens: with the option keep_special_tokens."""
    words = ["HeLLo", "!", "how", "Are", "yoU", "?"]
    tok = tokenizer(tmp_path, [*HF_VOCAB, *words, "[", "UNK", "]"], lowercase=False, keep_special_tokens=True)
    assert tokens(tok, " \tHeLLo!how  \n Are yoU? [UNK]") == [*words, "[UNK]"]
    default = tokenizer(tmp_path, [*HF_VOCAB, *words, "[", "UNK", "]"], lowercase=False)
    assert tokens(default, " \tHeLLo!how  \n Are yoU? [UNK]") == [*words, "[", "UNK", "]"]  # Google's


def test_hf_sequence_builders(tmp_path):
    """hf: test_sequence_builders (bert-base-uncased's [CLS]=101, [SEP]=102: a vocab in its layout)."""
    head = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = tokenizer(tmp_path, [*head, "sequence", "builders", "multi", "-", "build"])
    text, text_2 = tok.encode("sequence builders").tolist(), tok.encode("multi-sequence build").tolist()
    assert tok.encode_pair("sequence builders").input_ids == [101] + text + [102]
    assert tok.encode_pair("sequence builders", "multi-sequence build").input_ids == (
        [101] + text + [102] + text_2 + [102])


@pytest.mark.parametrize("lowercase,expected", [
    (False, [((0, 0), "[CLS]"), ((0, 1), "A"), ((1, 2), ","), ((3, 5), "na"), ((5, 6), "##ï"),
             ((6, 8), "##ve"), ((9, 15), "[MASK]"), ((16, 21), "Allen"), ((21, 23), "##NL"),
             ((23, 24), "##P"), ((25, 33), "sentence"), ((33, 34), "."), ((0, 0), "[SEP]")]),
    (True, [((0, 0), "[CLS]"), ((0, 1), "a"), ((1, 2), ","), ((3, 8), "naive"), ((9, 15), "[MASK]"),
            ((16, 21), "allen"), ((21, 23), "##nl"), ((23, 24), "##p"), ((25, 33), "sentence"),
            ((33, 34), "."), ((0, 0), "[SEP]")]),
], ids=["cased", "uncased"])
def test_hf_offsets_with_special_characters(lowercase, expected, tmp_path):
    """hf: test_offsets_with_special_characters: tokens and character offsets (encode_with_offsets;
    HF's (0, 0) for the added [CLS] and [SEP]), the literal [MASK] kept whole with the option
    keep_special_tokens."""
    vocab = [*HF_VOCAB, *(t for _, t in expected if t not in HF_VOCAB)]
    tok = tokenizer(tmp_path, vocab, lowercase=lowercase, keep_special_tokens=True)
    text = "A, naïve [MASK] AllenNLP sentence."
    assert tok.encode_pair(text).tokens == [t for _, t in expected]
    ids, offsets = tok.encode_with_offsets(text)
    got = list(zip(map(tuple, offsets.tolist()), tok.tokens(ids)))
    assert [((0, 0), "[CLS]"), *got, ((0, 0), "[SEP]")] == expected
    # The same through the Python reference path (a rare character sends the text there).
    wp = tok._wp
    assert not wp._fast_ok(text + " \u0860")
    assert wp.tokenize_with_offsets(text + " \u0860") == (
        [t for _, t in expected[1:-1]] + ["[UNK]"], [o for o, _ in expected[1:-1]] + [(35, 36)])


@pytest.mark.parametrize("chinese,expected", [(True, ["的", "人", "有"]), (False, ["的", "##人", "##有"])])
def test_hf_change_tokenize_chinese_chars(chinese, expected, tmp_path):
    """hf: test_change_tokenize_chinese_chars: tokenize_chinese_chars from tokenizer_config.json."""
    vocab = [*HF_VOCAB, "的", "人", "有", "##的", "##人", "##有"]
    tok = tokenizer(tmp_path, vocab, config={"tokenize_chinese_chars": chinese})
    assert tokens(tok, "的人有") == expected
