"""NER reader, features and entity scores on real CoNLL-2003 and WNUT-17, scores checked against seqeval."""

import random
import re
import warnings

import numpy as np
import pytest
from seqeval import metrics as sq
from seqeval.metrics.sequence_labeling import get_entities as sq_get_entities

from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.tasks import ner

CONLL_TAGS = ("O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER")
WNUT_TYPES = ("corporation", "creative-work", "group", "location", "person", "product")
# Published sizes: CoNLL-2003 English (Tjong Kim Sang & De Meulder 2003, sentences and tokens)
# and WNUT-17 (Derczynski et al. 2017: sentences / tokens of train, dev, test).
PUBLISHED = {
    "conll2003/train.txt": (14041, 203621), "conll2003/valid.txt": (3250, 51362),
    "conll2003/test.txt": (3453, 46435), "wnut17/wnut17train.conll": (3394, 62730),
    "wnut17/emerging.dev.conll": (1009, 15733), "wnut17/emerging.test.annotated": (1287, 23394),
}


@pytest.fixture(scope="module")
def conll(shared_data) -> dict[str, list[ner.Sentence]]:
    return {split: ner.read_columns(shared_data / "ner" / "conll2003" / f"{split}.txt")
            for split in ("train", "valid", "test")}


@pytest.fixture(scope="module")
def tokenizer(wordpiece_vocab):
    return tokenizer_lib.load_tokenizer(wordpiece_vocab.parent)


def _simple_counts(text: str) -> tuple[int, int]:
    """(sentences, tokens) counted naively: blank-line blocks and non-blank lines, minus -DOCSTART-."""
    blocks = [b for b in re.split(r"\n[ \t]*\n", text) if b.strip() and not b.startswith("-DOCSTART-")]
    tokens = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("-DOCSTART-")]
    return len(blocks), len(tokens)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_counts(shared_data, name):
    path = shared_data / "ner" / name
    sentences = ner.read_columns(path)
    counts = (len(sentences), sum(len(s.words) for s in sentences))
    assert counts == _simple_counts(path.read_text("utf-8")) == PUBLISHED[name]
    lines = path.read_text("utf-8").splitlines()
    for s in sentences:  # line points at the first word, and words sit on consecutive lines
        assert len(s.words) == len(s.tags)
        assert [re.split(r"[ \t]+", lines[s.line - 1 + i])[0] for i in (0, len(s.words) - 1)] == \
            [s.words[0], s.words[-1]]


def test_label_sets(shared_data, conll):
    labels = ner.label_list(conll["train"])
    assert labels == CONLL_TAGS
    for split in ("valid", "test"):
        assert ner.label_list(conll[split]) == labels
        ner.check_tags(conll[split], labels, split)
    wnut = ner.read_columns(shared_data / "ner" / "wnut17" / "wnut17train.conll")
    assert ner.label_list(wnut) == ("O", *(f"{p}-{t}" for p in "BI" for t in WNUT_TYPES))


def test_unknown_tag_names_file_line_and_tag(tmp_path, conll):
    path = tmp_path / "dev.txt"
    path.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrocks VBZ B-VP B-ROCK\n\n")
    with pytest.raises(ner.NerFormatError, match=r"dev\.txt.*line 4: 'B-ROCK'"):
        ner.check_tags(ner.read_columns(path), ner.label_list(conll["train"]), path)


def test_unlabeled_file(tmp_path):
    path = tmp_path / "raw.txt"
    path.write_text("-DOCSTART-\n\nPeter\nBlackburn\n\nBRUSSELS\n")
    sentences = ner.read_columns(path)
    assert sentences == [ner.Sentence(["Peter", "Blackburn"], None, 3), ner.Sentence(["BRUSSELS"], None, 6)]
    with pytest.raises(ValueError, match="unlabeled"):
        ner.label_list(sentences)


