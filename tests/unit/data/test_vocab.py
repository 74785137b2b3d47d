"""Vocab training and load_tokenizer on real text, against a pure-Python BERT reference."""

import hashlib
import json
import pickle
import re
import shutil

import numpy as np
import pytest

from bert_jax.data.tokenizer import (
    META_NAME,
    WORDPIECE_OPTIONS,
    load_hf_tokenizer,
    load_tokenizer,
    train_vocab,
)
from bert_jax.data.wordpiece import SPECIAL_TOKENS, reference_basic_tokenize

EXTRA = ["Café naïve résumé — “quoted” façade", "ΟΔΟΣ'S ΟΔΟΣ. Ελληνικά", "東京 tokyo 2024",
         "don't stop-believing!!", "", "   ", "a" * 101, "[MASK] [CLS] text"]


@pytest.fixture(scope="module")
def lines(shared_data) -> list[str]:
    """Raw non-blank Gutenberg lines from every book (verse, prose, headers, odd punctuation)."""
    books = sorted((shared_data / "text" / "gutenberg").glob("*.txt"))
    if not books:
        pytest.skip("no Gutenberg books in shared data")
    out = []
    for book in books:
        rows = [r for r in book.read_text("utf-8", errors="replace").splitlines() if r.strip()]
        out += rows[100:1100:2]
    return out  # ~6500 lines


@pytest.fixture(scope="module")
def train_text(lines, english_lines) -> list[str]:
    return lines[::2] + english_lines


@pytest.fixture(scope="module")
def test_text(lines) -> list[str]:
    return lines[1::2] + EXTRA  # held out from training, so unseen words and [UNK] occur


def reference_wordpieces(text: str, vocab: set[str], lowercase: bool) -> list[str]:
    """google-research/bert: basic tokenization, then greedy longest-match-first wordpieces."""
    out = []
    for word in reference_basic_tokenize(text, lowercase):
        pieces, start = [], 0
        while start < len(word) and len(word) <= 100:
            end = len(word)
            while end > start and ("##" * (start > 0) + word[start:end]) not in vocab:
                end -= 1
            if end == start:
                break
            pieces.append("##" * (start > 0) + word[start:end])
            start = end
        out += pieces if start == len(word) else ["[UNK]"]
    return out


def assert_reference_parity(tok, texts: list[str]) -> None:
    vocab = set(tok.pieces)
    got = [tok.tokens(ids) for ids in tok.encode_batch(texts)]
    for text, tokens in zip(texts, got):
        assert tokens == reference_wordpieces(text, vocab, tok.lowercase), text
    n_tokens = sum(map(len, got))
    assert n_tokens > 50_000 and sum(t == "[UNK]" for ts in got for t in ts) < n_tokens / 50


def test_wordpiece_fixture_vocab_matches_reference(wordpiece_vocab, tmp_path, test_text):
    shutil.copy(wordpiece_vocab, tmp_path / "vocab.txt")  # alone: casing inferred from the vocab
    tok = load_tokenizer(tmp_path)
    assert (tok.kind, tok.lowercase, tok.vocab_size) == ("wordpiece", True, 1500)
    assert_reference_parity(tok, test_text)


def test_wordpiece_bert_layout(wordpiece_vocab, tmp_path):
    """Google's layout: [PAD] [unused0..98] [UNK] [CLS] [SEP] [MASK] ...; HF tokenizer.json beside it."""
    vocab = wordpiece_vocab.read_text("utf-8").splitlines()[5:]
    head = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (tmp_path / "vocab.txt").write_text("".join(t + "\n" for t in head + vocab), "utf-8")
    hf = {"version": "1.0", "normalizer": {"type": "BertNormalizer", "lowercase": True}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(hf), "utf-8")  # not ours: no "kind"
    tok = load_tokenizer(tmp_path)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
    assert tok.lowercase and tok.vocab_size == 1599 and tok.special_ids == {0, 100, 101, 102, 103}
    assert tok.tokens(tok.encode("The Emma!")) == ["the", "emma", "!"]


