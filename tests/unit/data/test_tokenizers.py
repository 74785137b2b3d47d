"""The WordPiece engine, and the Tokenizer's BERT inputs built on it, against the reference slow
BertTokenizer on real text, uncased and cased."""

import itertools
import json
import unicodedata

import numpy as np
import pytest
from tokenizers import BertWordPieceTokenizer, normalizers

from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.data.wordpiece import WordPieceTokenizer, load_vocab, reference_basic_tokenize

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()  # longest_first warns on every pair call
from transformers.models.bert.tokenization_bert import load_vocab as hf_load_vocab  # noqa: E402
from transformers.models.bert.tokenization_bert_legacy import (  # noqa: E402
    BasicTokenizer,
    BertTokenizerLegacy,
)

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CASES = {"uncased": True, "cased": False}  # name -> lowercase


def reference(vocab_file, lowercase: bool, strip_accents=None):
    """The slow, pure-Python BertTokenizer (google-research/bert semantics plus NFC); in
    transformers 5 BertTokenizer is the Rust one and the Python one is kept as Legacy."""
    return BertTokenizerLegacy(str(vocab_file), do_lower_case=lowercase, strip_accents=strip_accents)


def _need(path):
    if not path.exists():
        pytest.skip(f"shared data file missing: {path}")
    return path


@pytest.fixture(scope="module")
def squad(shared_data):
    data = json.loads(_need(shared_data / "squad" / "dev-v1.1.json").read_text("utf-8"))
    paras = [p for article in data["data"] for p in article["paragraphs"]]
    return [p["context"] for p in paras], [q["question"] for p in paras for q in p["qas"]]


@pytest.fixture(scope="module")
def corpus(shared_data, squad) -> list[str]:
    """A few thousand real lines plus edge cases built from them."""
    books = sorted(_need(shared_data / "text" / "gutenberg").glob("*.txt"))
    lines = []
    for book in books:  # raw lines, so empty ones and indented verse are in
        lines += book.read_text("utf-8", errors="replace").splitlines()[200:2200:10]
    wiki = _need(shared_data / "text" / "wikitext2" / "valid.txt").read_text("utf-8").splitlines()
    lines += wiki[:1200]
    conll = _need(shared_data / "ner" / "conll2003" / "valid.txt").read_text("utf-8")
    lines += [" ".join(row.split()[0] for row in s.splitlines())
              for s in conll.split("\n\n")[1:400] if s.strip()]
    contexts, questions = squad
    odd = [c for c in contexts if not c.isascii()]
    lines += odd + contexts[:150] + [q for q in questions if not q.isascii()] + questions[:400]
    lines += [c.upper() for c in odd if any("α" <= ch <= "ω" for ch in c)]  # final sigma
    lines += [unicodedata.normalize("NFD", c) for c in odd[:60]]  # decomposed accents
    lines += ["".join(c.split())[:300] for c in contexts[:20]]  # words longer than 100 chars
    lines += [c.replace(" ", "\t", 5).replace(" ", "\x00", 2).replace(" ", "\u200b", 2)
              .replace(" ", "\xa0", 2).replace(" ", "\x07\u2028\x85", 1).replace("e", "e\ufffd", 3)
              + " \U0001F600 \u0378 \ue000 \u1734 \u2e55" for c in contexts[:40]]
    lines += ["", " ", "\t\n", "\x00", "a" * 100, "a" * 101, "ΟΔΟΣ.", "ΟΔΟΣ'S ΟΔΟΣ"]
    assert not any(s in line for line in lines for s in SPECIALS)  # see test_special_token_text
    return lines


