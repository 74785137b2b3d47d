"""Random-access tokenized documents (a document = a list of int32 sentence arrays) from
text files, `bert-jax prepare` array_record shards, or a TFDS dataset.

Text files are tokenized into memory when opened (fine up to a few GB of text); beyond
that, `bert-jax prepare` writes array_record shards that are read record by record.
"""

from __future__ import annotations

import gzip
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import grain
import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

from bert_jax import paths
from bert_jax.data import pretraining
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.paths import workdir_path

Document = list[np.ndarray]


def expand(patterns: str, what: str = "") -> list[str]:
    """Comma-separated globs (local or gs://, see paths.glob) -> sorted file list; no match is
    an error naming `what` (a key or flag)."""
    files: list[str] = []
    where = f"{what}={patterns!r}: " if what else ""
    for pattern in filter(None, (p.strip() for p in patterns.split(","))):
        matched = paths.glob(pattern)
        if not matched:
            raise FileNotFoundError(f"{where}no file matches {pattern!r}; check the path (a glob "
                                    "is expanded here, so quote it in the shell)")
        files.extend(matched)
    if not files:
        raise FileNotFoundError(f"{where}no files given; set it to comma-separated file globs")
    return files


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 text file, plain or .gz (local or gs://), without line endings."""
    file = workdir_path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no such file; give a text file with one sentence a line "
                                "(plain or .gz)")
    try:
        data = file.read_bytes()
        if str(path).endswith(".gz"):
            data = gzip.decompress(data)
        text = data.decode("utf-8")
    except (gzip.BadGzipFile, EOFError) as e:
        raise ValueError(f"{path}: not a readable gzip file ({e}); decompress it or drop the "
                         ".gz suffix if it is plain text") from None
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ValueError(f"{path}: line {line} is not UTF-8 ({e.reason}); re-encode the file as "
                         "UTF-8") from None
    # split("\n"), not splitlines(): a stray \x85 or \u2028 inside a sentence must not shift
    # the line alignment with the other side.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def serialize(doc: Document) -> bytes:
    """[n, len_1..len_n, ids...] as int32 bytes (one array_record record per document)."""
    lengths = [len(s) for s in doc]
    return np.concatenate([[len(doc)], lengths, *doc]).astype(np.int32).tobytes()


def deserialize(record: bytes) -> Document:
    a = np.frombuffer(record, np.int32)
    n = int(a[0])
    return np.split(a[1 + n:], np.cumsum(a[1:n])) if n else []


class TextDocuments:
    """Documents of plain text files (`fmt`: 'sentences' = one sentence per line and blank
    lines between documents, the original BERT format; 'paragraphs' = ordinary text)."""

    def __init__(self, files: Sequence[str], fmt: str, tokenizer):
        self.docs: list[Document] = []
        for path in files:
            for sentences in pretraining.iter_documents(path, fmt):
                doc = pretraining.tokenize_document(sentences, tokenizer)
                if doc:
                    self.docs.append(doc)
        if not self.docs:
            raise ValueError(f"no documents with text in {list(files)}; check data.train_files and "
                             "data.eval_files")

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> Document:
        return self.docs[i]


class ArrayRecordDocuments:
    """Pre-tokenized documents written by `bert-jax prepare` (local or gs://: array_record
    >= 0.8.6 reads gs:// objects itself, with Application Default Credentials)."""

    def __init__(self, files: Sequence[str]):
        try:
            self.source = grain.sources.ArrayRecordDataSource(list(files))
        except RuntimeError as e:  # the C++ reader's "open() failed: ...; opening <file>"
            remote = [f for f in files if paths.is_remote(f)]
            if not remote or "gs://" not in str(e):
                raise
            import array_record

            raise OSError(
                f"array_record {getattr(array_record, '__version__', '')} cannot read {remote[0]} "
                f"({str(e).splitlines()[0][:200]}); array_record >= 0.8.6 reads gs:// with the "
                "machine's Google credentials (`gcloud auth application-default login` off "
                "Cloud): upgrade it (pip install -U array_record), check the credentials, or "
                "copy the shards to a local disk and point data.train_files there") from None

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> Document:
        return deserialize(self.source[i])


class TfdsDocuments:
    """A TFDS text dataset through `tfds.data_source` (array_record; no TensorFlow): each
    record's `text` field split into paragraphs (lines) and sentences, tokenized on access."""

    def __init__(self, name: str, split: str, tokenizer, data_dir: str | None = None,
                 field: str = "text"):
        import tensorflow_datasets as tfds  # lazy: slow to import, and only this source needs it

        self.source = tfds.data_source(name, split=split, data_dir=data_dir or None)
        self.tokenizer, self.field = tokenizer, field

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> Document:
        text = self.source[i][self.field]
        text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
        sentences = [s for para in text.split("\n") for s in pretraining.split_sentences(para)]
        return pretraining.tokenize_document(sentences, self.tokenizer)


def write_array_record(docs, path: str | Path) -> int:
    """Writes documents (an iterable of Document) to one array_record file, local or gs://
    (written locally, then uploaded: array_record's writer opens only local files); returns
    the count."""
    if paths.is_remote(path):
        with tempfile.TemporaryDirectory(prefix="bert_jax_shard_") as tmp:
            local = Path(tmp) / "shard.array_record"
            n = write_array_record(docs, local)
            paths.copy_file(local, path)
        return n
    writer = ArrayRecordWriter(str(path), "group_size:1")
    n = 0
    for doc in docs:
        writer.write(serialize(doc))
        n += 1
    writer.close()
    return n


def _source_documents(config, tokenizer):
    """Tokenized documents of config.data's text files or TFDS split, streamed in order."""
    d = config.data
    if d.name == "tfds":
        source = TfdsDocuments(d.tfds_name, d.tfds_train_split, tokenizer, d.tfds_data_dir)
        yield from (source[i] for i in range(len(source)))
        return
    for path in expand(d.train_files, "data.train_files"):
        for sentences in pretraining.iter_documents(path, d.text_format):
            doc = pretraining.tokenize_document(sentences, tokenizer)
            if doc:
                yield doc


def prepare(config, out_dir: str | Path, docs_per_shard: int = 50_000) -> dict[str, int]:
    """Tokenizes config.data's corpus once into array_record shards `train-NNNNN` and (every
    data.heldout_every-th document) `validation-NNNNN` (local or gs://); returns documents per
    split."""
    out = paths.path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; choose a new --out")
    tokenizer = tokenizer_lib.load_tokenizer(tokenizer_lib.required_dir(config.data.tokenizer))
    out.mkdir(parents=True, exist_ok=True)
    every = config.data.heldout_every
    buffers: dict[str, list[Document]] = {"train": [], "validation": []}
    counts = {"train": 0, "validation": 0}
    shards = {"train": 0, "validation": 0}

    def flush(split: str) -> None:
        if buffers[split]:
            write_array_record(buffers[split], out / f"{split}-{shards[split]:05d}.array_record")
            shards[split] += 1
            buffers[split] = []

    for i, doc in enumerate(_source_documents(config, tokenizer)):
        split = "validation" if every > 0 and i % every == every - 1 else "train"
        buffers[split].append(doc)
        counts[split] += 1
        if len(buffers[split]) >= docs_per_shard:
            flush(split)
    flush("train")
    flush("validation")
    return counts