@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
def test_wordpiece_train_and_parity(lowercase, tmp_path, train_text, test_text):
    out = train_vocab(iter(train_text), size=2000, kind="wordpiece", out_dir=tmp_path / "wp",
                      lowercase=lowercase)
    assert out == tmp_path / "wp"
    vocab = (out / "vocab.txt").read_text("utf-8").splitlines()
    assert vocab[:5] == list(SPECIAL_TOKENS) and len(vocab) == 2000 and len(set(vocab)) == 2000
    assert any(t.startswith("##") for t in vocab)
    assert any(t != t.lower() for t in vocab[5:]) == (not lowercase)
    meta = json.loads((out / META_NAME).read_text("utf-8"))
    digest = hashlib.sha256((out / "vocab.txt").read_bytes()).hexdigest()
    assert meta == {"kind": "wordpiece", "lowercase": lowercase, "vocab_size": 2000,
                    "final_sigma": True, "keep_special_tokens": False, "sha256": {"vocab.txt": digest}}
    tok = load_tokenizer(out)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.special_ids == {0, 1, 2, 3, 4} and tok.lowercase == lowercase
    assert_reference_parity(tok, test_text)
    (out / META_NAME).unlink()
    (out / "tokenizer_config.json").unlink()
    assert load_tokenizer(out).lowercase == lowercase  # inferred from the vocab alone
    assert load_tokenizer(out, lowercase=not lowercase).lowercase == (not lowercase)


def test_wordpiece_encode_word_starts_decode(tmp_path, train_text, test_text):
    tok = load_tokenizer(train_vocab(train_text, size=2000, kind="wordpiece", out_dir=tmp_path))
    ids = tok.encode("Unimaginable extravagance, said Emma.")
    assert ids.dtype == np.int32 and ids.ndim == 1
    tokens = tok.tokens(ids)
    assert tokens[-3:] == ["said", "emma", "."]
    assert tok.word_starts(ids).tolist() == [not t.startswith("##") for t in tokens]
    assert tok.decode(ids) == "unimaginable extravagance , said emma ."
    assert tok.decode([tok.cls_id, *ids[:1], tok.mask_id, tok.sep_id, tok.pad_id]) == "[CLS] un [MASK] [SEP]"
    assert tok.word_starts([tok.cls_id, tok.sep_id, tok.unk_id]).all()
    assert tok.encode("").shape == (0,)
    padded = np.stack([ids, np.zeros_like(ids)])  # word_starts keeps a batch's shape
    assert tok.word_starts(padded).tolist() == [tok.word_starts(ids).tolist(), [True] * len(ids)]
    clone = pickle.loads(pickle.dumps(tok))  # grain worker processes get pickled copies
    assert np.array_equal(clone.encode("Unimaginable extravagance, said Emma."), ids)
    batch = tok.encode_batch(test_text[:200])
    assert all(np.array_equal(a, tok.encode(t)) for a, t in zip(batch, test_text[:200]))
    for text, ids in zip(test_text, tok.encode_batch(test_text)):  # one start per BERT word
        assert tok.word_starts(ids).sum() == len(reference_basic_tokenize(text, True)), text


@pytest.mark.parametrize("model_type,lowercase", [("unigram", True), ("bpe", False)])
def test_sentencepiece_train_round_trip(model_type, lowercase, tmp_path, train_text, test_text):
    out = train_vocab(train_text, size=1000, kind="sentencepiece", out_dir=tmp_path,
                      lowercase=lowercase, sp_model_type=model_type)
    assert (out / "spm.model").is_file() and (out / "spm.vocab").is_file()
    assert not (out / "vocab.txt").exists()
    meta = json.loads((out / META_NAME).read_text("utf-8"))
    digest = hashlib.sha256((out / "spm.model").read_bytes()).hexdigest()
    assert meta == {"kind": "sentencepiece", "lowercase": lowercase, "vocab_size": 1000,
                    "sha256": {"spm.model": digest}}
    tok = load_tokenizer(out)
    assert (tok.kind, tok.vocab_size, tok.lowercase) == ("sentencepiece", 1000, lowercase)
    assert tok.tokens(range(5)) == list(SPECIAL_TOKENS)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    batch = tok.encode_batch(test_text)
    assert all(a.dtype == np.int32 for a in batch)
    assert not any(np.isin(ids, [0, 2, 3, 4]).any() for ids in batch)  # "[MASK]" text is not [MASK]
    checked = 0
    for text, ids in zip(test_text, batch):
        if tok.unk_id in ids or not text.isascii():
            continue  # [UNK] loses characters; NFKC may rewrite non-ASCII ones
        expected = " ".join(text.split())
        assert tok.decode(ids) == (expected.lower() if lowercase else expected)
        starts = tok.word_starts(ids)
        assert starts.sum() == len(text.split()) and (not len(ids) or starts[0])
        checked += 1
    assert checked > 3000
    ids = tok.encode("Hello world")
    assert tok.word_starts(ids).tolist() == [t.startswith("▁") for t in tok.tokens(ids)]
    assert tok.decode([tok.cls_id, *ids, tok.sep_id, tok.pad_id]).lower() == "[cls] hello world [sep]"
    assert tok.word_starts([tok.cls_id, tok.mask_id, tok.pad_id]).all()
    assert np.array_equal(pickle.loads(pickle.dumps(tok)).encode("Hello world"), ids)
    with pytest.raises(ValueError, match="case folding is part of a sentencepiece model"):
        load_tokenizer(out, lowercase=not lowercase)


