"""BERT pretraining examples on real text (Gutenberg books): readers, NSP pairs, masking stats."""

import dataclasses
import gzip
import itertools

import numpy as np
import pytest

from bert_jax.data.pretraining import (
    Instance,
    create_instances,
    document_rng,
    iter_documents,
    mask_instance,
    split_sentences,
    to_features,
    tokenize_document,
    truncate_seq_pair,
)
from bert_jax.data.tokenizer import load_tokenizer

MAX_LEN, MAX_PRED, DOCS_PER_BOOK = 128, 20, 36
MAX_NUM_TOKENS = MAX_LEN - 3


def test_split_sentences():
    cases = {
        "One here.  Two\nthere! Three? four.": ["One here.", "Two there!", "Three? four."],
        "Mr. and Mrs. Smith met Dr. Jones at St. Paul's. Then they left.":
            ["Mr. and Mrs. Smith met Dr. Jones at St. Paul's.", "Then they left."],
        "Use a tool, e.g. A hammer, i.e. This one. By G. K. Chesterton. Done.":
            ["Use a tool, e.g. A hammer, i.e. This one.", "By G. K. Chesterton.", "Done."],
        '"Go away." She left. "Why?" he asked. \'Fine.\' (Later.) 1816 came.':
            ['"Go away."', "She left.", '"Why?" he asked.', "'Fine.'", "(Later.)", "1816 came."],
        "It cost 3.50 dollars. the end... And more": ["It cost 3.50 dollars. the end...", "And more"],
        "  ": [],
    }
    for text, want in cases.items():
        assert split_sentences(text) == want, text


def test_iter_documents_sentences(tmp_path):
    text = "First sentence.\n  Second one.  \n\n\n \t\nOther doc.\n\n"
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    with gzip.open(tmp_path / "a.txt.gz", "wt", encoding="utf-8") as f:
        f.write(text)
    want = [["First sentence.", "Second one."], ["Other doc."]]
    assert list(iter_documents(tmp_path / "a.txt", "sentences")) == want
    assert list(iter_documents(tmp_path / "a.txt.gz", "sentences")) == want
    with pytest.raises(ValueError, match="fmt"):
        next(iter_documents(tmp_path / "a.txt", "lines"))


def test_iter_documents_paragraphs(tmp_path):
    text = ("CHAPTER I\n\n\nEmma Woodhouse was\nrich. She was clever.\n\nMr. Knightley came.\n\n"
            "It rained. It stopped! Why? Nobody knew.\n\nThe end\n")
    (tmp_path / "book.txt").write_text(text, encoding="utf-8")
    # Whole paragraphs; a document closes at the first paragraph end with >= 3 sentences.
    assert list(iter_documents(tmp_path / "book.txt", "paragraphs", doc_sentences=3)) == [
        ["CHAPTER I", "Emma Woodhouse was rich.", "She was clever."],
        ["Mr. Knightley came.", "It rained.", "It stopped!", "Why?", "Nobody knew."],
        ["The end"]]
    # `document`: the whole file one document (long inputs)
    assert list(iter_documents(tmp_path / "book.txt", "document", doc_sentences=3)) == [
        ["CHAPTER I", "Emma Woodhouse was rich.", "She was clever.", "Mr. Knightley came.",
         "It rained.", "It stopped!", "Why?", "Nobody knew.", "The end"]]


def test_truncate_seq_pair_matches_the_original_loop():
    rng = np.random.default_rng(0)
    for len_a, len_b, budget in itertools.product([1, 2, 7, 60, 130], [1, 3, 60, 64, 200], [2, 5, 125]):
        a, b = np.arange(len_a), np.arange(1000, 1000 + len_b)
        ta, tb = truncate_seq_pair(a, b, budget, rng)
        la, lb = len_a, len_b  # the original: pop from the longer side, B on ties
        while la + lb > budget:
            la, lb = (la - 1, lb) if la > lb else (la, lb - 1)
        assert (len(ta), len(tb)) == (la, lb)
        assert np.all(np.diff(ta) == 1) and np.all(np.diff(tb) == 1)  # one contiguous span each


@pytest.fixture(scope="module")
def tokenizer(wordpiece_vocab):
    return load_tokenizer(wordpiece_vocab.parent, lowercase=True)


@pytest.fixture(scope="module")
def docs(shared_data, tokenizer):
    """The first DOCS_PER_BOOK documents of each Gutenberg book, tokenized (~470 documents)."""
    books = sorted((shared_data / "text" / "gutenberg").glob("*.txt"))
    out = [tokenize_document(doc, tokenizer) for book in books
           for doc in itertools.islice(iter_documents(book, "paragraphs"), DOCS_PER_BOOK)]
    assert len(out) > 300 and all(out)
    return out


