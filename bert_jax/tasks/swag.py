"""SWAG multiple choice: readers for the swagaf CSV and JSON lines layouts, and [N, 4, T] BERT features."""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bert_jax import paths, specs
from bert_jax.data.rows import BadRows, jsonl_rows, open_text
from bert_jax.data.tokenizer import Tokenizer
from bert_jax.tasks import scoring
from bert_jax.tasks.base import Task, register

NUM_CHOICES = 4
_ENDINGS = tuple(f"ending{i}" for i in range(NUM_CHOICES))
_TEXT = ("sent1", "sent2", *_ENDINGS)  # required in both layouts; "label" only in labeled files


class SwagFormatError(ValueError):
    """A malformed SWAG row: names the file, line, field, what was found and expected."""


@dataclass(frozen=True)
class Example:
    """A context, the start of the next sentence, and four candidate endings of it."""
    guid: str
    context: str  # sent1
    start: str  # sent2, the ending's first words
    endings: tuple[str, str, str, str]
    label: int | None  # index of the true ending; None when unlabeled


def _csv_rows(f: Any, bad: BadRows) -> Iterator[tuple[int, dict[str, Any]]]:
    """(first line, columns by header name) of each record; fields may be quoted over several lines."""
    rows = csv.reader(f)
    header = next(rows, [])
    if missing := [c for c in _TEXT if c not in header]:
        raise SwagFormatError(f"{bad.path}:1: header lacks column(s) {missing}: found {header}, expected "
                              f"the swagaf layout (,video-id,fold-ind,startphrase,sent1,sent2,gold-source,"
                              f"ending0,ending1,ending2,ending3[,label]) or JSON lines")
    start = rows.line_num + 1
    for row in rows:
        line, start = start, rows.line_num + 1
        if len(row) != len(header):
            bad.found(line, "row", f"{len(row)} columns", f"{len(header)} ({','.join(header)})")
            continue
        yield line, dict(zip(header, row))


def _label(raw: Any, line: int, bad: BadRows) -> tuple[bool, int | None]:
    """(ok, label): None for an absent/empty label or -1 (unlabeled test rows, as in TFDS/HF)."""
    if raw is None or raw == "" or str(raw) == "-1":
        return True, None
    if str(raw) in ("0", "1", "2", "3"):
        return True, int(raw)
    bad.found(line, "label", raw, f"an integer from 0 to {NUM_CHOICES - 1}")
    return False, None


def read_swag(path: str | Path, *, skip_bad_rows: bool = False) -> list[Example]:
    """Examples of a SWAG file: swagaf CSV (train.csv, val.csv, test.csv) or JSON lines (sent1, ...)."""
    path = paths.path(path)
    bad = BadRows(path, skip_bad_rows, SwagFormatError)
    examples: list[Example] = []
    with open_text(path, "utf-8-sig", newline="") as f:
        is_json = f.read(1) == "{"  # swagaf CSV starts with its header's empty index column name
        f.seek(0)
        for i, (line, row) in enumerate((jsonl_rows if is_json else _csv_rows)(f, bad)):
            if missing := [k for k in _TEXT if not isinstance(row.get(k), str)]:
                bad.found(line, f"field {missing[0]!r}", row.get(missing[0]), "a string")
                continue
            ok, label = _label(row.get("label"), line, bad)
            if ok:
                endings = tuple(row[k] for k in _ENDINGS)
                examples.append(Example(f"{path.stem}-{i}", row["sent1"], row["sent2"],
                                        endings, label))
    bad.warn("read_swag", f"{bad.count} malformed row(s) of {path}")
    return examples


def encode(examples: Sequence[Example], tokenizer: Tokenizer, max_seq_length: int) -> dict[str, np.ndarray]:
    """[N, 4, T] input_ids, token_type_ids, attention_mask of [CLS] context [SEP] start ending [SEP];
    label_ids."""
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for [CLS] and two [SEP]")
    contexts = tokenizer.encode_batch([e.context for e in examples])
    # As the original BERT and HF run_swag: the ending is appended to its start as one second segment.
    choices = tokenizer.encode_batch([f"{e.start} {ending}" for e in examples for ending in e.endings])
    ids_a = [ids for ids in contexts for _ in range(NUM_CHOICES)]
    flat = tokenizer.pair_rows(ids_a, choices, max_seq_length)
    features = {k: v.reshape(len(examples), NUM_CHOICES, max_seq_length) for k, v in flat.items()}
    features["label_ids"] = np.array([0 if e.label is None else e.label for e in examples], np.int32)
    return features


@register
class SwagTask(Task):
    """SWAG four-way multiple choice (CSV or JSON lines)."""

    name = "swag"
    file_kind = "a SWAG file"

    @dataclass(frozen=True)
    class Data(specs.TaskData):
        num_choices: int = specs.valid(4, ">= 2")  # endings per example (the reader checks each row)

    @classmethod
    def looks_like(cls, head: bytes) -> bool:
        return b"ending0" in head.split(b"\n")[0] and b"sent1" in head

    def read(self, path: Path, training: bool = False):
        return read_swag(path, skip_bad_rows=self.data.skip_bad_rows)

    def encode(self, examples, training: bool):
        return encode(examples, self.tokenizer, self.data.max_seq_length), None

    def score(self, split: str, outputs) -> dict[str, float]:
        examples = self.examples(split)
        return {"accuracy": scoring.accuracy([e.label for e in examples],
                                             np.argmax(outputs["logits"], -1))}

    def write_predictions(self, split: str, outputs, out_dir: Path) -> list:
        out = paths.path(out_dir) / f"{self.path(split).stem}_predictions.csv"
        with paths.open(out, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["guid", "label", *[f"logit{i}" for i in range(NUM_CHOICES)]])
            for e, row in zip(self.examples(split), outputs["logits"]):
                w.writerow([e.guid, int(np.argmax(row)), *[f"{x:.4f}" for x in row]])
        return [out]