def _train_vocab(path, lines, lowercase: bool, extra_text: list[str]):
    trainer = BertWordPieceTokenizer(lowercase=lowercase, strip_accents=lowercase)
    trainer.train_from_iterator(lines, vocab_size=4000, special_tokens=SPECIALS,
                                show_progress=False)
    vocab = trainer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    assert tokens[:5] == SPECIALS
    # Accented and CJK characters (every other one, so unknown ones stay [UNK]).
    words = [w for t in extra_text for w in reference_basic_tokenize(t, lowercase)]
    chars = sorted({c for w in words for c in w if not c.isascii()})[::2]
    tokens += [t for c in chars for t in (c, "##" + c) if t not in vocab]
    path.write_text("".join(t + "\n" for t in tokens), "utf-8")
    return path


@pytest.fixture(scope="module", params=sorted(CASES))
def vocab(request, tmp_path_factory, shared_data, squad):
    lowercase = CASES[request.param]
    books = sorted(_need(shared_data / "text" / "gutenberg").glob("*.txt"))
    lines = [line for book in books[:6]
             for line in book.read_text("utf-8", errors="replace").splitlines()[:6000]]
    extra = [t for t in squad[0] + squad[1] if not t.isascii()]
    path = tmp_path_factory.mktemp(request.param) / "vocab.txt"
    return _train_vocab(path, lines, lowercase, extra), lowercase


def test_tokenize_matches_reference(vocab, corpus):
    vocab_file, lowercase = vocab
    ours = WordPieceTokenizer.from_vocab(vocab_file, lowercase=lowercase)
    ref = reference(vocab_file, lowercase)
    expected = [ref.tokenize(t, split_special_tokens=True) for t in corpus]
    got = ours.tokenize_batch(corpus)
    bad = [(t, g, e) for t, g, e in zip(corpus, got, expected) if g != e]
    assert not bad, bad[:3]
    assert [ours.tokenize(t) for t in corpus[::7]] == expected[::7]
    # Both code paths and the interesting inputs were really exercised.
    slow = sum(not ours._fast_ok(t) for t in corpus)
    assert 50 < slow < len(corpus) // 10
    flat = [p for pieces in got for p in pieces]
    assert flat.count("[UNK]") > 50 and sum(not p.isascii() for p in flat) > 500
    assert any(any("\u4e00" <= c <= "\u9fff" for c in p) for p in flat)
    assert ours.vocab_size == ref.vocab_size and ours.lowercase == lowercase


def test_strip_accents_options_match_reference(vocab, squad):
    vocab_file, lowercase = vocab
    texts = [t for t in squad[0] if not t.isascii()][:150]
    texts += [unicodedata.normalize("NFD", t) for t in texts[:50]]
    for strip in (True, False):
        ours = WordPieceTokenizer.from_vocab(vocab_file, lowercase=lowercase, strip_accents=strip)
        ref = reference(vocab_file, lowercase, strip_accents=strip)
        assert ours.tokenize_batch(texts) == [ref.tokenize(t) for t in texts]


@pytest.mark.parametrize("lowercase", [True, False])
def test_basic_tokenize_over_all_code_points(lowercase):
    """Rust fast path and Python fallback against the reference, each code point in context."""
    ref = BasicTokenizer(do_lower_case=lowercase)
    ours = WordPieceTokenizer(SPECIALS, lowercase=lowercase)
    points = [*range(0x30000), *range(0xE0000, 0xE1000), 0xF0000, 0x10FFFD]
    chars = [chr(i) for i in points if not 0xD800 <= i < 0xE000]
    fast = [c for c in chars if ours._fast_ok(c)]
    assert len(fast) > 50_000
    fast = fast[::2]
    for context in ("A{}b", "x{}\u0301y"):
        text = " ".join(context.format(c) for c in fast)
        assert ours._fast_ok(text)
        assert ours.basic_tokenize(text) == ref.tokenize(text), context
        text = " ".join(context.format(c) for c in chars[::17])  # mostly the Python fallback
        assert ours.basic_tokenize(text) == ref.tokenize(text), context


