"""Named-entity recognition: CoNLL-style column files, BERT token features, conlleval scores."""

from __future__ import annotations

import dataclasses
import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bert_jax import config as config_lib
from bert_jax import paths, specs
from bert_jax.data.rows import BadRows, open_text
from bert_jax.data.tokenizer import Tokenizer
from bert_jax.specs import RunSpec
from bert_jax.tasks.base import Task, register

DOCSTART = "-DOCSTART-"


class NerFormatError(ValueError):
    """A malformed NER column file, or a tag outside the training label set."""


@dataclasses.dataclass
class Sentence:
    """One sentence's words and tags (None when the file is unlabeled)."""

    words: list[str]
    tags: list[str] | None
    line: int  # 1-based line of the first word; word i is on line + i


def _columns(line: str) -> list[str]:
    """A line's columns: tab-separated when it has a tab (tokens may hold spaces), else space-separated."""
    if "\t" in line:
        return line.split("\t")
    # Runs of ASCII spaces only: str.split() would also split tokens at e.g. U+00A0.
    line = line.strip(" ")
    return line.split(" ") if "  " not in line else re.split(r" +", line)


def read_columns(path: str | os.PathLike, *, tag_column: int = -1,
                 skip_bad_rows: bool = False) -> list[Sentence]:
    """Sentences of a CoNLL-style file: word first, tag in tag_column, blank lines between sentences."""
    sentences: list[Sentence] = []
    words: list[str] = []
    tags: list[str] = []
    first_line = ncols = dropped = 0
    bad = BadRows(path, skip_bad_rows, NerFormatError,
                  "; set data.skip_bad_rows=True to drop sentences with malformed lines")
    bad_sentence = False

    def end_sentence() -> None:
        nonlocal words, tags, bad_sentence, dropped
        if words or bad_sentence:
            if bad_sentence:
                dropped += 1
            else:
                sentences.append(Sentence(words, tags if ncols > 1 else None, first_line))
        words, tags, bad_sentence = [], [], False

    # utf-8-sig: a leading BOM would otherwise become part of the first word.
    with open_text(path, "utf-8-sig") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.rstrip("\r\n")
            if not line.strip():
                end_sentence()
                continue
            cols = _columns(line)
            if cols[0] == DOCSTART:  # a document boundary also ends a sentence
                end_sentence()
                continue
            if not words and not bad_sentence:
                first_line = lineno
            if not ncols:
                ncols = len(cols)
                if ncols > 1 and not -ncols <= tag_column < ncols:
                    raise ValueError(f"{path}: tag_column={tag_column} but lines have {ncols} columns")
            problem = None
            if len(cols) != ncols:
                problem = f"{len(cols)} columns {cols!r}, expected {ncols} as on the file's first line"
            elif not all(map(str.strip, cols)):
                problem = f"an empty token or tag in {cols!r}, expected {ncols} non-empty columns"
            if problem:
                bad(f"{path}, line {lineno}: found {problem}")
                bad_sentence = True
                continue
            words.append(cols[0])
            tags.append(cols[tag_column])
        end_sentence()
    bad.warn("read_columns", f"{dropped} sentence(s) with {bad.count} malformed line(s)")
    return sentences


def label_list(sentences: Sequence[Sentence]) -> tuple[str, ...]:
    """The tag set, sorted with 'O' first (so an all-zero label array means 'outside')."""
    if any(s.tags is None for s in sentences):
        raise ValueError("label_list: the sentences are unlabeled (a 1-column file); "
                         "read the labels from the training file")
    return tuple(sorted({t for s in sentences for t in s.tags}, key=lambda t: (t != "O", t)))


def check_tags(sentences: Sequence[Sentence], labels: Sequence[str], path: str | os.PathLike) -> None:
    """Raises NerFormatError naming file, line and tag for each tag not in labels (the train set's)."""
    known = set(labels)
    unknown = [(s.line + i, t) for s in sentences if s.tags is not None
               for i, t in enumerate(s.tags) if t not in known]
    if unknown:
        shown = "; ".join(f"line {line}: {tag!r}" for line, tag in unknown[:5])
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise NerFormatError(f"{path}: {len(unknown)} tag(s) not in the training labels "
                             f"{list(labels)}: {shown}{more}; fix the tags, or set data.labels (and "
                             "model.num_labels) to the tag set of the files")