def test_hf_folder_casing_and_save(wordpiece_vocab, tmp_path):
    """A HF folder reads with BertTokenizer's defaults; save() states every option for load_tokenizer."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "vocab.txt").write_text(wordpiece_vocab.read_text("utf-8") + "Emma\n", "utf-8")
    assert load_tokenizer(hf).lowercase is False  # our guess: an uppercase token means cased
    load_tokenizer(hf).save(tmp_path / "plain")  # default options: nothing beside HF's files
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == ["tokenizer_config.json", "vocab.txt"]
    tok = load_hf_tokenizer(hf)
    assert tok.lowercase is True and tok.vocab_size == 1501  # HF: do_lower_case unless stated
    tok.save(tmp_path / "out")
    back = load_tokenizer(tmp_path / "out")
    assert (back.lowercase, back.pieces, back.final_sigma) == (True, tok.pieces, False)
    assert back.encode_pair("Emma said", "no").tokens == ["[CLS]", "emma", "said", "[SEP]", "no", "[SEP]"]
    (hf / "tokenizer_config.json").write_text('{"do_lower_case": false}')
    assert load_hf_tokenizer(hf).lowercase is False
    (hf / "tokenizer_config.json").write_text('{"do_basic_tokenize": false}')
    with pytest.raises(ValueError, match="do_basic_tokenize=false is not supported"):
        load_hf_tokenizer(hf)
    with pytest.raises(FileNotFoundError, match="vocab.txt"):
        load_hf_tokenizer(tmp_path)


def test_wordpiece_options_survive_save_and_load(wordpiece_vocab, tmp_path, english_lines):
    """final_sigma and keep_special_tokens, set when the vocab is trained or loaded, are stored in
    bert_jax_tokenizer.json and come back on load; a folder without them has the defaults."""
    shutil.copy(wordpiece_vocab, tmp_path / "vocab.txt")  # an old folder: no bert_jax_tokenizer.json
    old = load_tokenizer(tmp_path)
    assert (old.final_sigma, old.keep_special_tokens) == (True, False) == tuple(WORDPIECE_OPTIONS.values())
    text = "ΟΔΟΣ emma [MASK]"
    assert "[MASK]" not in old.tokens(old.encode(text))  # split, as Google's tokenizer does
    tok = load_tokenizer(tmp_path, final_sigma=False, keep_special_tokens=True)
    assert tok.tokens(tok.encode(text))[-1] == "[MASK]"
    tok.save(tmp_path / "saved")
    back = load_tokenizer(tmp_path / "saved")
    assert (back.final_sigma, back.keep_special_tokens) == (False, True)
    assert np.array_equal(back.encode(text), tok.encode(text))
    trained = train_vocab(english_lines, size=300, kind="wordpiece", out_dir=tmp_path / "t",
                          keep_special_tokens=True)
    assert load_tokenizer(trained).keep_special_tokens is True
    assert load_hf_tokenizer(tmp_path).final_sigma is False  # HF's fast tokenizers: 'Σ' -> 'σ'
    meta = json.loads((tmp_path / "saved" / META_NAME).read_text("utf-8"))
    (tmp_path / "saved" / META_NAME).write_text(json.dumps({**meta, "final_sigma": "yes"}))
    with pytest.raises(ValueError, match=r"tokenizer\.json: final_sigma='yes', expected true or false"):
        load_tokenizer(tmp_path / "saved")
    with pytest.raises(ValueError, match="unknown option"):
        train_vocab(english_lines, size=300, kind="sentencepiece", out_dir=tmp_path / "s", final_sigma=True)


def test_sentencepiece_save(tmp_path, english_lines):
    tok = load_tokenizer(train_vocab(english_lines, size=300, kind="sentencepiece", out_dir=tmp_path / "a"))
    tok.save(tmp_path / "b")
    back = load_tokenizer(tmp_path / "b")
    assert (back.kind, back.pieces) == ("sentencepiece", tok.pieces)
    assert np.array_equal(back.encode(english_lines[0]), tok.encode(english_lines[0]))
    tok.save(tmp_path / "a")  # onto itself: nothing to do


def test_sentencepiece_offsets(tmp_path, english_lines):
    """encode_with_offsets: encode's ids, each with the characters sentencepiece aligns it to."""
    tok = load_tokenizer(train_vocab(english_lines, size=300, kind="sentencepiece", out_dir=tmp_path))
    for text in [*english_lines[:50], "Café  naïve \ufb01sh 東京"]:
        ids, offsets = tok.encode_with_offsets(text)
        assert np.array_equal(ids, tok.encode(text)) and offsets.shape == (len(ids), 2)
        assert (np.diff(offsets[:, 0]) >= 0).all() and (offsets[:, 0] <= offsets[:, 1]).all()
        # The pieces' spans tile the text, a "▁" over the whitespace it stands for.
        assert "".join(text[lo:hi] for lo, hi in offsets.tolist()) == text.rstrip()