# None: nothing cut; 6: the specials leave room for a few tokens; 32: both sides cut; 128:
# contexts cut beside whole questions (what 384 did to SQuAD's longest contexts: the same
# longest-first path, so it is not a case of its own).
@pytest.mark.parametrize("max_length", [None, 6, 32, 128])
def test_encode_matches_reference(vocab, squad, corpus, max_length):
    vocab_file, lowercase = vocab
    ours = load_tokenizer(vocab_file.parent, lowercase=lowercase)
    ref = reference(vocab_file, lowercase)
    contexts, questions = squad
    pairs = list(zip(questions[::250], contexts[::50]))
    pairs += list(zip(contexts[5::50], questions[9::250]))  # longer first
    pairs += list(zip(corpus[::151], corpus[7::151])) + [("", ""), ("a", "")]
    trunc = dict(truncation="longest_first", max_length=max_length) if max_length else {}
    for a, b in pairs:
        for args in ((a, b), (a,)):
            want = ref(*args, split_special_tokens=True, return_token_type_ids=True, **trunc)
            got = ours.encode_pair(*args, max_length=max_length)
            assert got.input_ids == want["input_ids"], args
            assert got.token_type_ids == want["token_type_ids"], args
            assert got.tokens == ours.tokens(got.input_ids)
            if max_length:
                assert len(got.input_ids) <= max_length


def _truncate_seq_pair(tokens_a, tokens_b, max_length):
    """Verbatim from google-research/bert run_classifier.py."""
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_length:
            break
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


def test_truncation_is_truncate_seq_pair(vocab):
    """Every small length combination against the original run_classifier truncation."""
    ours = load_tokenizer(vocab[0].parent, lowercase=vocab[1])
    for n_a in range(10):
        for n_b in range(10):
            for max_length in range(3, 24):
                a, b = ["the"] * n_a, ["and"] * n_b
                _truncate_seq_pair(a, b, max_length - 3)
                want = ["[CLS]", *a, "[SEP]", *b, "[SEP]"]
                enc = ours.encode_pair(" ".join(["the"] * n_a), " ".join(["and"] * n_b), max_length)
                assert enc.tokens == want, (n_a, n_b, max_length)
                assert enc.token_type_ids == [0] * (len(a) + 2) + [1] * (len(b) + 1)
            a = ["the"] * n_a
            want = ["[CLS]", *a[:max(n_b, 2) - 2], "[SEP]"]
            assert ours.encode_pair(" ".join(a), max_length=max(n_b, 2)).tokens == want
    with pytest.raises(ValueError, match="max_length"):
        ours.encode_pair("a", "b", max_length=2)
    with pytest.raises(ValueError, match="max_length"):
        ours.encode_pair("a", max_length=1)


def test_ids_match_reference(vocab):
    vocab_file, lowercase = vocab
    ours = WordPieceTokenizer.from_vocab(vocab_file, lowercase=lowercase)
    ref = reference(vocab_file, lowercase)
    tokens = load_vocab(vocab_file)[::13] + ["no-such-token", "[MASK]"]
    assert ours.tokens_to_ids(tokens) == ref.convert_tokens_to_ids(tokens)
    ids = list(range(0, ours.vocab_size, 7))
    assert ours.ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids)
    specials = [ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id]
    assert specials == ref.convert_tokens_to_ids(SPECIALS) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="outside vocab"):
        ours.ids_to_tokens([ours.vocab_size])


def test_special_token_text(vocab):
    """Raw text never yields special tokens (like google-research/bert, unlike HF's trie)."""
    ours = WordPieceTokenizer.from_vocab(vocab[0], lowercase=vocab[1])
    ref = reference(*vocab)
    assert ours.tokenize("a [SEP] b") == ours.tokenize("a [ SEP ] b")
    assert "[SEP]" not in ours.tokenize("a [SEP] b")
    assert "[SEP]" in ref.tokenize("a [SEP] b", split_special_tokens=True)