@dataclasses.dataclass(frozen=True)
class NerFeatures:
    """Token-classification arrays (one row per sentence chunk) and where each labelled token came from."""

    input_ids: np.ndarray  # [N, T] int32: [CLS] pieces [SEP] [PAD]...
    attention_mask: np.ndarray  # [N, T] int32: 1 on real tokens
    token_type_ids: np.ndarray  # [N, T] int32, all 0
    label_ids: np.ndarray  # [N, T] int32: tag index at each word's first piece, else 0
    label_weights: np.ndarray  # [N, T] float32: 1 at each word's first piece, else 0
    sentence_index: np.ndarray  # [N] int32: the sentence each row is a chunk of
    word_index: np.ndarray  # [N, T] int32: word of each labelled piece in its sentence, else -1

    def __len__(self) -> int:
        return len(self.input_ids)


def _word_pieces(sentences: Sequence[Sentence], tokenizer: Tokenizer) -> dict[str, np.ndarray]:
    """Piece ids of each distinct word, tokenized alone; [UNK] for a word with no pieces."""
    unique = sorted({w for s in sentences for w in s.words})
    unk = np.array([tokenizer.unk_id], np.int32)
    pieces = {}
    for start in range(0, len(unique), 100_000):  # bounds the batch's memory on huge corpora
        batch = unique[start:start + 100_000]
        for word, ids in zip(batch, tokenizer.encode_batch(batch)):
            pieces[word] = ids if len(ids) else unk  # e.g. a lone control character
    return pieces


def _chunks(lengths: list[int], budget: int) -> list[tuple[int, int]]:
    """Greedy [start, stop) word ranges whose piece counts fit the budget (at least one word each)."""
    out, start, used = [], 0, 0
    for i, n in enumerate(lengths):
        if used + n > budget and i > start:
            out.append((start, i))
            start, used = i, 0
        used += n
    out.append((start, len(lengths)))
    return out


def encode(sentences: Sequence[Sentence], tokenizer: Tokenizer, labels: tuple[str, ...],
           max_seq_length: int) -> NerFeatures:
    """BERT features labelling each word's first piece; long sentences become several chunks."""
    budget = max_seq_length - 2  # room for [CLS] and [SEP]
    if budget < 1:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for words beside [CLS] [SEP]")
    index = {t: i for i, t in enumerate(labels)}
    pieces = _word_pieces(sentences, tokenizer)
    rows = []  # (sentence, first word, pieces of each word)
    for s_idx, s in enumerate(sentences):
        if s.tags is not None and (unknown := [t for t in s.tags if t not in index]):
            raise ValueError(f"encode: sentence at line {s.line} has tag {unknown[0]!r} not in labels "
                             f"{list(labels)} (check_tags lists every such tag with its line)")
        # A word longer than a whole sequence keeps its first pieces: its tag is still predicted.
        word_ids = [pieces[w][:budget] for w in s.words]
        for start, stop in _chunks([len(p) for p in word_ids], budget):
            rows.append((s_idx, start, word_ids[start:stop]))

    n, t = len(rows), max_seq_length
    input_ids = np.full((n, t), tokenizer.pad_id, np.int32)
    attention_mask = np.zeros((n, t), np.int32)
    label_ids = np.zeros((n, t), np.int32)
    word_index = np.full((n, t), -1, np.int32)
    sentence_index = np.array([r[0] for r in rows], np.int32)
    for r, (s_idx, start, word_ids) in enumerate(rows):
        lengths = np.array([len(p) for p in word_ids])
        first = 1 + np.concatenate([[0], np.cumsum(lengths)[:-1]])  # after [CLS]
        end = 1 + int(lengths.sum())
        input_ids[r, 0], input_ids[r, end] = tokenizer.cls_id, tokenizer.sep_id
        input_ids[r, 1:end] = np.concatenate(word_ids)
        attention_mask[r, :end + 1] = 1
        word_index[r, first] = np.arange(start, start + len(word_ids))
        tags = sentences[s_idx].tags
        if tags is not None:
            label_ids[r, first] = [index[g] for g in tags[start:start + len(word_ids)]]
    return NerFeatures(input_ids, attention_mask, np.zeros((n, t), np.int32), label_ids,
                       (word_index >= 0).astype(np.float32), sentence_index, word_index)