def masking(tok):
    """Masking arguments: [UNK] stays a prediction target, as in the original."""
    return dict(cls_id=tok.cls_id, sep_id=tok.sep_id, max_seq_length=MAX_LEN,
                max_predictions_per_seq=MAX_PRED, vocab_size=tok.vocab_size, mask_id=tok.mask_id,
                special_ids={tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id})


@dataclasses.dataclass
class Example:
    doc: int
    instance: Instance
    features: dict | None
    b_doc: int | None  # the document a random B was read from


def _logged(docs, calls):
    return lambda j: (calls.append(j), docs[j])[1]


def build(docs, tok, seed, *, epoch=0, short_seq_prob=0.1, whole_word=False, features=True):
    starts = tok.word_starts(np.arange(tok.vocab_size)) if whole_word else None
    out = []
    for i, doc in enumerate(docs):
        rng, calls = document_rng(seed, i, epoch), []
        instances = create_instances(doc, i, num_docs=len(docs), get_doc=_logged(docs, calls),
                                     max_seq_length=MAX_LEN, short_seq_prob=short_seq_prob, rng=rng)
        sources = iter(calls)
        for inst in instances:
            feats = to_features(inst, rng=rng, starts_word=starts, **masking(tok)) if features else None
            out.append(Example(i, inst, feats, next(sources) if inst.is_random_next else None))
        assert next(sources, None) is None  # one get_doc call per random-next instance
    return out


@pytest.fixture(scope="module")
def examples(docs, tokenizer):
    return build(docs, tokenizer, seed=0)


def _contains(hay: np.ndarray, needle: np.ndarray) -> bool:
    """Whether needle is a contiguous run of hay."""
    h, n = hay.astype("<i4").tobytes(), needle.astype("<i4").tobytes()
    start = h.find(n)
    while start != -1 and start % 4:
        start = h.find(n, start + 1)
    return start != -1


def _chosen(f):
    k = int(f["masked_lm_weights"].sum())
    return f["masked_lm_positions"][:k], f["masked_lm_ids"][:k]


def test_layout_lengths_and_sources(examples, docs, tokenizer):
    for ex in examples:
        a, b, f = ex.instance.tokens_a, ex.instance.tokens_b, ex.features
        assert len(a) >= 1 and len(b) >= 1 and len(a) + len(b) <= MAX_NUM_TOKENS
        assert {k: (v.shape, v.dtype.name) for k, v in f.items()} == {
            **{k: ((MAX_LEN,), "int32") for k in ("input_ids", "token_type_ids", "attention_mask")},
            **{k: ((MAX_PRED,), "int32") for k in ("masked_lm_positions", "masked_lm_ids")},
            "masked_lm_weights": ((MAX_PRED,), "float32"), "next_sentence_labels": ((), "int32")}
        n = len(a) + len(b) + 3
        positions, labels = _chosen(f)
        ids = f["input_ids"].copy()
        ids[positions] = labels
        want = np.concatenate([[tokenizer.cls_id], a, [tokenizer.sep_id], b, [tokenizer.sep_id]])
        np.testing.assert_array_equal(ids, np.pad(want, (0, MAX_LEN - n)))
        np.testing.assert_array_equal(f["attention_mask"], np.arange(MAX_LEN) < n)
        np.testing.assert_array_equal(f["token_type_ids"], [0] * (len(a) + 2) + [1] * (len(b) + 1)
                                      + [0] * (MAX_LEN - n))
        assert int(f["next_sentence_labels"]) == ex.instance.is_random_next
        # A is always from this document; B from another one exactly when it is random next.
        own = np.concatenate(docs[ex.doc])
        assert _contains(own, a)
        if ex.instance.is_random_next:
            assert ex.b_doc != ex.doc and _contains(np.concatenate(docs[ex.b_doc]), b)
        else:
            assert _contains(own, b)


def test_masking_rate_and_no_special_tokens(examples, tokenizer):
    special = [tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id]
    chosen = total = 0
    for ex in examples:
        f = ex.features
        n = int(f["attention_mask"].sum())
        positions, labels = _chosen(f)
        # Exactly the original's count: round(15% of all n tokens incl. specials), capped.
        assert len(positions) == min(MAX_PRED, max(1, int(round(n * 0.15))))
        assert np.all(np.diff(positions) > 0) and np.all(positions < n)
        assert not np.isin(labels, special).any()
        chosen, total = chosen + len(positions), total + n
    # Rounding moves each sequence by <= 0.5 token (<= 0.4% of a full 128-token one); most are
    # full, so 15% +- 0.5% (the floor of 1 and the cap of 20 hardly bind at this length).
    assert abs(chosen / total - 0.15) < 0.005, chosen / total