def test_check_fits(wordpiece_vocab):
    tok = load_tokenizer(wordpiece_vocab.parent)
    tok.check_fits(1500, "ok")
    tok.check_fits(1536, "padded")  # a larger (TPU-friendly) embedding is fine
    msg = (f"tokenizer in {wordpiece_vocab.parent} has 1500 tokens but model.vocab_size=1024 "
           "(configs/x.py); set --config.model.vocab_size=1500 or train a vocab of size <= 1024")
    with pytest.raises(ValueError, match=re.escape(msg)):
        tok.check_fits(1024, "configs/x.py")
    with pytest.raises(ValueError, match="outside vocab of size 1500"):
        tok.tokens([1500])


def test_bad_inputs(tmp_path, english_lines):
    with pytest.raises(ValueError, match="size=30 is too small for this text"):
        train_vocab(english_lines, size=30, kind="wordpiece", out_dir=tmp_path)
    with pytest.raises(ValueError, match="sentencepiece cannot train .* size=30 .*smaller than required"):
        train_vocab(english_lines, size=30, kind="sentencepiece", out_dir=tmp_path)
    with pytest.raises(ValueError, match="size=5 leaves no room"):
        train_vocab(english_lines, size=5, kind="sentencepiece", out_dir=tmp_path)
    for empty in ([], ["", " \n"], iter([])):
        for kind in ("wordpiece", "sentencepiece"):
            with pytest.raises(ValueError, match="no text to train on"):
                train_vocab(empty, size=100, kind=kind, out_dir=tmp_path)
    with pytest.raises(TypeError, match="iterable of text lines"):
        train_vocab("corpus.txt", size=100, kind="wordpiece", out_dir=tmp_path)
    with pytest.raises(ValueError, match="kind='bert'"):
        train_vocab(english_lines, size=100, kind="bert", out_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no tokenizer in .*: looked for vocab.txt .*spm.model"):
        load_tokenizer(tmp_path / "empty")
    (tmp_path / META_NAME).write_text('{"kind": "sentencepiece"}')
    with pytest.raises(FileNotFoundError, match="kind='sentencepiece'.*spm.model"):
        load_tokenizer(tmp_path)


def test_a_vocab_file_changed_after_it_was_saved_is_refused(tmp_path, train_text):
    # bert_jax_tokenizer.json records the vocab's size and its files' SHA-256: a vocab.txt cut
    # short, or with a token replaced, would give a model trained with it other ids.
    out = train_vocab(iter(train_text), size=500, kind="wordpiece", out_dir=tmp_path / "wp")
    lines = (out / "vocab.txt").read_text("utf-8").splitlines(keepends=True)
    assert len(lines) == 500
    (out / "vocab.txt").write_text("".join(lines[:300]), "utf-8")
    with pytest.raises(ValueError, match=r"wp/vocab\.txt: 300 tokens, but .*wp/bert_jax_tokenizer\.json "
                                         r"records vocab_size=500; .*restore them"):
        load_tokenizer(out)
    (out / "vocab.txt").write_text("".join([*lines[:100], "[UNK]\n", *lines[101:]]), "utf-8")
    with pytest.raises(ValueError, match=r"wp/vocab\.txt: its content differs from the one .*"
                                         r"bert_jax_tokenizer\.json records \(SHA-256\)"):
        load_tokenizer(out)
    # A folder saved before the record held digests: the count alone is checked.
    meta = json.loads((out / META_NAME).read_text("utf-8"))
    del meta["sha256"]
    (out / META_NAME).write_text(json.dumps(meta), "utf-8")
    assert load_tokenizer(out).vocab_size == 500
    # The advice works: without the recorded size and digests, an edited vocab folder loads.
    (out / "vocab.txt").write_text("".join(lines[:300]), "utf-8")
    del meta["vocab_size"]
    (out / META_NAME).write_text(json.dumps(meta), "utf-8")
    assert load_tokenizer(out).vocab_size == 300
