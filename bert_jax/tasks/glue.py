"""GLUE: readers for the original TSV files and for TFDS, and BERT sentence(-pair) features.

Columns are found by header name (as TFDS and HF do), so one layout covers a task's train, dev
and test files; a file without its task's label column is a test file (labels None).
"""

from __future__ import annotations

import csv
import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from etils import epath

from bert_jax import config as config_lib
from bert_jax import paths, specs
from bert_jax.data.rows import BadRows, open_text
from bert_jax.data.tokenizer import Tokenizer
from bert_jax.specs import RunSpec
from bert_jax.tasks import scoring
from bert_jax.tasks.base import Task, register

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Example:
    """One sentence or sentence pair; label None in unlabeled (test) files."""
    guid: str
    text_a: str
    text_b: str | None
    label: str | float | None


@dataclass(frozen=True)
class TaskSpec:
    """Where a GLUE task's files are, how their columns read, and how TFDS names the same data."""
    directory: str  # as the GLUE download script names it
    files: dict[str, str]  # split (train/dev/test) -> file name
    labels: tuple[str, ...] | None  # class names as the TSVs write them; None: regression (stsb)
    text_a: str  # header names of the columns
    text_b: str | None
    label: str
    tfds_name: str
    tfds_text: tuple[str, str | None]  # TFDS feature names of text_a, text_b
    tfds_labels: tuple[str, ...] | None  # our label for each TFDS class id (TFDS's own order)
    columns: tuple[str, ...] | None = None  # names of the columns of headerless files (CoLA)
    test_header: tuple[str, ...] | None = None  # the header that marks a headerless task's test file


_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
_BINARY = ("0", "1")
_NLI = ("contradiction", "entailment", "neutral")  # original BERT order; TFDS's differs
_ENTAIL = ("entailment", "not_entailment")
_MNLI = dict(labels=_NLI, text_a="sentence1", text_b="sentence2", label="gold_label",
             tfds_name="mnli", tfds_text=("premise", "hypothesis"),
             tfds_labels=("entailment", "neutral", "contradiction"))

TASKS: dict[str, TaskSpec] = {
    "cola": TaskSpec("CoLA", _FILES, _BINARY, "sentence", None, "label", "cola", ("sentence", None),
                     _BINARY, columns=("source", "label", "original_label", "sentence"),
                     test_header=("index", "sentence")),
    "sst2": TaskSpec("SST-2", _FILES, _BINARY, "sentence", None, "label", "sst2", ("sentence", None),
                     _BINARY),
    "mrpc": TaskSpec("MRPC", _FILES, _BINARY, "#1 String", "#2 String", "Quality", "mrpc",
                     ("sentence1", "sentence2"), _BINARY),
    "stsb": TaskSpec("STS-B", _FILES, None, "sentence1", "sentence2", "score", "stsb",
                     ("sentence1", "sentence2"), None),
    "qqp": TaskSpec("QQP", _FILES, _BINARY, "question1", "question2", "is_duplicate", "qqp",
                    ("question1", "question2"), _BINARY),
    "mnli": TaskSpec("MNLI", {"train": "train.tsv", "dev": "dev_matched.tsv", "test": "test_matched.tsv"},
                     **_MNLI),
    "mnli_mismatched": TaskSpec("MNLI", {"dev": "dev_mismatched.tsv", "test": "test_mismatched.tsv"},
                                **_MNLI),
    "qnli": TaskSpec("QNLI", _FILES, _ENTAIL, "question", "sentence", "label", "qnli",
                     ("question", "sentence"), _ENTAIL),
    "rte": TaskSpec("RTE", _FILES, _ENTAIL, "sentence1", "sentence2", "label", "rte",
                    ("sentence1", "sentence2"), _ENTAIL),
    "wnli": TaskSpec("WNLI", _FILES, _BINARY, "sentence1", "sentence2", "label", "wnli",
                     ("sentence1", "sentence2"), _BINARY),  # TFDS: not_entailment, entailment
    # The diagnostic set is test-only and scored by an MNLI model, hence MNLI's labels.
    "ax": TaskSpec("diagnostic", {"test": "diagnostic.tsv"}, **_MNLI),
}
_TFDS_SPLITS = {"dev": "validation"}  # our split names that TFDS spells differently
_MNLI_SPLITS = {"mnli": "matched", "mnli_mismatched": "mismatched"}
_STSB_RANGE = (0.0, 5.0)