def test_vocab_file_lines_like_hf(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes("\n".join([*SPECIALS, "a ", "b\r", "c\x0bd", "e\u2028f", "", "a ", "é"])
                     .encode("utf-8"))
    tokens = load_vocab(path)
    assert {t: i for i, t in enumerate(tokens)} == dict(hf_load_vocab(str(path)))
    assert "a " in tokens and "c\x0bd" in tokens and tokens[-1] == "é"


def test_save_round_trip(tmp_path, vocab):
    vocab_file, lowercase = vocab
    ours = WordPieceTokenizer.from_vocab(vocab_file, lowercase=lowercase, strip_accents=True)
    ours.save(tmp_path / "tok")
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text("utf-8"))
    assert config["do_lower_case"] is lowercase and config["strip_accents"] is True
    back = WordPieceTokenizer.from_pretrained_dir(tmp_path / "tok")
    assert (back.lowercase, back.strip_accents, back.vocab) == (lowercase, True, ours.vocab)
    assert (tmp_path / "tok" / "vocab.txt").read_bytes() == vocab_file.read_bytes()
    text = "Crème Brûlée, NAÏVE café 東京!"
    assert back.tokenize(text) == ours.tokenize(text)
    (tmp_path / "tok" / "tokenizer_config.json").unlink()  # HF default: do_lower_case=True
    assert WordPieceTokenizer.from_pretrained_dir(tmp_path / "tok").lowercase is True


def test_missing_special_token(tmp_path):
    """Only [UNK] is needed to tokenize (as in Google's tokenizer); the others where used."""
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(t for t in SPECIALS if t != "[MASK]") + "\nhello\n", "utf-8")
    assert WordPieceTokenizer.from_vocab(path, lowercase=True).mask_id is None
    tok = load_tokenizer(tmp_path)
    assert tok.tokens(tok.encode("hello")) == ["hello"] and tok.special_ids == {0, 1, 2, 3}
    with pytest.raises(ValueError, match=r"vocab\.txt: the vocab has no \[MASK\] token.*add \[MASK\]"):
        _ = tok.mask_id
    path.write_text("[PAD]\nhello\n", "utf-8")
    with pytest.raises(ValueError, match=r"vocab\.txt: vocab has no special token '\[UNK\]'"):
        WordPieceTokenizer.from_vocab(path, lowercase=True)


def test_missing_vocab_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        WordPieceTokenizer.from_vocab(tmp_path / "nope.txt", lowercase=True)
    with pytest.raises(FileNotFoundError, match="vocab.txt"):
        WordPieceTokenizer.from_pretrained_dir(tmp_path)


def test_decode_clean_up_spaces_matches_hf(vocab, corpus):
    """decode(clean_up_spaces=True) is the slow BertTokenizer's decode (clean_up_tokenization)."""
    vocab_file, lowercase = vocab
    ours = load_tokenizer(vocab_file.parent, lowercase=lowercase)
    ref = reference(vocab_file, lowercase)
    texts = corpus[::3]
    batch = ours.encode_batch(texts)
    want = [ref.decode(ids.tolist()) for ids in batch]
    assert [ours.decode(ids, clean_up_spaces=True) for ids in batch] == want
    assert sum(ours.decode(ids) != ours.decode(ids, clean_up_spaces=True) for ids in batch) > 100


def test_keep_special_tokens_matches_hf(vocab, corpus):
    """keep_special_tokens=True: literal special tokens whole, as HF's slow and fast tokenizers."""
    vocab_file, lowercase = vocab
    ours = load_tokenizer(vocab_file.parent, lowercase=lowercase, keep_special_tokens=True)
    fast = transformers.BertTokenizer(str(vocab_file), do_lower_case=lowercase)
    ref = reference(vocab_file, lowercase)
    texts = [f"{a} {s}{b}[SEP]x" for a, b, s in zip(corpus[::40], corpus[7::40], itertools.cycle(SPECIALS))]
    texts += ["[MASK]", "a[UNK]b [CLS] [mask] [MASK", "[[SEP]]"]
    got = [ours.tokens(ids) for ids in ours.encode_batch(texts)]
    assert got == [ref.tokenize(t) for t in texts]
    ascii_texts = [t for t in texts if t.isascii()]  # elsewhere the fast one is not the slow one
    assert [ours.tokens(ours.encode(t)) for t in ascii_texts] == [fast.tokenize(t) for t in ascii_texts]
    assert sum(t.count("[SEP]") for t in got) >= len(texts) - 3