@pytest.mark.parametrize("bad_line, found", [
    ("German JJ B-MISC", "3 columns"),
    ("\tO", "an empty token"),
    ("German\tB-MISC\tx", "3 columns"),
])
def test_malformed_lines(tmp_path, capsys, bad_line, found):
    sep = "\t" if "\t" in bad_line else " NN B-NP "
    good = lambda word, tag: f"{word}{sep}{tag}\n"
    path = tmp_path / "bad.txt"
    path.write_text(good("EU", "B-ORG") + good("rejects", "O") + "\n" + bad_line + "\n"
                    + good("call", "O") + "\n" + good("last", "O"))
    with pytest.raises(ner.NerFormatError, match=rf"bad\.txt, line 4: found {found}") as e:
        ner.read_columns(path)
    assert "expected" in str(e.value) and "data.skip_bad_rows=True" in str(e.value)
    kept = ner.read_columns(path, skip_bad_rows=True)  # the bad sentence goes, the others stay
    assert [(s.words, s.tags, s.line) for s in kept] == [(["EU", "rejects"], ["B-ORG", "O"], 1),
                                                         (["last"], ["O"], 7)]
    assert "skipped 1 sentence(s) with 1 malformed line(s)" in capsys.readouterr().err


def test_encode_round_trip_with_splits(conll, tokenizer):
    """Every word gets exactly one labelled piece, its first; decoding gold ids gives back gold tags."""
    sentences, labels, t = conll["valid"], ner.label_list(conll["train"]), 32
    f = ner.encode(sentences, tokenizer, labels, t)
    assert len(f) > len(sentences)  # short max_seq_length: long sentences were split
    assert f.input_ids.shape == f.label_ids.shape == f.word_index.shape == (len(f), t)
    assert f.input_ids.dtype == f.label_ids.dtype == f.attention_mask.dtype == np.int32
    assert f.label_weights.dtype == np.float32 and not f.token_type_ids.any()
    assert np.array_equal(f.label_weights, (f.word_index >= 0).astype(np.float32))
    assert (f.input_ids[:, 0] == tokenizer.cls_id).all()
    lengths = f.attention_mask.sum(1)
    assert (f.input_ids[np.arange(len(f)), lengths - 1] == tokenizer.sep_id).all()
    assert (f.input_ids[f.attention_mask == 0] == tokenizer.pad_id).all()
    assert (f.label_weights[f.attention_mask == 0] == 0).all() and (f.label_weights[:, 0] == 0).all()
    per_sentence = np.bincount(f.sentence_index, f.label_weights.sum(1), len(sentences))
    assert per_sentence.tolist() == [len(s.words) for s in sentences]
    assert (np.diff(f.sentence_index) >= 0).all()

    # Each sentence's chunks hold exactly its words' pieces, in order; labels sit on first pieces.
    unique = sorted({w for s in sentences for w in s.words})
    pieces = dict(zip(unique, tokenizer.encode_batch(unique)))
    rows = np.split(np.arange(len(f)), np.flatnonzero(np.diff(f.sentence_index)) + 1)
    for s_idx, r in zip(np.unique(f.sentence_index), rows):
        s = sentences[s_idx]
        got = np.concatenate([f.input_ids[i, 1:lengths[i] - 1] for i in r])
        want = np.concatenate([pieces[w] if len(pieces[w]) else [tokenizer.unk_id] for w in s.words])
        assert np.array_equal(got, want)
        words = f.word_index[r][f.word_index[r] >= 0]
        assert words.tolist() == list(range(len(s.words)))
        firsts = f.input_ids[r][f.word_index[r] >= 0]
        assert firsts.tolist() == [pieces[w][0] if len(pieces[w]) else tokenizer.unk_id for w in s.words]
        assert [labels[i] for i in f.label_ids[r][f.word_index[r] >= 0]] == s.tags

    decoded = ner.decode_predictions(f, f.label_ids, labels, [len(s.words) for s in sentences])
    assert decoded == [s.tags for s in sentences]


def test_encode_odd_words(tokenizer):
    """A word with no pieces becomes [UNK]; a word longer than a sequence is cut but still predicted."""
    long_word = "-".join(["a"] * 40)  # 79 pieces: every '-' is punctuation
    s = ner.Sentence(["\x07", "Peter", long_word, "x"], ["O", "B-PER", "O", "B-LOC"], 1)
    f = ner.encode([s], tokenizer, CONLL_TAGS, 8)
    assert tokenizer.encode("\x07").size == 0 and f.input_ids[0, 1] == tokenizer.unk_id
    assert f.sentence_index.tolist() == [0, 0, 0]  # [UNK] Peter | long word | x
    assert f.attention_mask[1].all() and f.word_index[1].tolist() == [-1, 2, -1, -1, -1, -1, -1, -1]
    assert ner.decode_predictions(f, f.label_ids, CONLL_TAGS, [4]) == [s.tags]
    unlabeled = ner.encode([ner.Sentence(s.words, None, 1)], tokenizer, CONLL_TAGS, 8)
    assert np.array_equal(unlabeled.word_index, f.word_index) and not unlabeled.label_ids.any()
    with pytest.raises(ValueError, match="'B-ROCK' not in labels"):
        ner.encode([ner.Sentence(["x"], ["B-ROCK"], 1)], tokenizer, CONLL_TAGS, 8)