class GlueFormatError(ValueError):
    """A malformed row in a task file: names the file, line, field, what was found and expected."""


def task_spec(task: str) -> TaskSpec:
    """The TaskSpec of a task name; a ValueError lists the valid names."""
    if task not in TASKS:
        raise ValueError(f"unknown GLUE task {task!r}; expected one of {', '.join(TASKS)}")
    return TASKS[task]


def task_path(glue_dir: str | Path, task: str, split: str) -> Path:
    """The file of a split (train/dev/test) of a task under the GLUE download directory (local
    or gs://)."""
    spec = task_spec(task)
    if split not in spec.files:
        raise ValueError(f"GLUE task {task!r} has no split {split!r}; it has {', '.join(spec.files)}")
    return paths.path(glue_dir) / spec.directory / spec.files[split]


def _label(spec: TaskSpec, raw: str, line: int, bad: BadRows) -> str | float | None:
    """The checked label of a row, or None after reporting it to bad."""
    if spec.labels is not None:
        if raw in spec.labels:
            return raw
        bad.found(line, f"label column {spec.label!r}", raw, f"one of {', '.join(spec.labels)}")
        return None
    lo, hi = _STSB_RANGE
    try:
        score = float(raw)
    except ValueError:
        score = math.nan
    if lo <= score <= hi:  # False for nan and inf too
        return score
    bad.found(line, f"score column {spec.label!r}", raw, f"a number from {lo:g} to {hi:g}")
    return None


def read_glue(task: str, path: str | Path, *, skip_bad_rows: bool | None = False) -> list[Example]:
    """Examples of a GLUE task file (local or gs://) in its original layout; unlabeled test
    files give label None."""
    spec, path = task_spec(task), paths.path(path)
    bad = BadRows(path, skip_bad_rows, GlueFormatError)
    # utf-8-sig drops MRPC's byte order mark; QUOTE_NONE because GLUE text has unbalanced quotes.
    with open_text(path, "utf-8-sig", newline="") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        first = next(rows, None)
        if first is None:
            raise GlueFormatError(f"{path}: empty file, expected a GLUE {task} file")
        if spec.columns is not None and tuple(first) != spec.test_header:
            header, data_rows = list(spec.columns), [first]  # headerless: the first row is data
        else:
            header, data_rows = first, []
        wanted = [spec.text_a] + ([spec.text_b] if spec.text_b else [])
        if missing := [c for c in wanted if c not in header]:
            raise GlueFormatError(f"{path}:1: header lacks column(s) {missing}: found {header}, expected "
                                  f"a GLUE {task} file with columns {wanted + [spec.label]}")
        ia, ib = header.index(spec.text_a), header.index(spec.text_b) if spec.text_b else None
        il = header.index(spec.label) if spec.label in header else None  # None: a test file
        examples: list[Example] = []
        empties: list[int] = []  # lines of rows kept with an empty text
        for i, row in enumerate(itertools.chain(data_rows, rows)):  # i: the row's index in the file
            line = rows.line_num  # QUOTE_NONE: one record per line
            if len(row) != len(header):
                bad.found(line, "row", f"{len(row)} tab-separated columns",
                          f"{len(header)} ({' | '.join(header)})")
                continue
            empty = [c for c, j in ((spec.text_a, ia), (spec.text_b, ib))
                     if j is not None and not row[j].strip()]
            if empty and len(empty) == len(wanted) and il is not None:  # nothing to learn or score
                bad.found(line, f"column {empty[0]!r}", row[ia], "a non-empty text (a row with "
                          "no text is no example)")
                continue
            if empty:  # kept, encoded as HF does ([CLS] a [SEP] [SEP]): QQP's train file has two,
                empties.append(line)  # and a test file's rows are each a line of the submission
            label = None
            if il is not None and (label := _label(spec, row[il], line, bad)) is None:
                continue
            examples.append(Example(f"{path.stem}-{i}", row[ia],
                                    row[ib] if ib is not None else None, label))
    bad.warn("read_glue", f"{bad.count} malformed row(s) of {path}")
    if empties:
        log.warning(f"{path}:{empties[0]}: an empty text ({len(empties)} row(s) like it), kept "
                    "as an empty segment, as transformers encodes it")
    return examples