def test_final_sigma_options_match_hf(vocab, corpus):
    """An uppercase Greek final sigma: 'ς' by Python's str.lower (Google, HF's slow tokenizer; our
    default), 'σ' by the Rust BertNormalizer (HF's fast tokenizer; final_sigma=False)."""
    assert BasicTokenizer(do_lower_case=True).tokenize("ΟΔΟΣ") == ["οδος"]
    assert normalizers.BertNormalizer(lowercase=True).normalize_str("ΟΔΟΣ") == "οδοσ"
    vocab_file, lowercase = vocab
    texts = [t for t in corpus if "Σ" in t and t.isupper()]  # the uppercased SQuAD Greek lines
    assert len(texts) > 5
    for final_sigma, ref in ((True, reference(vocab_file, lowercase)),
                             (False, transformers.BertTokenizer(str(vocab_file), do_lower_case=lowercase))):
        ours = load_tokenizer(vocab_file.parent, lowercase=lowercase, final_sigma=final_sigma)
        assert [ours.tokens(ids) for ids in ours.encode_batch(texts)] == [ref.tokenize(t) for t in texts]
        word = ("οδος" if final_sigma else "οδοσ") if lowercase else "ΟΔΟΣ"
        assert ours._wp.basic_tokenize("ΟΔΟΣ") == [word]


def _normalized(text: str, lowercase: bool) -> str:
    """text as the tokenizer normalizes it, without word breaks; final sigma folded, as a slice of a
    word loses the context that makes 'Σ' 'ς'."""
    return "".join(reference_basic_tokenize(text, lowercase)).replace("ς", "σ")


@pytest.fixture(scope="module")
def offset_texts(shared_data, squad, corpus) -> list[str]:
    """A few hundred WikiText-2 lines, SQuAD contexts and the corpus's odd lines (NFD accents,
    uppercase Greek, control characters, long words)."""
    wiki = [line for line in (shared_data / "text" / "wikitext2" / "valid.txt").read_text("utf-8")
            .splitlines() if line.strip()]
    contexts = squad[0]
    return wiki[:300] + contexts[:100] + [c for c in contexts if not c.isascii()][:100] + corpus[-200:]


def test_offsets_cover_their_tokens(vocab, offset_texts):
    """Every token's span of the original text normalizes to the token (without "##"), on the Rust
    fast path and the Python reference path alike; tokens are those of tokenize."""
    vocab_file, lowercase = vocab
    ours = WordPieceTokenizer.from_vocab(vocab_file, lowercase=lowercase)
    checked = slow = 0
    for text in offset_texts:
        tokens, spans = ours.tokenize_with_offsets(text)
        assert tokens == ours.tokenize(text)
        assert len(spans) == len(tokens) and all(0 <= lo < hi <= len(text) for lo, hi in spans)
        assert spans == sorted(spans), text
        for token, (lo, hi) in zip(tokens, spans):
            if token != "[UNK]":
                assert _normalized(text[lo:hi], lowercase) == token.removeprefix("##").replace("ς", "σ"), (
                    text, token, text[lo:hi])
                checked += 1
        slow += not ours._fast_ok(text) or not unicodedata.is_normalized("NFC", text)
    assert checked > 20_000 and slow > 30