def _corrupt(seqs: list[list[str]], tags: tuple[str, ...], rate: float, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[rng.choice(tags) if rng.random() < rate else t for t in s] for s in seqs]


def _assert_like_seqeval(gold: list[list[str]], pred: list[list[str]]) -> dict:
    ours = ner.entity_scores(gold, pred)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval warns on 0/0 and on non-IOB tags
        assert ours["precision"] == sq.precision_score(gold, pred)
        assert ours["recall"] == sq.recall_score(gold, pred)
        assert ours["f1"] == sq.f1_score(gold, pred)
        report = sq.classification_report(gold, pred, output_dict=True)
        for s in pred:
            assert ner.get_entities(s) == sq_get_entities(s)
    assert ours["support"] == report["micro avg"]["support"]
    types = {k: v for k, v in report.items() if not k.endswith(" avg")}
    assert sorted(ours["per_type"]) == sorted(types)
    for typ, row in types.items():
        assert ours["per_type"][typ] == {"precision": row["precision"], "recall": row["recall"],
                                         "f1": row["f1-score"], "support": row["support"]}
    return ours


def test_scores_match_seqeval_on_valid(conll):
    gold = [s.tags for s in conll["valid"]]
    perfect = _assert_like_seqeval(gold, gold)
    assert perfect["precision"] == perfect["recall"] == perfect["f1"] == 1.0
    assert perfect["support"] == 5942  # CoNLL-2003 English dev entities, as conlleval counts them
    for rate, seed in [(0.02, 0), (0.1, 1), (0.5, 2)]:
        scores = _assert_like_seqeval(gold, _corrupt(gold, CONLL_TAGS, rate, seed))
        assert 0 < scores["f1"] < 1


@pytest.mark.parametrize("gold, pred", [
    ([["B-PER", "I-PER", "O"]], [["O", "O", "O"]]),  # no predictions
    ([["O", "O"], []], [["O", "O"], []]),  # no gold, no predictions
    ([["O", "O"]], [["B-LOC", "O"]]),  # no gold
    ([["O", "I-PER", "I-PER", "I-LOC", "B-LOC", "I-ORG"]],
     [["I-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-ORG"]]),  # I- starting chunks, type changes
    ([["I-PER", "I-PER", "B-PER", "O", "I-LOC"]], [["I-PER", "B-PER", "I-PER", "O", "B-LOC"]]),  # IOB1
    ([["B-PER", "E-PER", "S-LOC", "O", "B-ORG", "I-ORG", "E-ORG"]],
     [["S-PER", "E-PER", "S-LOC", "I-ORG", "B-ORG", "E-ORG", "E-ORG"]]),  # IOBES
    ([["B", "I", "O", "B-X", "O", "I", "I"]], [["B", "B", "O", "I-X", "I", "O", "I"]]),  # untyped tags
])
def test_scores_edge_cases(gold, pred):
    _assert_like_seqeval(gold, pred)


def test_scores_errors():
    assert ner.entity_scores([], []) == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0,
                                         "per_type": {}}
    with pytest.raises(ValueError, match="sentence 1 has 2 gold tags but 1 predicted"):
        ner.entity_scores([["O"], ["O", "O"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match="2 gold sentences but 1"):
        ner.entity_scores([["O"], ["O"]], [["O"]])


def test_write_tags_round_trips(tmp_path, conll):
    sentences = conll["test"][:50]
    pred = _corrupt([s.tags for s in sentences], CONLL_TAGS, 0.2, 3)
    path = ner.write_tags(tmp_path / "out" / "pred.txt", sentences, pred)
    gold_back = ner.read_columns(path, tag_column=1)
    assert [(s.words, s.tags) for s in gold_back] == [(s.words, s.tags) for s in sentences]
    assert [s.tags for s in ner.read_columns(path)] == pred
    assert path.read_text().count("\n\n") == len(sentences)
