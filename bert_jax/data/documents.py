"""Random-access tokenized documents (a document = a list of int32 sentence arrays) from
text files, `bert-jax prepare` array_record shards, or a TFDS dataset (the raw lines
`bert-jax vocab` learns from: data/sources.py, vocab_lines).

Text files are tokenized into memory when opened (fine up to a few GB of text); beyond
that, `bert-jax prepare` writes array_record shards that are read record by record.
"""

from __future__ import annotations

import gzip
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import grain
import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

from bert_jax import paths, specs
from bert_jax.data import pretraining
from bert_jax.data import text as text_lib
from bert_jax.paths import workdir_path

Document = list[np.ndarray]


def expand(patterns: str, what: str = "") -> list[str]:
    """Comma-separated globs (local or gs://, see paths.glob) -> sorted file list; no match, or
    a file that two of them name (it would be read twice), is an error naming `what` (a key or
    flag)."""
    files: list[str] = []
    where = f"{what}={patterns!r}: " if what else ""
    check_given(patterns, what)
    for pattern in filter(None, (p.strip() for p in patterns.split(","))):
        matched = paths.glob(pattern)
        if not matched:
            raise FileNotFoundError(f"{where}no file matches {pattern!r}; check the path (a glob "
                                    "is expanded here, so quote it in the shell)")
        files.extend(matched)
    paths.check_listed_once(files, where)
    return files


def warn_evaluated_in_training(train_files: str, eval_files: str) -> None:
    """One warning line naming the first file that data.eval_files and data.train_files both
    match: its eval metrics would be measured on training text (a user may mean it, so not
    refused). Nothing without eval_files (held-out documents are split off instead)."""
    if not eval_files.strip(", "):
        return
    trained = {paths.listed_as(f) for f in expand(train_files, "data.train_files")}
    both = [f for f in expand(eval_files, "data.eval_files") if paths.listed_as(f) in trained]
    if both:
        logging.getLogger(__name__).warning(
            f"warning: data.eval_files names {both[0]}, which data.train_files names too"
            + (f" (and {len(both) - 1} more)" if len(both) > 1 else "") + ": its eval metrics "
            "are measured on training text; give held-out files to measure generalization")


def check_given(patterns: str, what: str = "") -> None:
    """`patterns` names at least one file glob (nothing is opened: a machine without the files,
    e.g. `bert-jax launch`'s, checks this too); else an error naming `what`."""
    if not any(p.strip() for p in patterns.split(",")):
        where = f"{what}={patterns!r}: " if what else ""
        raise FileNotFoundError(f"{where}no files given; set it to comma-separated file globs")


def _shifted(error: UnicodeDecodeError, start: int) -> UnicodeDecodeError:
    """`error` with its position counted from byte `start` (a line's first)."""
    return UnicodeDecodeError(error.encoding, error.object[start:], error.start - start,
                              error.end - start, error.reason)


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 text file, plain or .gz (local or gs://), without line endings."""
    file = workdir_path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no such file; give a text file with one sentence a line "
                                "(plain or .gz)")
    try:
        data = file.read_bytes()
        if str(path).endswith(".gz"):
            with text_lib.gzip_errors(path):
                data = gzip.decompress(data)
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise text_lib.not_text(path, line, data.split(b"\n")[line - 1],
                                _shifted(e, data.rfind(b"\n", 0, e.start) + 1)) from None
    if "\x00" in text:
        line = text[:text.index("\x00")].count("\n") + 1
        raise text_lib.not_text(path, line, data.split(b"\n")[line - 1])
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


# gs:// shards are copied to this machine's disk and read there: array_record's reader opens
# gs:// itself (google-cloud-cpp), with retries of its own that the retry policy cannot reach.
SHARD_CACHE_ENV = "BERT_JAX_SHARD_CACHE"  # a folder, or "off" (docs/pretraining.md)


def shard_cache(environ=os.environ) -> str | None:
    """The folder gs:// shards are copied into: $BERT_JAX_SHARD_CACHE (None for "off": read
    from the bucket), else <$XDG_CACHE_HOME or ~/.cache>/bert_jax/shards."""
    given = specs.folder_or_keyword(environ.get(SHARD_CACHE_ENV, "").strip(), ("off",),
                                    f"${SHARD_CACHE_ENV}")  # OFF, none, 0: not folders
    if given == "off":
        return None
    if given:
        return os.path.abspath(os.path.expanduser(given))
    return paths.user_cache("shards", environ)


