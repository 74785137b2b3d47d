"""Pairs of texts for sentence-embedding training (data.name=pairs, model.name=bert_embedding,
training/contrastive.py): a query with its positive and optional hard negatives, or two
sentences with a similarity score.

Files (local or gs://), by their first character:
- JSON lines: {"query" (or "anchor", "sentence1"), "positive" (or "sentence2"), optional
  "negatives" (a list) or "negative", optional "score"}; a record per line;
- a SQuAD JSON file: each question with its paragraph (SQuAD-train for training, SQuAD-dev
  as a retrieval benchmark of 2,067 paragraphs);
- TSV with a header naming the columns: query/anchor/sentence1, positive/sentence2, negative
  columns (negative, negative_1, ...) and score; the GLUE STS-B files read as they are (scored
  pairs), and the GLUE MRPC files as their paraphrases (Quality 1: the first sentence as the
  query, the second as its positive);
- for training, a BEIR folder (corpus.jsonl, queries.jsonl, qrels/train.tsv) or one of its
  qrels/<split>.tsv files: each query with each of its relevant documents.
A training row needs data.num_negatives negatives (the first ones are used when it has more).

Scores: a file with scores is STS (Pearson and Spearman of the cosines, main metric
spearman_cosine); one without is retrieval: every distinct positive of the split is the
corpus, each distinct query's relevant documents are its positives (nDCG@10, MRR@10,
Recall@k, MAP@100 as sentence-transformers' InformationRetrievalEvaluator, main ndcg@10).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from bert_jax import config as config_lib
from bert_jax import paths, specs
from bert_jax.data import finetune
from bert_jax.data.rows import BadRows, jsonl_rows, open_text
from bert_jax.tasks import retrieval, scoring, squad
from bert_jax.tasks.base import Task, register

QUERY_KEYS = ("query", "anchor", "sentence1")
POSITIVE_KEYS = ("positive", "sentence2")


class PairsFormatError(ValueError):
    """A malformed pair row: names the file, line, field, what was found and expected."""


@dataclasses.dataclass(frozen=True)
class Example:
    guid: str
    query: str
    positive: str
    negatives: tuple[str, ...]
    score: float | None  # scored pairs (STS); None: a query and its positive

    @property
    def label(self):  # what Task.labeled asks: every pair has its positive
        return self.positive if self.score is None else self.score


def _text(row: dict, keys: tuple[str, ...], line: int, bad: BadRows) -> str | None:
    if len(given := [k for k in keys if k in row]) > 1:  # which one is meant? (none is dropped)
        bad.found(line, f"fields {' and '.join(map(repr, given))}", row[given[1]],
                  f"one of them (each names the same text: {', '.join(keys)})")
        return None
    key = next((k for k in keys if k in row), keys[0])
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        bad.found(line, f"field {key!r}", value, "a non-empty string"
                  + ("" if key in row else f" (one of the fields {', '.join(keys)})"))
        return None
    return value


def _score(value: Any, text: bool) -> float | None:
    """A row's score as a finite float, or None when it is not one: a JSON number (not true or
    false, nor a string), or in a TSV file the column's text of a number."""
    if text and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        return None
    return float(value)


def _example(row: dict, line: int, guid: str, bad: BadRows, num_negatives: int,
             text_scores: bool = False) -> Example | None:
    query, positive = _text(row, QUERY_KEYS, line, bad), _text(row, POSITIVE_KEYS, line, bad)
    if query is None or positive is None:
        return None
    if "negatives" in row and "negative" in row:
        bad.found(line, "fields 'negatives' and 'negative'", row["negative"], "one of them")
        return None
    negatives = row.get("negatives", [row["negative"]] if "negative" in row else [])
    if not isinstance(negatives, list) or not all(isinstance(n, str) and n.strip() for n in negatives):
        bad.found(line, "field 'negatives'", negatives, "a list of non-empty strings")
        return None
    if len(negatives) < num_negatives:
        bad.found(line, "negatives", f"{len(negatives)}", f"at least data.num_negatives="
                  f"{num_negatives} (set it lower, or give each row that many)")
        return None
    score = row.get("score")
    if score is not None and (score := _score(row["score"], text_scores)) is None:
        found = json.dumps(row["score"]) if isinstance(row["score"], bool) else row["score"]
        bad.found(line, "field 'score'", found, "a finite number" + (
            "" if text_scores else " (a JSON number, not a string or true/false)"))
        return None
    return Example(guid, query, positive, tuple(negatives), score)


