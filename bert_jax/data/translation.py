"""Parallel text for translation: pairs from line-aligned files, a TSV or TFDS, encoded with
the shared SentencePiece vocabulary, filtered by length and packed into rows.

Sources (`config.data`, read for `source_lang` -> `target_lang`):
  train_files / eval_files  "path/train.{lang}.gz": two line-aligned files, `{lang}` standing
                            for each language (plain or .gz; comma-separated globs allowed);
                            or "pairs.tsv": one pair per line, columns named by `tsv_langs`
  tfds_name                 when the files are empty: e.g. wmt14_translate/de-en through
                            `tfds.data_source` (no TensorFlow), splits tfds_train/eval_split
Every sentence ends with EOS ([SEP] of the vocabulary); pad (0) starts the decoder input.
A training row packs several pairs (first fit) so a batch of `batch_size` rows of
`max_seq_length` tokens a side is a token budget, as the paper's batches; shapes stay static.
"""

from __future__ import annotations

import dataclasses
import logging

import grain
import numpy as np

from bert_jax.data import packing
from bert_jax.data.documents import expand, read_lines, tfds_source

log = logging.getLogger(__name__)

KEYS = ("inputs", "targets")


def _read_tsv(path: str, columns: tuple[int, int], what: str) -> tuple[list[str], list[str]]:
    src, tgt = [], []
    for n, line in enumerate(read_lines(path), 1):
        cells = line.split("\t")
        if len(cells) <= max(columns):
            raise ValueError(f"{what}: {path} line {n} has {len(cells)} tab-separated column(s), "
                             f"expected {max(columns) + 1} (data.tsv_langs); fix or remove that line")
        src.append(cells[columns[0]].strip())
        tgt.append(cells[columns[1]].strip())
    return src, tgt


def read_files(spec: str, source_lang: str, target_lang: str, tsv_langs: str = "",
               what: str = "data.train_files") -> tuple[list[str], list[str]]:
    """(source sentences, target sentences) of line-aligned `{lang}` files or TSV files."""
    if "{lang}" in spec:
        sides = [expand(spec.replace("{lang}", lang), what) for lang in (source_lang, target_lang)]
        if len(sides[0]) != len(sides[1]):
            raise ValueError(f"{what}={spec!r}: {len(sides[0])} {source_lang} file(s) but "
                             f"{len(sides[1])} {target_lang} file(s); each needs its partner")
        src, tgt = [], []
        for a, b in zip(*sides):
            la, lb = read_lines(a), read_lines(b)
            if len(la) != len(lb):
                raise ValueError(f"{what}: {a} has {len(la)} lines but {b} has {len(lb)}; "
                                 "line-aligned files need the same number of lines")
            src += la
            tgt += lb
        return src, tgt
    files = expand(spec, what)
    if not all(f.endswith((".tsv", ".tsv.gz")) for f in files):
        raise ValueError(f"{what}={spec!r}: expected line-aligned files named with {{lang}} "
                         "(e.g. train.{lang}.gz for train.en.gz + train.de.gz) or .tsv files")
    langs = [x.strip() for x in (tsv_langs or f"{source_lang},{target_lang}").split(",")]
    missing = [x for x in (source_lang, target_lang) if x not in langs]
    if missing:
        raise ValueError(f"data.tsv_langs={tsv_langs!r} names no column for {missing}: list the "
                         "TSV's languages in column order, e.g. 'en,de'")
    columns = (langs.index(source_lang), langs.index(target_lang))
    src, tgt = [], []
    for f in files:
        a, b = _read_tsv(f, columns, what)
        src += a
        tgt += b
    return src, tgt


class TfdsPairs:
    """A TFDS translation dataset (features per language) through `tfds.data_source`."""

    def __init__(self, name: str, split: str, source_lang: str, target_lang: str,
                 data_dir: str = ""):
        self.source = tfds_source(name, split, data_dir)
        self.langs = (source_lang, target_lang)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> tuple[str, str]:
        record = self.source[int(i)]
        texts = [record[lang] for lang in self.langs]
        return tuple(t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in texts)


class FilePairs:
    """Pairs held in memory (from read_files), random access like TfdsPairs."""

    def __init__(self, src: list[str], tgt: list[str]):
        self.src, self.tgt = src, tgt

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[str, str]:
        return self.src[int(i)], self.tgt[int(i)]


def open_pairs(data, split: str):
    """The random-access pairs of `split` ('train' or 'validation') of the run's data section
    (a specs.TranslationData)."""
    key = "train_files" if split == "train" else "eval_files"
    if getattr(data, key):
        return FilePairs(*read_files(getattr(data, key), data.source_lang, data.target_lang,
                                     data.tsv_langs, f"data.{key}"))
    if not data.tfds_name:
        raise ValueError(f"data.{key} and data.tfds_name are empty: set --config.data.{key}="
                         "path/train.{lang}.gz (line-aligned files) or a TFDS dataset name")
    tfds_split = data.tfds_train_split if split == "train" else data.tfds_eval_split
    return TfdsPairs(data.tfds_name, tfds_split, data.source_lang, data.target_lang,
                     data.tfds_data_dir)


def encode_pair(tokenizer, source: str, target: str) -> dict[str, np.ndarray]:
    """Token ids of both sides, each ending with EOS ([SEP])."""
    ids = tokenizer.encode_batch([source, target])
    return {k: np.append(x, tokenizer.sep_id).astype(np.int32) for k, x in zip(KEYS, ids)}


@dataclasses.dataclass
class _Encode:
    pairs: object
    tokenizer: object

    def __call__(self, i: int) -> dict[str, np.ndarray]:
        return encode_pair(self.tokenizer, *self.pairs[int(i)])


@dataclasses.dataclass
class _Fits:
    max_len: int

    def __call__(self, ex: dict[str, np.ndarray]) -> bool:
        return all(1 < len(ex[k]) <= self.max_len for k in KEYS)  # empty sides carry no signal


def packed_dataset(pairs, tokenizer, *, max_len: int, rows: int, seed: int, train: bool,
                   process_index: int = 0, process_count: int = 1, bins: int = 0):
    """grain IterDataset of this host's packed rows: pairs process_index::process_count,
    shuffled each epoch and repeated when training, encoded, longer than max_len dropped,
    packed first-fit into `bins` rows at a time (default: one batch of rows), in the layout of
    data/packing.py (`<x>_segment_ids`, `<x>_positions`)."""
    ds = grain.MapDataset.source(np.arange(process_index, len(pairs), process_count))
    if train:
        ds = ds.shuffle(seed).repeat(None)
    ds = ds.map(_Encode(pairs, tokenizer)).to_iter_dataset().filter(_Fits(max_len))
    return packing.first_fit(ds, {k: max_len for k in KEYS}, rows=bins or rows, seed=seed, train=train)


def dropped_by_length(pairs, tokenizer, max_len: int, limit: int = 2000) -> float:
    """Fraction of (the first `limit`) pairs that a max_len filter drops, for the log."""
    n = min(limit, len(pairs))
    fits = _Fits(max_len)
    return sum(not fits(encode_pair(tokenizer, *pairs[i])) for i in range(n)) / max(n, 1)