def test_offsets_match_hf_fast(vocab, offset_texts):
    """Offsets equal HF's fast BertTokenizer's return_offsets_mapping wherever its tokens are ours
    (it lowercases 'Σ' to 'σ' and skips NFC, so a few lines differ). Where Rust's Unicode tables
    are not Python's (not _fast_ok) an [UNK] can stand for another word, so there [UNK]s are left
    out."""
    vocab_file, lowercase = vocab
    ours = load_tokenizer(vocab_file.parent, lowercase=lowercase)
    fast = transformers.BertTokenizer(str(vocab_file), do_lower_case=lowercase)
    same = slow = 0
    for text in offset_texts:
        ids, offsets = ours.encode_with_offsets(text)
        want = fast(text, add_special_tokens=False, return_offsets_mapping=True)
        if ids.tolist() != want["input_ids"]:
            continue
        keep = (ids != ours.unk_id) | ours._wp._fast_ok(text)
        hf = np.asarray(want["offset_mapping"]).reshape(-1, 2)
        assert offsets[keep].tolist() == hf[keep].tolist(), text
        same += 1
        slow += not ours._wp._fast_ok(text) or not unicodedata.is_normalized("NFC", text)
    assert same > 0.85 * len(offset_texts) and slow > 5, (same, slow)


@pytest.mark.parametrize("lowercase,text,expected", [
    (True, "Crème BRÛLÉE", [("creme", (0, 5)), ("brulee", (6, 12))]),
    (True, "cafe\u0301 x", [("cafe", (0, 4)), ("x", (6, 7))]),  # a stripped mark is in no token
    (False, "cafe\u0301 x", [("caf\u00e9", (0, 5)), ("x", (6, 7))]),  # NFC: "é" spans e + mark
    (True, "東京x", [("東", (0, 1)), ("京", (1, 2)), ("x", (2, 3))]),
    (True, "ab\x07c", [("ab", (0, 2)), ("##c", (3, 4))]),  # a removed control char: in no token
    (True, "ΟΔΟΣ.", [("ο", (0, 1)), ("##δ", (1, 2)), ("##ο", (2, 3)), ("##ς", (3, 4)), (".", (4, 5))]),
    (True, "İx ﬁ", [("ix", (0, 2)), ("[UNK]", (3, 4))]),  # "İ".lower() is 2 characters
    (False, "\u0958x", [("\u0915\u093c", (0, 1)), ("##x", (1, 2))]),  # NFC expands it to 2
])
def test_offsets_through_normalization(lowercase, text, expected):
    """Characters whose normalization changes length or depends on the word, on both paths
    (a rare character appended sends a text to the Python reference)."""
    vocab = [*SPECIALS, "creme", "brulee", "cafe", "caf\u00e9", "x", "東", "京", "ab", "##c", "ο",
             "##δ", "##ο", "##ς", ".", "ix", "\u0915\u093c", "##x"]
    wp = WordPieceTokenizer(vocab, lowercase=lowercase)
    for suffix, more in (("", []), (" \u0860", [("[UNK]", (len(text) + 1, len(text) + 2))])):
        tokens, spans = wp.tokenize_with_offsets(text + suffix)
        assert list(zip(tokens, spans)) == expected + more, suffix


def test_a_tokenizer_is_copied_into_a_folder_once_and_never_mixed_with_another(tmp_path):
    src, other = tmp_path / "vocab", tmp_path / "other"
    for folder, words in ((src, "the\ncat\n"), (other, "a\ndog\n")):
        folder.mkdir()
        (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n" + words)
    run = tmp_path / "run"
    run.mkdir()
    assert tokenizer_lib.copy_tokenizer(src, run) == ["vocab.txt"]
    assert tokenizer_lib.copy_tokenizer(src, run) == []  # a resumed run: its own files kept
    with pytest.raises(ValueError, match=f"{run}: already holds tokenizer files of another "
                                         rf"tokenizer than {other} \(vocab.txt:"):
        tokenizer_lib.copy_tokenizer(other, run)
    (other / "vocab.txt").write_bytes((src / "vocab.txt").read_bytes())
    (run / "spm.model").write_bytes(b"a file the source lacks")
    with pytest.raises(ValueError, match=r"\(spm.model: not"):
        tokenizer_lib.copy_tokenizer(other, run)
    assert (run / "vocab.txt").read_bytes() == (src / "vocab.txt").read_bytes()