MRPC = ("Quality", "#1 String", "#2 String")  # the GLUE MRPC files' columns: paraphrases


def _tsv_rows(f, path, bad: BadRows):
    header = f.readline().rstrip("\r\n").split("\t")
    if all(c in header for c in MRPC):  # the paraphrases (Quality 1) as query and positive
        header = [{"Quality": "_quality", "#1 String": "query", "#2 String": "positive"}.get(c, f"_{c}")
                  for c in header]
    if not any(k in header for k in QUERY_KEYS) or not any(k in header for k in POSITIVE_KEYS):
        raise PairsFormatError(
            f"{path}:1: header {header[:8]}: expected a header naming the columns "
            f"({'/'.join(QUERY_KEYS)}, {'/'.join(POSITIVE_KEYS)}, optional negative_1.. and score)")
    if twice := next((c for i, c in enumerate(header) if c in header[:i]), None):
        raise PairsFormatError(f"{path}:1: header names the column {twice!r} twice; name each "
                               "column once (negatives: negative_1, negative_2, ...)")
    negative_cols = [c for c in header if c == "negative" or c.startswith("negative_")]
    for line, text in enumerate(f, 2):
        if not text.strip():
            continue
        cols = text.rstrip("\r\n").split("\t")
        if len(cols) != len(header):
            bad.found(line, "row", f"{len(cols)} columns", f"{len(header)} as the header")
            continue
        row = dict(zip(header, cols))
        if row.pop("_quality", "1") != "1":  # an MRPC pair that is not a paraphrase
            continue
        row["negatives"] = [row.pop(c) for c in negative_cols]
        if "score" in row and row["score"] == "":
            row.pop("score")
        yield line, row


def read_pairs(path, *, num_negatives: int = 0, skip_bad_rows: bool | None = False) -> list[Example]:
    """The examples of a pair file (the module docstring's formats); `skip_bad_rows` None:
    read outside a run's config (`mine`), where BadRows' hint is to fix the row."""
    path = paths.path(path)
    bad = BadRows(path, skip_bad_rows, PairsFormatError)
    with open_text(path, "utf-8-sig") as f:
        head = f.read(4096)
        f.seek(0)
        if not head.strip():
            raise PairsFormatError(f"{path}: empty (or blank); expected a pair file: JSON lines, "
                                   "TSV with a header, or SQuAD JSON")
        if head.lstrip().startswith("{") and '"paragraphs"' in head:
            return _squad_pairs(path, num_negatives)
        jsonl = head.lstrip().startswith("{")
        rows = jsonl_rows(f, bad) if jsonl else _tsv_rows(f, path, bad)
        out = [e for line, row in rows
               if (e := _example(row, line, f"{path.stem}-{line}", bad, num_negatives, not jsonl))]
    bad.warn("read_pairs", f"{bad.count} malformed row(s) of {path}")
    if out and len({e.score is None for e in out}) > 1:
        raise PairsFormatError(f"{path}: some rows have a score and some not; a file is either "
                               "scored pairs (every row's score) or queries with positives")
    return out


def beir_source(path) -> tuple[Any, str] | None:
    """(folder, qrels split) when `path` is a BEIR folder (corpus.jsonl, queries.jsonl,
    qrels/: its train split) or one of its qrels/<split>.tsv files; else None."""
    path = paths.path(path)
    if path.is_dir() and (path / "corpus.jsonl").exists():
        return path, "train"
    if (path.suffix == ".tsv" and path.parent.name == "qrels"
            and (path.parent.parent / "corpus.jsonl").exists()):
        return path.parent.parent, path.stem
    return None