def decode_predictions(features: NerFeatures, pred_ids: np.ndarray, labels: Sequence[str],
                       num_sentences_words: Sequence[int]) -> list[list[str]]:
    """Each sentence's predicted word tags, read at each word's first piece."""
    pred_ids = np.asarray(pred_ids)
    if pred_ids.shape != features.word_index.shape:
        raise ValueError(f"pred_ids shape {pred_ids.shape} != features shape {features.word_index.shape}")
    out: list[list[str | None]] = [[None] * n for n in num_sentences_words]
    rows, cols = np.nonzero(features.word_index >= 0)
    for s, w, p in zip(features.sentence_index[rows].tolist(), features.word_index[rows, cols].tolist(),
                       pred_ids[rows, cols].tolist()):
        out[s][w] = labels[p]
    if missing := [s for s, tags in enumerate(out) if None in tags]:
        raise ValueError(f"decode_predictions: sentences {missing[:5]} have words with no prediction "
                         "(features built from other sentences?)")
    return out


# Chunking as seqeval's default (non-strict) mode, itself a port of conlleval.pl: a tag is a prefix
# (B I E S O) plus a type; an I- after O or after another type starts a chunk, so IOB1 scores too.
def _ends(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    return (prev_tag in ("E", "S") or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
            or (prev_tag not in ("O", ".") and prev_type != type_))


def _starts(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    return (tag in ("B", "S") or (prev_tag in ("E", "S", "O") and tag in ("E", "I"))
            or (tag not in ("O", ".") and prev_type != type_))


def get_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """(type, first, last) word index of each chunk in one sentence's tags, as seqeval.get_entities."""
    chunks, prev_tag, prev_type, begin = [], "O", "", 0
    for i, chunk in enumerate([*tags, "O"]):
        if not chunk:
            raise ValueError(f"get_entities: empty tag at position {i}")
        tag, type_ = chunk[0], chunk[1:].split("-", maxsplit=1)[-1] or "_"
        if _ends(prev_tag, tag, prev_type, type_):
            chunks.append((prev_type, begin, i - 1))
        if _starts(prev_tag, tag, prev_type, type_):
            begin = i
        prev_tag, prev_type = tag, type_
    return chunks


def _prf(correct: int, predicted: int, gold: int) -> dict[str, float]:
    """Precision, recall and F1 with 0 for an empty denominator (seqeval's zero_division default)."""
    p = correct / predicted if predicted else 0.0
    r = correct / gold if gold else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0}


def entity_scores(true_seqs: Sequence[Sequence[str]], pred_seqs: Sequence[Sequence[str]]) -> dict:
    """Micro-averaged entity precision/recall/f1 and support, plus 'per_type': {type: the same}."""
    if len(true_seqs) != len(pred_seqs):
        raise ValueError(f"entity_scores: {len(true_seqs)} gold sentences but {len(pred_seqs)} predicted")
    gold: set[tuple] = set()
    pred: set[tuple] = set()
    for i, (t, p) in enumerate(zip(true_seqs, pred_seqs)):
        if len(t) != len(p):
            raise ValueError(f"entity_scores: sentence {i} has {len(t)} gold tags but {len(p)} predicted")
        gold.update((typ, i, a, b) for typ, a, b in get_entities(t))
        pred.update((typ, i, a, b) for typ, a, b in get_entities(p))
    correct = gold & pred
    n_correct, n_pred, n_gold = (Counter(e[0] for e in es) for es in (correct, pred, gold))
    per_type = {typ: {**_prf(n_correct[typ], n_pred[typ], n_gold[typ]), "support": n_gold[typ]}
                for typ in sorted(n_gold | n_pred)}  # types only predicted are reported too, as seqeval
    return {**_prf(len(correct), len(pred), len(gold)), "support": len(gold), "per_type": per_type}


def write_tags(path: str | os.PathLike, sentences: Sequence[Sentence],
               pred_tags: Sequence[Sequence[str]]) -> Path:
    """Writes `word gold pred` lines, a blank line after each sentence (conlleval's input format).

    Unlabeled sentences get gold 'O', so the file keeps conlleval's three columns.
    """
    if len(sentences) != len(pred_tags):
        raise ValueError(f"write_tags: {len(sentences)} sentences but {len(pred_tags)} predictions")
    path = paths.path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with paths.open(path, "w", encoding="utf-8") as f:
        for s, pred in zip(sentences, pred_tags):
            if len(pred) != len(s.words):
                raise ValueError(f"write_tags: sentence at line {s.line} has {len(s.words)} words "
                                 f"but {len(pred)} predicted tags")
            gold = s.tags if s.tags is not None else ["O"] * len(s.words)
            for w, g, p in zip(s.words, gold, pred):
                # conlleval splits on whitespace, so a word holding spaces (tab files) must not.
                word = re.sub(r"\s+", "_", w)
                f.write(f"{word} {g} {p}\n")
            f.write("\n")
    return path


@register
class NerTask(Task):
    """Token tagging (CoNLL-2003, WNUT-17, any `token ... tag` column file), entity-level F1."""

    name = "ner"
    main_metric = "f1"
    file_kind = "a CoNLL column file (NER)"

    @classmethod
    def defaults(cls, config):
        super().defaults(config)
        config.optimizer.learning_rate = 5e-5

    @dataclasses.dataclass(frozen=True)
    class Data(specs.TaskData):
        labels: tuple = ()  # the tag set, 'O' first (model.num_labels = its length)

    @classmethod
    def looks_like(cls, head: bytes) -> bool:
        return head.startswith(DOCSTART.encode())

    def __init__(self, config: RunSpec):
        super().__init__(config)
        self.labels = self.data.labels
        if len(self.labels) != config.model.num_labels:
            raise config_lib.ConfigError(f"data.labels has {len(self.labels)} tags but model.num_labels="
                                         f"{config.model.num_labels}; set --config.model.num_labels="
                                         f"{len(self.labels)}")

    def labeled(self, split: str) -> bool:
        return all(s.tags is not None for s in self.examples(split))

    def read(self, path: Path, training: bool = False):
        sentences = read_columns(path, skip_bad_rows=self.data.skip_bad_rows)
        if sentences and sentences[0].tags is not None:
            check_tags(sentences, self.labels, path)
        return sentences

    def encode(self, sentences, training: bool):
        f = encode(sentences, self.tokenizer, self.labels, self.data.max_seq_length)
        keys = ("input_ids", "token_type_ids", "attention_mask", "label_ids", "label_weights")
        return {k: getattr(f, k) for k in keys}, f

    def _tags(self, split: str, outputs) -> list[list[str]]:
        sentences = self.examples(split)
        return decode_predictions(self.meta(split), np.argmax(outputs["logits"], -1),
                                  self.labels, [len(s.words) for s in sentences])

    def score(self, split: str, outputs) -> dict[str, float]:
        sentences = self.examples(split)
        s = entity_scores([x.tags for x in sentences], self._tags(split, outputs))
        return {"precision": s["precision"], "recall": s["recall"], "f1": s["f1"]}

    def write_predictions(self, split: str, outputs, out_dir: Path) -> list:
        out = paths.path(out_dir) / f"{self.path(split).stem}_predictions.txt"
        return [write_tags(out, self.examples(split), self._tags(split, outputs))]