def _tfds_split(task: str, split: str) -> str:
    """TFDS's split name for ours (dev -> validation; MNLI's matched/mismatched suffix)."""
    split = _TFDS_SPLITS.get(split, split)
    if task in _MNLI_SPLITS and split in ("validation", "test"):
        return f"{split}_{_MNLI_SPLITS[task]}"
    return split


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _tfds_record_to_example(task: str, index: int, record: dict[str, Any]) -> Example:
    """Our Example of one TFDS glue record (text as bytes, label a class id; -1 means unlabeled)."""
    spec = task_spec(task)
    name_a, name_b = spec.tfds_text
    raw = record["label"]
    if spec.tfds_labels is None:  # stsb: a float score, -1 in the test split
        label = None if float(raw) == -1 else float(raw)
    else:
        label = None if int(raw) == -1 else spec.tfds_labels[int(raw)]
    return Example(f"{spec.tfds_name}-{index}", _text(record[name_a]),
                   _text(record[name_b]) if name_b else None, label)


def read_glue_tfds(task: str, split: str, data_dir: str | None = None) -> list[Example]:
    """Examples of a prepared TFDS glue dataset (split train/dev/test or a TFDS split name); no TF needed."""
    from bert_jax.data import documents  # lazy: grain and array_record, for this reader only

    name = f"glue/{task_spec(task).tfds_name}"
    source = documents.tfds_source(name, _tfds_split(task, split), data_dir,
                                   what=f"data.source=tfds ({name})",
                                   data_dir_flag="--config.data.data_dir")
    return [_tfds_record_to_example(task, i, record) for i, record in enumerate(source)]


def encode(examples: Sequence[Example], tokenizer: Tokenizer, max_seq_length: int,
           labels: tuple[str, ...] | None) -> dict[str, np.ndarray]:
    """BERT features of examples; label_ids are class indices into labels, or scores when labels is None."""
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for [CLS] and two [SEP]")
    features = tokenizer.encode_pairs([e.text_a for e in examples], [e.text_b for e in examples],
                                      max_seq_length)
    if labels is None:
        features["label_ids"] = np.array([0.0 if e.label is None else float(e.label) for e in examples],
                                         np.float32)
        return features
    index = {name: i for i, name in enumerate(labels)}
    if unknown := {e.label for e in examples} - set(index) - {None}:
        raise ValueError(f"encode: labels {sorted(map(str, unknown))} not in the task's labels {labels}")
    features["label_ids"] = np.array([0 if e.label is None else index[e.label] for e in examples], np.int32)
    return features