def beir_pairs(folder, split: str) -> list[Example]:
    """Each query of a BEIR folder's qrels/<split>.tsv with each of its relevant documents
    (score > 0) as a pair, in the qrels' order of queries (a query's documents by id);
    relevant ids the corpus lacks are left out (and said)."""
    corpus, queries, relevant = retrieval.read_beir(
        folder, split, missing="left out of training, having no document to pair the query with; "
        "remove those rows to silence this")
    return [Example(f"{qid}-{doc}", queries[qid], corpus[doc], (), None)
            for qid, docs in relevant.items() for doc in sorted(docs) if doc in corpus]


def _squad_pairs(path, num_negatives: int) -> list[Example]:
    if num_negatives:
        raise PairsFormatError(f"{path}: a SQuAD file has no hard negatives; set "
                               "--config.data.num_negatives=0 (mine some with a pair file)")
    return [Example(qid, question, context, (), None)
            for qid, question, context in squad.questions(path)]


@register
class PairsTask(Task):
    """Sentence-embedding pairs: STS or retrieval metrics of the split's embeddings."""

    name = "pairs"
    file_kind = "a pair file (JSON lines, TSV with a header, or SQuAD JSON)"

    @dataclasses.dataclass(frozen=True)
    class Data(specs.TaskData):
        pack: bool = False  # a text is a whole row
        num_negatives: int = specs.valid(0, ">= 0")  # hard negatives per query in a batch
        # Several training files (train_file "a.jsonl,b.tsv"): each batch from one of them,
        # proportional (by their sizes) or round_robin (in turn); data/finetune.py
        mix: str = specs.one_of("proportional", finetune.MIXES)

    @property
    def main_metric(self) -> str:
        """By the dev file's kind (scored pairs: STS), else by the loss (cosent: STS)."""
        if self.data.dev_file:
            return "spearman_cosine" if self.scored("dev") else "ndcg@10"
        return "spearman_cosine" if self.config.train.objective == "cosent" else "ndcg@10"

    def scored(self, split: str) -> bool:
        return self.examples(split)[0].score is not None

    def __init__(self, config: specs.RunSpec):
        super().__init__(config)
        files = self.train_files()
        if len(files) > 1 and "" in files:
            raise config_lib.ConfigError(f"data.train_file={self.data.train_file!r}: an empty "
                                         "name between commas; give each file's name")
        if len(files) > 1:
            try:
                paths.check_listed_once([str(self.file(name)) for name in files],
                                        f"data.train_file={self.data.train_file!r}: ")
            except ValueError as e:
                raise config_lib.ConfigError(str(e)) from None
        if len(files) > 1 and self.data.pack:
            raise config_lib.ConfigError(f"data.train_file names {len(files)} files, which are "
                                         "batched unpacked: set --config.data.pack=false")

    def train_files(self) -> list[str]:
        """data.train_file's files: one, or several separated by commas."""
        return [name.strip() for name in self.data.train_file.split(",")]

    def examples(self, split: str):
        """With several training files, their examples one after the other (each cut to the
        first data.max_train_examples when > 0)."""
        files = self.train_files()
        if split != "train" or len(files) < 2:
            return super().examples(split)
        if split not in self._examples:
            limit = self.data.max_train_examples
            self._files = [self.read_file(self.file(name), split) for name in files]
            self._files = [part[:limit] if limit > 0 else part for part in self._files]
            self._examples[split] = [e for part in self._files for e in part]
        return self._examples[split]

    def examples_limited(self, split: str):
        """The examples the split trains or evaluates on; for training, each file's (after
        data.max_train_examples) checked to give a batch something to compare
        (check_distinct)."""
        if split != "train":
            return super().examples_limited(split)
        if len(self.train_files()) < 2:
            out = super().examples_limited(split)
            self.check_distinct(self.path(split), out)
            return out
        out = self.examples(split)
        for name, part in zip(self.train_files(), self._files):
            self.check_distinct(self.file(name), part)
        return out

    def check_distinct(self, path, examples: list[Example]) -> None:
        """Training examples of `path` from which a batch learns something: for the in-batch
        objectives without hard negatives, at least 2 distinct queries and positives (with one
        pair, a batch is that pair repeated: no negative, loss 0); a ConfigError naming the
        file and the keys that chose them."""
        if examples[0].score is not None or self.data.num_negatives:
            return  # (cosent: scores that differ, checked as the file is read)
        queries = len({e.query for e in examples})
        positives = len({e.positive for e in examples})
        if min(queries, positives) < 2:
            limit = self.data.max_train_examples
            raise config_lib.ConfigError(
                f"{path}: {len(examples)} training pair(s)"
                + (f" (data.max_train_examples={limit})" if 0 < limit <= len(examples) else "")
                + f" with {queries} distinct query(ies) and {positives} distinct positive(s); "
                f"train.objective={self.config.train.objective or 'contrastive'!r} takes a query's "
                "negatives from the other pairs of its batch, so at least 2 distinct pairs are "
                "needed (or hard negatives: data.num_negatives): give data.train_file more pairs")

    def train_datasets(self) -> tuple[tuple[int, ...], str]:
        if len(self.train_files()) < 2:
            return super().train_datasets()
        self.examples("train")
        return tuple(len(part) for part in self._files), self.data.mix

    def read_file(self, path, split: str) -> list[Example]:
        """A pair file's examples, or a BEIR folder's (training only): beir_pairs."""
        beir = beir_source(path)
        if beir is None:
            return super().read_file(path, split)
        if split != "train":
            raise config_lib.ConfigError(
                f"{path}: a BEIR folder trains (data.train_file); evaluate one against its whole "
                f"corpus with `bert-jax eval-embeddings --beir {beir[0]} --split <qrels split>`")
        if self.data.num_negatives:
            raise PairsFormatError(f"{path}: a BEIR folder has no hard negatives; set "
                                   "--config.data.num_negatives=0 (or mine some: `bert-jax mine`)")
        qrels = beir[0] / "qrels" / f"{beir[1]}.tsv"
        if not qrels.exists():
            have = sorted(p.stem for p in (beir[0] / "qrels").glob("*.tsv"))
            raise FileNotFoundError(f"{path}: a BEIR folder without {qrels} (its qrels: {have}); "
                                    "give the qrels file of the split to train on, e.g. "
                                    f"{beir[0] / 'qrels' / (have[0] if have else 'train')}.tsv")
        if (self.config.train.objective or "contrastive") == "cosent":
            raise PairsFormatError(f"{path}: a BEIR folder gives queries with positives, but "
                                   "train.objective='cosent' trains on scored pairs")
        return beir_pairs(*beir)

    def read(self, path, training: bool = False) -> list[Example]:
        """The file's examples; for training, of the kind the objective trains on (scored pairs
        for cosent, queries with positives for the contrastive losses), else a PairsFormatError
        naming both, before anything compiles."""
        out = read_pairs(path, num_negatives=self.data.num_negatives if training else 0,
                         skip_bad_rows=self.data.skip_bad_rows)
        objective = self.config.train.objective or "contrastive"
        if training and out and (out[0].score is not None) != (objective == "cosent"):
            kind, other = (("scored pairs", "a file of queries with positives (or "
                            "train.objective=cosent)") if out[0].score is not None else
                           ("pairs without a score", "a file with a score column (or "
                            "train.objective=contrastive)"))
            raise PairsFormatError(f"{path}: {kind}, but train.objective={objective!r} trains on "
                                   f"{'scored pairs' if objective == 'cosent' else 'queries with positives'}"
                                   f"; give {other}")
        if training and objective == "cosent" and (neg := next((e for e in out if e.negatives), None)):
            raise PairsFormatError(
                f"{path}:{neg.guid.rsplit('-', 1)[-1]}: negatives given, but "
                "train.objective='cosent' trains on scored pairs and reads no negatives; give a "
                "file without a negative column (or train.objective=contrastive on unscored pairs)")
        if out and out[0].score is not None:
            retrieval.check_scores_differ(path, [e.score for e in out],
                                          least=2 if training else retrieval.MIN_STS_PAIRS)
        elif out and not training:
            retrieval.check_corpus(path, len({e.positive for e in out}))
        return out

    def encode(self, examples, training: bool) -> tuple[dict[str, np.ndarray], Any]:
        """Queries [N, T] and documents [N, 1 + k, T]: the positive, then (training) the first
        k = data.num_negatives hard negatives; evaluation embeds the positives only."""
        tok, T = self.tokenizer, self.data.max_seq_length

        def rows(texts: list[str]) -> dict[str, np.ndarray]:  # [CLS] text [SEP], padded to T
            return tok.pair_rows(tok.encode_batch(texts), [None] * len(texts), T)

        query = rows([e.query for e in examples])
        k = self.data.num_negatives if training else 0
        docs = rows([d for e in examples for d in (e.positive, *e.negatives[:k])])
        features = {**{f"query_{key}": v for key, v in query.items()},
                    **{f"document_{key}": v.reshape(len(examples), 1 + k, T) for key, v in docs.items()}}
        if examples[0].score is not None:
            features["score"] = np.array([e.score for e in examples], np.float32)
        return features, None

    def _corpus(self, split: str, outputs) -> tuple[np.ndarray, np.ndarray, list[str], list[set[str]]]:
        """(query vectors, corpus vectors, corpus ids, relevant ids per query): every distinct
        positive of the split once, every distinct query once with all its positives."""
        examples = self.examples(split)
        doc_ids: dict[str, str] = {}
        doc_rows: list[int] = []
        queries: dict[str, tuple[int, set[str]]] = {}
        for i, e in enumerate(examples):
            if e.positive not in doc_ids:
                doc_ids[e.positive] = f"d{len(doc_ids)}"
                doc_rows.append(i)
            queries.setdefault(e.query, (i, set()))[1].add(doc_ids[e.positive])
        corpus = outputs["document"][doc_rows, 0]
        rows = [i for i, _ in queries.values()]
        return (outputs["query"][rows], corpus, list(doc_ids.values()),
                [rel for _, rel in queries.values()])

    def score(self, split: str, outputs) -> dict[str, float]:
        examples = self.examples(split)
        if self.scored(split):
            gold = [e.score for e in examples]
            values = retrieval.sts_metrics(outputs["query"], outputs["document"][:, 0], gold)
            self.say_once(scoring.constant_note(str(self.path(split)), gold, retrieval.pair_cosines(
                outputs["query"], outputs["document"][:, 0])))
        else:
            per_query = retrieval.retrieval_metrics(*self._corpus(split, outputs))
            values = {k: v.mean() for k, v in per_query.items()}
        return {k: float(v) for k, v in values.items()}

    def write_predictions(self, split: str, outputs, out_dir: Path) -> list:
        """<stem>_scores.tsv: each pair's cosine (and its gold score, for scored pairs)."""
        out = paths.path(out_dir) / f"{self.path(split).stem}_scores.tsv"
        q = retrieval._unit(outputs["query"])
        d = retrieval._unit(outputs["document"][:, 0])
        with paths.open(out, "w", encoding="utf-8") as f:
            f.write("guid\tcosine\tscore\n")
            for e, c in zip(self.examples(split), (q * d).sum(-1)):
                f.write(f"{e.guid}\t{c:.6f}\t{'' if e.score is None else e.score}\n")
        return [out]