def test_80_10_10(examples, tokenizer):
    masked = kept = other = 0
    for ex in examples:
        positions, labels = _chosen(ex.features)
        got = ex.features["input_ids"][positions]
        masked += int(np.sum(got == tokenizer.mask_id))
        kept += int(np.sum(got == labels))
        other += int(np.sum((got != labels) & (got != tokenizer.mask_id)))
    n = masked + kept + other
    num_random = tokenizer.vocab_size - 4  # the non-special ids a random replacement takes
    for count, p in [(masked, 0.8), (kept, 0.1 + 0.1 / num_random), (other, 0.1 - 0.1 / num_random)]:
        assert abs(count - n * p) < 5 * np.sqrt(n * p * (1 - p)), (count, n, p)  # 5 binomial sd


def test_next_sentence_balance(docs, tokenizer):
    ex = build(docs, tokenizer, seed=0, short_seq_prob=0.0, features=False)
    n, random_next = len(ex), sum(e.instance.is_random_next for e in ex)
    # A chunk of one sentence always takes a random B (as in the original): at most one per
    # document (its last sentence) plus one per sentence that alone fills a sequence.
    forced = len(docs) + sum(len(s) >= MAX_NUM_TOKENS for d in docs for s in d)
    sd = np.sqrt(n * 0.25)
    assert n / 2 - 4 * sd < random_next < n / 2 + forced / 2 + 4 * sd, (random_next, n, forced)


def test_short_seq_prob(docs, tokenizer):
    """Per document (as the original), with prob 0.1 the target length is short."""
    def short_docs(prob):
        ex = build(docs, tokenizer, seed=0, short_seq_prob=prob, features=False)
        lengths = [[] for _ in docs]
        for e in ex:
            lengths[e.doc].append(len(e.instance.tokens_a) + len(e.instance.tokens_b))
        return np.array([np.median(ls) < MAX_NUM_TOKENS for ls in lengths])
    # A document is seen as short when most of its instances are under the full length; the
    # rates of that with a never- and an always-short target calibrate what 10% should give.
    p0, p1, got = short_docs(0.0).mean(), short_docs(1.0).mean(), short_docs(0.1).sum()
    assert p0 < 0.02 and p1 > 0.6, (p0, p1)
    n, p = len(docs), 0.1 * p1 + 0.9 * p0
    assert abs(got - n * p) < 4 * np.sqrt(n * p * (1 - p)), (got, n, p)  # 4 binomial sd


def test_same_seed_same_examples(docs, tokenizer):
    few = docs[:60]
    first, again = build(few, tokenizer, seed=0), build(few, tokenizer, seed=0)
    assert len(first) == len(again)
    for e, g in zip(first, again):
        assert all(np.array_equal(e.features[k], g.features[k]) for k in e.features)
    for changed in (build(few, tokenizer, seed=1), build(few, tokenizer, seed=0, epoch=1)):
        assert any(not np.array_equal(e.features["input_ids"], g.features["input_ids"])
                   for e, g in zip(first, changed))


def test_whole_word_masking(docs, tokenizer):
    ex = build(docs[:150], tokenizer, seed=0, whole_word=True)
    starts = tokenizer.word_starts(np.arange(tokenizer.vocab_size))
    special = {tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id}
    chosen = budget = multi = 0
    for e in ex:
        f = e.features
        n = int(f["attention_mask"].sum())
        positions, labels = _chosen(f)
        ids = f["input_ids"].copy()
        ids[positions] = labels
        # Word ids: a new word at each word-start piece, special token or piece after one.
        new_word = starts[ids[:n]] | np.isin(ids[:n], list(special))
        new_word[1:] |= np.isin(ids[:n - 1], list(special))
        word = np.cumsum(new_word)
        picked = np.isin(np.arange(n), positions)
        for w in np.unique(word[positions]):
            assert picked[word == w].all(), "part of a word masked"
        multi += int(np.any(np.bincount(word[positions]) > 1))
        expected = min(MAX_PRED, max(1, int(round(n * 0.15))))
        assert len(positions) <= expected
        chosen, budget = chosen + len(positions), budget + expected
    # Whole words that do not fit are skipped, so a sequence may stop a little short.
    assert chosen / budget > 0.97 and multi > len(ex) / 4, (chosen / budget, multi, len(ex))


def test_random_token_ids(tokenizer):
    tokens = np.array([tokenizer.cls_id, *range(5, 105), tokenizer.sep_id], np.int32)
    allowed = np.array([7, 11])
    masked, positions, labels = mask_instance(
        tokens, rng=np.random.default_rng(0), vocab_size=tokenizer.vocab_size,
        special_ids={tokenizer.cls_id, tokenizer.sep_id}, mask_id=tokenizer.mask_id,
        max_predictions_per_seq=100, masked_lm_prob=1.0, random_token_ids=allowed)
    assert len(positions) == 100 and np.array_equal(labels, tokens[1:-1])
    changed = masked[positions][(masked[positions] != labels)
                                & (masked[positions] != tokenizer.mask_id)]
    assert len(changed) and np.isin(changed, allowed).all()