@register
class GlueTask(Task):
    """The nine GLUE tasks (TSV files in the GLUE layout, or TFDS `glue/<task>`)."""

    name = "glue"
    splits = ("train", "dev", "test", "dev_mismatched")  # dev_mismatched: MNLI's second dev set

    @dataclass(frozen=True)
    class Data(specs.TaskData):
        task: str = ""  # cola | sst2 | mrpc | stsb | qqp | mnli | qnli | rte | wnli
        source: str = "files"  # files (GLUE TSV layout under data_dir) | tfds (glue/<task>)

    @classmethod
    def run_name(cls, data) -> str:
        return f"glue {data.get('task')}"

    @classmethod
    def evaluates(cls, ran: str, asked: str | None) -> bool:
        # GLUE's diagnostic set ax is scored by an MNLI model, its own run.
        return ran == asked or (ran, asked) == ("glue mnli", "glue ax")

    def __init__(self, config: RunSpec):
        super().__init__(config)
        self.task = self.data.task
        self.spec = task_spec(self.task)
        if self.data.source not in ("files", "tfds"):
            raise config_lib.ConfigError(f"data.source={self.data.source!r}; choose files (the GLUE "
                                         "TSVs under data.data_dir) or tfds")
        want = 1 if self.spec.labels is None else len(self.spec.labels)
        if config.model.num_labels != want:
            kind = ("a regression (one score)" if self.spec.labels is None
                    else f"{want} labels {list(self.spec.labels)}")
            raise config_lib.ConfigError(f"model.num_labels={config.model.num_labels} but GLUE "
                                         f"{self.task} has {kind}; set --config.model.num_labels="
                                         f"{want} (or leave it out)")
        self.main_metric = scoring.MAIN_METRIC[self.task]
        # MNLI is reported on both dev sets.
        self.eval_splits = ("dev", "dev_mismatched") if self.task == "mnli" else ("dev",)

    def _task_split(self, split: str) -> tuple[str, str]:
        return ("mnli_mismatched", "dev") if split == "dev_mismatched" else (self.task, split)

    def path(self, split: str) -> Path | epath.Path:
        if split not in self.splits:
            return paths.path(split)
        if not self.data.data_dir:
            raise config_lib.ConfigError("data.data_dir is empty: set --config.data.data_dir=<the GLUE "
                                         f"folder holding {self.spec.directory}/>")
        return task_path(self.data.data_dir, *self._task_split(split))

    def examples(self, split: str):
        if self.data.source == "tfds" and split in self.splits:
            if split not in self._examples:
                self._examples[split] = read_glue_tfds(*self._task_split(split),
                                                       data_dir=self.data.data_dir or None)
            return self._examples[split]
        return super().examples(split)

    def read(self, path: Path, training: bool = False):
        return read_glue(self.task, path, skip_bad_rows=self.data.skip_bad_rows)

    def encode(self, examples, training: bool):
        return encode(examples, self.tokenizer, self.data.max_seq_length, self.spec.labels), None

    def _predictions(self, outputs) -> np.ndarray:
        logits = outputs["logits"]
        return logits[:, 0] if self.spec.labels is None else np.argmax(logits, -1)

    def score(self, split: str, outputs) -> dict[str, float]:
        task = self._task_split(split)[0]
        gold, preds = self.features(split)["label_ids"], self._predictions(outputs)
        if self.spec.labels is None:  # STS-B: undefined correlations (nan) are said, with the file
            self.say_once(scoring.constant_note(self._where(split), gold, preds))
        return scoring.glue_metrics(task, gold, preds)

    def _where(self, split: str) -> str:
        """The split's file, as a message names it (a TFDS split: its dataset and split)."""
        if self.data.source == "tfds" and split in self.splits:
            return "tfds glue/{}, split {}".format(*self._task_split(split))
        return str(self.path(split))

    def write_predictions(self, split: str, outputs, out_dir: Path) -> list:
        """The GLUE leaderboard layout: <Task>.tsv with `index<TAB>prediction` rows."""
        names = {"mnli": "MNLI-m", "mnli_mismatched": "MNLI-mm", "ax": "AX"}
        task = self._task_split(split)[0]
        out = paths.path(out_dir) / f"{names.get(task, self.spec.directory)}.tsv"
        preds = self._predictions(outputs)
        with paths.open(out, "w", encoding="utf-8") as f:
            f.write("index\tprediction\n")
            for e, p in zip(self.examples(split), preds):
                value = f"{float(p):.3f}" if self.spec.labels is None else self.spec.labels[int(p)]
                f.write(f"{e.guid.rsplit('-', 1)[-1]}\t{value}\n")  # the row index in the file
        return [out]
