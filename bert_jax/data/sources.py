"""Data sources: where a run's training and held-out data come from, chosen by `data.name`
(a fine-tuning task's name names a task instead: bert_jax.tasks). Training
(training/input.py) and `bert-jax prepare` (`prepare`, here) ask this registry.

A source is a class that registers itself (`@register`), of one of three kinds:
- "documents": tokenized documents for the pretraining recipe: `documents(data, split,
  tokenizer)` -> (random-access documents, whether held-out data has a source of its own, so
  that no training document is held out) and, if `bert-jax prepare` can shard it, `stream(data, tokenizer)`;
- "pairs": sentence pairs for translation (data/translation.py reads them);
- "batches": ready host-local batches, `batches(config, split, ...)` (generated data).
A source also says what its rows train (`task`: pretraining or translation) and the record its
data section reads as (`keys`, bert_jax/specs.py); registering enters its name there too.
A source that can give raw text for `bert-jax vocab --input` declares the `scheme` of that
input (`tfds:name...`) and `text_lines`; the text source takes inputs without one (file globs):
`vocab_lines` asks the registry.
A new source is one such class in any module imported before the run (a test file will do).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from bert_jax import paths, specs
from bert_jax.data import documents, pretraining
from bert_jax.data import text as text_lib
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.data.synthetic import SyntheticPretraining, SyntheticTranslation
from bert_jax.specs import ConfigError, RunSpec

KINDS = ("documents", "pairs", "batches")
SOURCES: dict[str, Source] = {}


class Source:
    """What every source declares: its `name` (data.name) and `kind` (KINDS); what its rows
    train and its data section's record, if not pretraining's."""

    name: ClassVar[str]
    kind: ClassVar[str]
    task: ClassVar[str] = "pretraining"  # or "translation"
    keys: ClassVar[type] = specs.PretrainingData
    prepares: ClassVar[bool] = False  # `bert-jax prepare` can shard it (documents sources)
    # `bert-jax vocab --input <scheme>:<rest>` reads this source's text (text_lines(rest));
    # "": the inputs without a registered scheme (file globs)
    scheme: ClassVar[str | None] = None

    def check(self, data) -> None:
        """Fails now, before the model is built, if the data cannot be read (default: the
        reader says so when it opens it)."""

    def check_named(self, data) -> None:
        """What the run reads is named in `data`, nothing opened (train checks it first, and
        `bert-jax launch` before renting workers that would read it): a source of documents or
        pairs needs data.tokenizer (a source of batches, none)."""
        if self.kind != "batches":
            tokenizer_lib.required_dir(data.tokenizer)

    def documents(self, data, split: str, tokenizer) -> tuple[Any, bool]:
        raise NotImplementedError(f"data.name={self.name!r} is a {self.kind} source")

    def stream(self, data, tokenizer) -> Iterator[documents.Document]:
        """Every training document in order (`bert-jax prepare`)."""
        docs, _ = self.documents(data, "train", tokenizer)
        yield from (docs[i] for i in range(len(docs)))

    def batches(self, config: RunSpec, split: str, *, batch_size: int, num_batches: int | None,
                process_index: int, process_count: int):
        raise NotImplementedError(f"data.name={self.name!r} is a {self.kind} source")

    def text_lines(self, spec: str) -> Iterator[str]:
        """Raw text lines of `spec` (the --input of `bert-jax vocab`, its scheme removed)."""
        raise NotImplementedError(f"data.name={self.name!r} gives no raw text")


def register(cls: type[Source]) -> type[Source]:
    """Class decorator: adds a source to SOURCES under its name."""
    if cls.kind not in KINDS:
        raise ValueError(f"source {cls.name!r}: kind {cls.kind!r} is not one of {KINDS}")
    SOURCES[cls.name] = cls()
    specs.register_data(cls.name, cls.keys, task=cls.task, source=True)
    return cls


def get(name: str) -> Source:
    """The source named `name`; an unknown name is an error listing the sources."""
    if name not in SOURCES:
        raise ValueError(f"data.name={name!r}; choose one of {list(SOURCES)}")
    return SOURCES[name]


def vocab_lines(spec: str) -> Iterator[str]:
    """The raw text lines of a `bert-jax vocab --input`: `<scheme>:<rest>` read by the source
    registered with that scheme (tfds:...), anything else by the one with scheme "" (comma-
    separated file globs, plain or .gz, local or gs://)."""
    scheme, colon, rest = spec.partition(":")
    by_scheme = {s.scheme: s for s in SOURCES.values() if s.scheme is not None}
    if colon and scheme and scheme in by_scheme:
        return by_scheme[scheme].text_lines(rest)
    return by_scheme[""].text_lines(spec)


def _split_key(data, split: str, own: str, train: str) -> tuple[str, bool]:
    """(the data key `split` reads, whether held-out data has its own key `own` set): with it,
    the training documents are all trained on; without it, evaluation holds some of them out."""
    has_own = bool(getattr(data, own))
    return (own if split == "validation" and has_own else train), has_own


class _Files(Source):
    """A source of files (text, array_record): data.train_files and data.eval_files."""

    def check_named(self, data):  # its tokenizer, and data.train_files naming a file
        super().check_named(data)
        documents.check_given(data.train_files, "data.train_files")

    def check(self, data):
        documents.warn_evaluated_in_training(data.train_files, data.eval_files)


@register
class Text(_Files):
    """Plain text files (data.train_files, data.eval_files; data.text_format), tokenized into
    memory when opened."""

    name, kind, prepares, scheme = "text", "documents", True, ""

    def text_lines(self, spec):
        for path in documents.expand(spec, "--input"):
            yield from text_lib.utf8_lines(path)

    def documents(self, data, split, tokenizer):
        key, own = _split_key(data, split, "eval_files", "train_files")
        files = documents.expand(getattr(data, key), f"data.{key}")
        return documents.TextDocuments(files, data.text_format, tokenizer), own

    def stream(self, data, tokenizer):  # streamed, so prepare never holds the corpus
        for path in documents.expand(data.train_files, "data.train_files"):
            for sentences in pretraining.iter_documents(path, data.text_format):
                doc = pretraining.tokenize_document(sentences, tokenizer)
                if doc:
                    yield doc


@register
class ArrayRecord(_Files):
    """Shards written by `bert-jax prepare`, read record by record (local or gs://)."""

    name, kind = "array_record", "documents"

    def documents(self, data, split, tokenizer):
        key, own = _split_key(data, split, "eval_files", "train_files")
        return documents.ArrayRecordDocuments(documents.expand(getattr(data, key), f"data.{key}")), own


@register
class Tfds(Source):
    """A TFDS text corpus prepared as array_record (data.tfds_name), via tfds.data_source."""

    name, kind, prepares, scheme = "tfds", "documents", True, "tfds"

    def text_lines(self, spec):
        """name[:split[:field,field]], default split train and field `text` (e.g.
        wmt14_translate/de-en:train:en,de)."""
        name, _, rest = spec.partition(":")
        split, _, fields = rest.partition(":")
        source = documents.tfds_source(name, split or "train", what=f"--input=tfds:{spec}",
                                       data_dir_flag="$TFDS_DATA_DIR")
        for i in range(len(source)):
            for field in (fields or "text").split(","):
                text = source[i][field]
                yield from (text.decode() if isinstance(text, bytes) else text).splitlines()

    def check(self, data):
        if data.tfds_name:
            tokenizer_lib.required_dir(data.tokenizer)  # named first, as the pipeline would
            documents.tfds_source(data.tfds_name, data.tfds_train_split, data.tfds_data_dir)

    def documents(self, data, split, tokenizer):
        key, own = _split_key(data, split, "tfds_eval_split", "tfds_train_split")
        return documents.TfdsDocuments(data.tfds_name, getattr(data, key), tokenizer,
                                       data.tfds_data_dir), own


@register
class Translation(Source):
    """Parallel text: line-aligned files or TSVs (data.train_files), else a TFDS dataset."""

    name, kind, task, keys = "translation", "pairs", "translation", specs.TranslationData

    def check(self, data):
        if data.tfds_name and not data.train_files:
            Tfds().check(data)


@register
class Synthetic(Source):
    """Generated BERT pretraining batches (data/synthetic.py): engine tests, dry runs."""

    name, kind = "synthetic", "batches"

    def batches(self, config: RunSpec, split, *, batch_size, num_batches, process_index, process_count):
        d = specs.data(config.data).keys
        if d.pack:
            raise ConfigError("data.pack=True: data.name='synthetic' rows are full length "
                             "(nothing to pack); set --config.data.pack=false")
        return SyntheticPretraining(
            vocab_size=config.model.vocab_size, seq_len=d.max_seq_length,
            max_predictions=d.max_predictions_per_seq, batch_size=batch_size, seed=config.seed,
            split=split, process_index=process_index, process_count=process_count,
            num_batches=num_batches, nsp=getattr(config.model, "nsp", True))


@register
class SyntheticCopy(Source):
    """Generated translation batches (a reversal task, no files)."""

    name, kind, task, keys = "synthetic_translation", "batches", "translation", specs.TranslationData

    def batches(self, config: RunSpec, split, *, batch_size, num_batches, process_index, process_count):
        return SyntheticTranslation(
            vocab_size=config.model.vocab_size, seq_len=config.data.max_seq_length,
            batch_size=batch_size, seed=config.seed, split=split, process_index=process_index,
            process_count=process_count, num_batches=num_batches)


def prepare(spec: RunSpec, out_dir: str | Path, docs_per_shard: int = 50_000) -> dict[str, int]:
    """Tokenizes the run's corpus once into array_record shards `train-NNNNN` and (every
    data.heldout_every-th document) `validation-NNNNN` (local or gs://); returns documents per
    split."""
    d = spec.data
    if not isinstance(d.keys, specs.PretrainingData):
        raise ValueError(f"`bert-jax prepare` writes a pretraining corpus as shards, for a "
                         f"pretraining config (configs/bert_pretrain.py); this one reads "
                         f"data.name={d.name!r} files as it trains: give it to "
                         "`bert-jax train` as it is")
    source = SOURCES.get(d.name)
    if source is None or not source.prepares:
        can = [name for name, s in SOURCES.items() if s.prepares]
        raise ValueError(f"data.name={d.name!r}: `bert-jax prepare` reads a corpus of one of the "
                         f"sources {can}: text files (data.name=text, data.train_files) or a TFDS "
                         "corpus (data.name=tfds, data.tfds_name)")
    paths.check_new_folder(out_dir, "--out")
    out = paths.path(out_dir)
    tokenizer = tokenizer_lib.load_tokenizer(tokenizer_lib.required_dir(d.tokenizer))
    made = not out.exists()  # a folder the user made stays when nothing is prepared into it
    out.mkdir(parents=True, exist_ok=True)

    def written_away() -> None:
        """The shards just written removed (the folder was new or empty), and the folder if
        made here (gs:// has no folders: an emptied prefix is gone with its objects)."""
        for f in out.iterdir():
            f.unlink()
        if made and not paths.is_remote(str(out_dir)):
            out.rmdir()
    every = d.heldout_every
    buffers: dict[str, list[documents.Document]] = {"train": [], "validation": []}
    counts = {"train": 0, "validation": 0}
    shards = {"train": 0, "validation": 0}

    def flush(split: str) -> None:
        if buffers[split]:
            documents.write_array_record(buffers[split], out / f"{split}-{shards[split]:05d}.array_record")
            shards[split] += 1
            buffers[split] = []

    for i, doc in enumerate(source.stream(d.keys, tokenizer)):
        split = "validation" if every > 0 and i % every == every - 1 else "train"
        buffers[split].append(doc)
        counts[split] += 1
        if len(buffers[split]) >= docs_per_shard:
            flush(split)
    flush("train")
    flush("validation")
    if counts["train"] == 0:  # shards of nothing would train nothing: say so, leave no folder
        written_away()
        where = d.train_files if d.name == "text" else f"{d.tfds_name} ({d.tfds_train_split})"
        raise ValueError(f"data.name={d.name!r}: no training documents in {where} (empty, or "
                         f"every document went to validation: data.heldout_every="
                         f"{d.heldout_every}); give text to prepare")
    if every > 0 and counts["validation"] == 0:  # its eval_files glob would match nothing
        written_away()
        raise ValueError(f"data.heldout_every={every}: {counts['train']} document(s), none held out "
                         f"for validation (document {every} would be the first); lower "
                         "data.heldout_every (1 document in N is held out), give more documents, "
                         "or set it to 0 for no validation shards; nothing written")
    return counts