def _readable(files: list[str]) -> list[str]:
    """`files` with each gs:// shard replaced by its local copy (paths.cached_copies, under the
    retry policy); as given when copies are off, or, with one warning line, when the folder for
    them cannot hold them (array_record then reads the bucket, by its own retries)."""
    remote = [f for f in files if paths.is_remote(f)]
    folder = shard_cache()
    if not remote or folder is None:
        return files
    try:
        copies = dict(zip(remote, map(str, paths.cached_copies(remote, folder)), strict=True))
    except paths.CopyFolderUnusable as e:
        logging.getLogger(__name__).warning(
            f"warning: the shard cache {e}; reading the shards from the bucket instead (array_record's "
            f"own GCS client: its retries, not ${paths.RETRY_ENV}'s); set ${SHARD_CACHE_ENV} to a "
            "folder with room (or to off, to read the bucket without this line)")
        return files
    return [copies.get(f, f) for f in files]


class ArrayRecordDocuments:
    """Pre-tokenized documents written by `bert-jax prepare`, local or gs:// (copied to this
    machine first, `_readable`; with copies off, array_record >= 0.8.6 reads gs:// objects
    itself, with Application Default Credentials)."""

    def __init__(self, files: Sequence[str]):
        files = _readable(list(files))
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


def tfds_source(name: str, split: str, data_dir: str | None = None, *, what: str = "",
                data_dir_flag: str = "--config.data.tfds_data_dir"):
    """tfds.data_source of `name` prepared as array_record under data_dir (default: TFDS's):
    never downloads or prepares it here (that needs TensorFlow and the network); a dataset
    that is unknown, not prepared or prepared as TFRecord is one line naming `what` (default
    data.tfds_name=<name>) and what to do."""
    import tensorflow_datasets as tfds  # lazy: slow to import, and only these sources need it

    absl_log = logging.getLogger("absl")
    level = absl_log.level
    absl_log.setLevel(logging.ERROR)  # TFDS warns of each absent folder; the error says it all
    try:
        return tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
    except (ValueError, NotImplementedError) as e:  # DatasetNotFoundError is a ValueError
        raise _tfds_unreadable(tfds, name, data_dir, what or f"data.tfds_name={name!r}",
                               data_dir_flag, e) from None
    finally:
        absl_log.setLevel(level)


def _tfds_unreadable(tfds, name: str, data_dir: str | None, what: str, data_dir_flag: str,
                     error: Exception) -> Exception:
    """Why tfds.data_source(name) failed, as one line saying what to do."""
    # TFDS imports its catalog lazily: with the text and translation builders registered, a
    # known dataset that is not prepared here is told apart from a name TFDS does not know.
    import tensorflow_datasets.text  # noqa: F401
    import tensorflow_datasets.translate  # noqa: F401

    where = data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
    build = f"`tfds build {name} --file_format=array_record{f' --data_dir={data_dir}' if data_dir else ''}`"
    try:
        prepared = tfds.builder(name, data_dir=data_dir or None).is_prepared()
    except tfds.core.registered.DatasetNotFoundError:
        return FileNotFoundError(f"{what}: TFDS has no dataset of that name and none is prepared "
                                 f"under {where}; check the name")
    except ValueError as e:  # an unknown config (the part after the /), listed by TFDS
        return ValueError(f"{what}: {str(e).splitlines()[0]}")
    if not prepared:
        return FileNotFoundError(
            f"{what}: the TFDS dataset exists but is not prepared under {where}; prepare it once "
            f"with {build} (needs TensorFlow and the network), or set {data_dir_flag} to a "
            "folder where it is prepared")
    if isinstance(error, NotImplementedError):  # TFDS's word for a format without random access
        return FileNotFoundError(f"{what}: prepared under {where} as TFRecord, which cannot be "
                                 f"read record by record; prepare it again with {build}")
    return ValueError(f"{what}: {str(error).splitlines()[0]}")  # e.g. an unknown split


class TfdsDocuments:
    """A TFDS text dataset through `tfds.data_source` (array_record; no TensorFlow): each
    record's `text` field split into paragraphs (lines) and sentences, tokenized on access."""

    def __init__(self, name: str, split: str, tokenizer, data_dir: str | None = None,
                 field: str = "text"):
        self.source = tfds_source(name, split, data_dir)
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


