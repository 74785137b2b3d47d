"""Typed, frozen records of a run's sections: those every run has (train, optimizer, schedule,
mesh), the `data` section of each kind of run (pretraining, translation, a fine-tuning task:
`DataSpec`) and a sequence-length phase: each key's type, default and meaning, stated once, here.

Config files and `--config.<key>=<value>` overrides stay ml_collections: config.py builds the
default sections from these records (`section`), and the engine reads a section back with
`read(Record, section, "where")`, which types each value, refuses a key the record does not
have, and fills a key an older or hand-made config leaves out with its default. A choice
(which optimizer, which schedule) is checked by the unit that owns it (training/optim.py).

`data.name` names a data source (data/sources.py) or a fine-tuning task (bert_jax/tasks): both
registries enter their names here (`register_data`), and `data(section)` resolves a data section
once into a `DataSpec`: where the examples come from (`source`), what the run trains them for
(`task`) and the section's typed keys (`keys`).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

import ml_collections


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the fix."""


# Words a user may write to switch a setting that takes a folder: in another case or spelling
# than the setting's own keywords, each would otherwise be a folder of that name in the
# current directory (`--compilation_cache=OFF` caching into ./OFF).
SWITCH_WORDS = frozenset({"auto", "off", "on", "none", "no", "false", "true", "0", "1",
                          "disable", "disabled", "default"})


def folder_or_keyword(value: str, keywords: tuple[str, ...], what: str) -> str:
    """`value` of a setting `what` that is one of `keywords` (exactly) or a folder: a
    ConfigError for a switch word that is not one of them as written (SWITCH_WORDS)."""
    if value not in keywords and value.strip().lower() in SWITCH_WORDS | set(keywords):
        raise ConfigError(f"{what}={value!r} reads as a switch, not a folder: write "
                          f"{' or '.join(keywords)} (lowercase), or ./{value.strip()} for a folder "
                          "of that name")
    return value


def valid(default: Any, values: str) -> Any:
    """A numeric field with its default and its valid values, written ">= 0", "> 0", an
    interval "[0, 1)", or "any" (any finite number): every int and float field of a record
    declares them, read checks them, and tests/unit/test_specs.py fails on a field without."""
    return dataclasses.field(default=default, metadata={"valid": values})


def one_of(default: str, choices: tuple[str, ...]) -> Any:
    """A string field with its default and the values it may take: read refuses any other,
    naming them (so every command that reads the section, `bert-jax info` too, refuses it)."""
    return dataclasses.field(default=default, metadata={"choices": tuple(choices)})


def _within(value: float, values: str) -> bool:
    if values == "any":
        return True
    if values[0] in "[(":
        low, high = (float(x) for x in values[1:-1].split(","))
        return ((low <= value) if values[0] == "[" else (low < value)) and (
            (value <= high) if values[-1] == "]" else (value < high))
    op, bound = values.split()
    return value >= float(bound) if op == ">=" else value > float(bound)


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """The `train` section: how long, in what batches, and how often to log, evaluate and save."""

    steps: int = valid(100, ">= 0")  # total optimizer steps (fine-tuning: 0 = from train.epochs)
    # fine-tuning: > 0 with train.steps=0 sets steps = ceil(epochs * examples / batch)
    epochs: float = valid(0.0, ">= 0")
    # sequence targets (transformer, decoder_lm): mass spread over the vocab
    label_smoothing: float = valid(0.0, "[0, 1)")
    objective: str = ""  # the loss (training/objectives.py OBJECTIVES); empty: the model's own
    batch_size: int = valid(32, ">= 1")  # global, over all hosts and microbatches
    grad_accum_steps: int = valid(1, ">= 1")  # microbatches per step (a scan; same result as one batch)
    log_every: int = valid(10, ">= 1")  # steps between metrics.jsonl lines
    eval_every: int = valid(0, ">= 0")  # steps between evaluations (0: only at the end)
    eval_steps: int = valid(10, ">= 0")  # batches per evaluation (0: the whole eval split)
    checkpoint_every: int = valid(50, ">= 1")  # steps between checkpoints (and one at the end)
    keep_checkpoints: int = valid(3, ">= 1")  # newest K kept


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """The `optimizer` section. The defaults are BERT's: Google's AdamWeightDecayOptimizer (no
    bias correction); adamw is torch's and optax's AdamW (bias-corrected, what HF's Trainer
    uses); stable_adamw is ModernBERT's (AdamW with per-tensor update clipping); translation
    configs set adam. The names: training/optim.py OPTIMIZERS."""

    name: str = "adam_weight_decay"  # adam_weight_decay | adam | adamw | stable_adamw | lamb | sgd
    learning_rate: float = valid(1e-4, "> 0")  # peak (rsqrt_paper: the paper's scale factor)
    b1: float = valid(0.9, "[0, 1)")
    b2: float = valid(0.999, "[0, 1)")
    eps: float = valid(1e-6, ">= 0")
    # decoupled; not on LayerNorm or biases (stable_adamw: per peak lr)
    weight_decay: float = valid(0.01, ">= 0")
    grad_clip_norm: float = valid(1.0, ">= 0")  # global-norm clipping; 0 = off


@dataclasses.dataclass(frozen=True)
class ScheduleSpec:
    """The `schedule` section: the learning rate by step (training/optim.py SCHEDULES)."""

    name: str = "warmup_linear"  # rsqrt_paper | warmup_rsqrt | warmup_linear | constant | cosine | wsd
    warmup_steps: int = valid(10, ">= 0")  # linear warmup from 0
    final_fraction: float = valid(0.0, "[0, 1]")  # cosine, wsd: final lr as a fraction of the peak
    # > 0: warmup_steps = fraction * train.steps (fine-tuning: 0.1)
    warmup_fraction: float = valid(0.0, "[0, 1)")
    # wsd (warmup-stable-decay): the last decay_steps (or decay_fraction * train.steps) steps
    # decay to final_fraction, shaped 1-sqrt (ModernBERT's) or linear; 0: no decay
    decay_steps: int = valid(0, ">= 0")
    decay_fraction: float = valid(0.0, "[0, 1]")
    decay_shape: str = "1-sqrt"
    # Stages (StageSpec, each a dict of its keys): the schedule restarts at each stage's
    # start_step with the stage's own name, peak learning rate and weight decay; empty: one
    # stage, the keys above with optimizer.learning_rate and weight_decay
    stages: tuple = ()


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """One stage of schedule.stages: from `start_step` on (the first stage's is 0), the
    learning rate follows this stage's own schedule (training/optim.py SCHEDULES) restarted
    at that step, over the steps to the next stage's start (the last: to train.steps), with
    the stage's peak learning rate and weight decay: a run resumed from the previous stage's
    checkpoint with a new scheduler and optimizer hyperparameters, as ModernBERT's context
    extension and decay stages are (Composer's reset_time and restart_override), in one run."""

    start_step: int = valid(0, ">= 0")
    name: str = "constant"  # a schedule of SCHEDULES, its keys below
    learning_rate: float | None = valid(None, "> 0")  # the stage's peak; None: optimizer's
    weight_decay: float | None = valid(None, ">= 0")  # None: optimizer.weight_decay
    warmup_steps: int = valid(0, ">= 0")
    # > 0: the warmup is linear in tokens, not steps (Composer's t_warmup in "tok"): the lr
    # reaches its peak after this many tokens (rows x length of each step, from data.phases),
    # which differs from a warmup in steps while a batch-size warmup grows the batch
    warmup_tokens: int = valid(0, ">= 0")
    final_fraction: float = valid(0.0, "[0, 1]")
    decay_steps: int = valid(0, ">= 0")
    decay_fraction: float = valid(0.0, "[0, 1]")
    decay_shape: str = "1-sqrt"


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """The `mesh` section: the device mesh's axis sizes."""

    # (positive, one of them may be -1: config.mesh_shape checks them together)
    data: int = valid(-1, "any")  # -1: all devices left after the other axes
    fsdp: int = valid(1, "any")  # parameters and optimizer state split over these devices (ZeRO-3 style)
    tensor: int = valid(1, "any")  # matmuls split over these devices (Megatron style)


@dataclasses.dataclass(frozen=True)
class PhaseSpec:
    """One sequence-length phase of a run (data.phases): from `start_step` on, rows of `seq_len`
    tokens with at most `predictions` masked positions, `batch_size` rows a step (None: the
    run's train.batch_size), accumulated in microbatches of `microbatch` rows (None: the run's
    train.batch_size / grad_accum_steps) and the global layers' rope base `rope_theta` (None:
    the model's)."""

    start_step: int = valid(0, ">= 0")
    seq_len: int = valid(128, ">= 1")
    predictions: int = valid(20, ">= 0")
    batch_size: int | None = valid(None, ">= 1")
    rope_theta: float | None = valid(None, "> 0")
    microbatch: int | None = valid(None, ">= 1")


@dataclasses.dataclass(frozen=True)
class PretrainingData:
    """The `data` section of pretraining (configs/bert_pretrain.py, modernbert.py): the corpus,
    its tokenizer and BERT's recipe of rows from documents (data/pretraining.py)."""

    name: str = "text"  # the source: text | array_record (bert-jax prepare) | tfds | synthetic
    train_files: str = ""  # comma-separated globs (text, array_record)
    eval_files: str = ""  # held-out files; empty: every heldout_every-th document
    heldout_every: int = valid(100, ">= 0")  # without eval files/split: hold out 1 document in N for eval
    # paragraphs (ordinary text) | sentences (one per line) | document (ordinary text, a file each)
    text_format: str = "paragraphs"
    tfds_name: str = ""  # e.g. wikipedia/20230601.en (read with tfds.data_source)
    tfds_train_split: str = "train"
    tfds_eval_split: str = ""  # empty: hold out documents of the train split
    tfds_data_dir: str = ""
    tokenizer: str = ""  # directory with vocab.txt (WordPiece) or spm.model (SentencePiece)
    max_seq_length: int = valid(128, ">= 1")
    # What a row holds (data/pretraining.py): pairs = BERT's [CLS] A [SEP] B [SEP] with an NSP
    # label (model.nsp=True); MLM only (model.nsp=False): packed = each document cut into
    # sequences of at most max_seq_length, packed into rows with attention within a document
    # (RoBERTa's DOC-SENTENCES, ModernBERT; the MLM-only default) | full_rows = documents
    # concatenated and cut into full rows, attention across them (RoBERTa's FULL-SENTENCES)
    instances: str = "pairs"
    # pairs: a cap (as the original); MLM only: >= round(rate * length)
    max_predictions_per_seq: int = valid(20, ">= 1")
    masked_lm_prob: float = valid(0.15, "(0, 1]")  # fraction of tokens masked in training (ModernBERT: 0.3)
    # in held-out evaluation; 0: masked_lm_prob (ModernBERT: 0.15); checked by config.check_pretraining_data
    eval_masked_lm_prob: float = valid(0.0, "any")
    short_seq_prob: float = valid(0.1, "[0, 1]")  # fraction of instances with a shorter random target length
    whole_word_masking: bool = False
    # static masking: N fixed maskings cycled; 0: dynamic (new each epoch)
    dupe_factor: int = valid(0, ">= 0")
    # Several short instances per row (first fit; attention stays within an instance, NSP at
    # each [CLS]): fewer padding tokens, more instances per step than the paper's one per row.
    pack: bool = False
    max_instances_per_row: int = valid(4, ">= 1")  # with pack: NSP labels per row
    shuffle_window: int = valid(1000, ">= 0")  # instances shuffled within windows of this size
    worker_count: int = valid(0, ">= 0")  # grain worker processes (0: in the training process)
    # Sequence-length phases: ((first step, max_seq_length, max_predictions_per_seq), ...);
    # empty: one phase with the values above. A 4th entry is that phase's global batch (batch
    # size warmup; 0: train.batch_size): a multiple of the microbatch train.batch_size /
    # train.grad_accum_steps, which stays fixed while the number of accumulated microbatches
    # changes. A 5th is the phase's rope base for global layers (context extension; 0: the
    # model's rope_theta). A phase may also be a dict of PhaseSpec's keys (start_step, seq_len,
    # predictions, and any of batch_size, rope_theta, microbatch: the phase's own microbatch
    # rows). Read as PhaseSpec records by config.phases.
    phases: tuple = ()

    @property
    def packed(self) -> bool:
        """Whether rows hold several sequences (data.pack, or MLM-only packed instances)."""
        return self.pack or self.instances == "packed"


@dataclasses.dataclass(frozen=True)
class TranslationData:
    """The `data` section of a translation run (configs/wmt.py, multi30k.py)."""

    name: str = "translation"  # translation | synthetic_translation (a copy task, no files)
    source_lang: str = "en"
    target_lang: str = "de"
    train_files: str = ""  # "dir/train.{lang}.gz" (line-aligned, {lang} per side) or "*.tsv"; "" = TFDS
    eval_files: str = ""  # the dev set, same forms ("" = TFDS tfds_eval_split)
    test_files: str = ""  # the test set (docs/translation.md: bert-jax translate ... --reference)
    tsv_langs: str = ""  # a TSV's column languages in order, e.g. "en,de" ("" = source,target)
    tfds_name: str = ""  # e.g. wmt14_translate/de-en, read with tfds.data_source
    tfds_train_split: str = "train"
    tfds_eval_split: str = "validation"
    tfds_data_dir: str = ""  # "" = TFDS's default
    tokenizer: str = ""  # directory with the shared SentencePiece model (bert-jax vocab --type sentencepiece)
    max_seq_length: int = valid(256, ">= 1")  # tokens per row, each side; longer pairs are dropped
    packing_bins: int = valid(0, ">= 0")  # rows packed at a time (first fit); 0 = one host batch
    worker_count: int = valid(0, ">= 0")  # grain worker processes (0 = in the training process)
    # dev sentences decoded for BLEU at each evaluation (0 = all, -1 = none)
    bleu_sentences: int = valid(0, ">= -1")

    packed = True  # rows hold several sentence pairs


@dataclasses.dataclass(frozen=True)
class TaskData:
    """The `data` section every fine-tuning task has (bert_jax/tasks); a task with keys of its
    own declares a subclass of this as its `Data`."""

    name: str = ""  # the task (bert_jax.tasks.TASKS: glue | ner | squad | swag | yours)
    data_dir: str = ""  # folder holding the files below (GLUE: the folder with MRPC/, SST-2/, ...)
    train_file: str = ""
    dev_file: str = ""
    test_file: str = ""
    tokenizer: str = ""  # vocab directory; empty: config.init_from
    max_seq_length: int = valid(128, ">= 1")
    # Pack several examples into each max_seq_length row (exact: attention, positions and
    # heads stay per example), rows in a few bucket sizes; false: one padded row each.
    pack: bool = True
    skip_bad_rows: bool = False  # True: skip malformed rows with a warning instead of stopping
    max_train_examples: int = valid(0, ">= 0")  # > 0: only the first N training examples

    @property
    def packed(self) -> bool:
        return self.pack


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
    """The `decode` section of a translation run: beam search at evaluation and in `translate`."""

    beam_size: int = valid(4, ">= 1")  # 1 = greedy
    alpha: float = valid(0.6, ">= 0")  # GNMT length penalty ((5 + len) / 6) ** alpha
    max_extra: int = valid(50, ">= 0")  # output length limit: source length + max_extra
    batch_size: int = valid(64, ">= 1")  # sentences per decoding batch


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """A run's `data` section resolved once: where the examples come from (`source`: a data
    source of data/sources.py, or a fine-tuning task's "files" or "tfds"), what the run trains
    them for (`task`: pretraining, translation, or the fine-tuning task's name), whether that
    is a fine-tuning task (bert_jax/tasks), and the section's typed keys (`keys`: PretrainingData,
    TranslationData or the task's TaskData)."""

    source: str
    task: str
    finetuning: bool
    keys: Any

    def __getattr__(self, name: str) -> Any:
        """A key of the section (`spec.data.max_seq_length`), read from `keys`; a key named
        like a field above (GLUE's `task` and `source`) is read as `spec.data.keys.task`."""
        if name.startswith("__") or name == "keys":  # (copy and pickle probe before __init__)
            raise AttributeError(name)
        return getattr(self.keys, name)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """A run config resolved once, at the command boundary (config.resolve), into typed frozen
    records: what every module below the commands reads instead of the ConfigDict. A length
    phase of the run is another RunSpec (config.phase_spec: its lengths, batch and rope base).

    `model` is the model family's own config (models/config.py: every field resolved, the
    compute dtype in it) and `model_name` the model it configures; `saved` is the config as
    written (JSON), what checkpoints store and compare."""

    model_name: str
    model: Any  # models.ModelConfig (BertConfig, DecoderLMConfig, ...)
    data: DataSpec
    train: TrainSpec
    optimizer: OptimizerSpec
    schedule: ScheduleSpec
    mesh: MeshSpec
    phases: tuple  # PhaseSpec records (data.phases); empty: one phase, the data section's
    decode: DecodeSpec | None  # translation runs only
    seed: int
    dtype: str
    init_from: str
    init_mode: str
    logical_axis_rules: tuple
    shard_activations: bool
    saved: str  # the config as written, JSON


# data.name -> (the data source it names or None for a fine-tuning task, what the run trains
# for, the record its section reads as); data/sources.py and bert_jax/tasks enter their names.
DATA_NAMES: dict[str, tuple[str | None, str, type]] = {}


def register_data(name: str, record: type, *, task: str, source: bool) -> None:
    """`data.name=name` reads its section as `record`; `source`: the name is a data source whose
    rows train `task` (pretraining, translation), else it is the fine-tuning task `task`."""
    DATA_NAMES[name] = (name if source else None, task, record)


def data(section: Any, where: str = "data") -> DataSpec:
    """A `data` section (or a DataSpec already) resolved: its name looked up among the data
    sources and fine-tuning tasks, its keys read as their record."""
    if isinstance(section, DataSpec):
        return section
    name = section.get("name")
    if name not in DATA_NAMES:  # the registries enter their names when imported: import them
        import bert_jax.data.sources  # noqa: F401 (tests/helpers.py: LATE_IMPORTS)
        import bert_jax.tasks  # noqa: F401
    if name not in DATA_NAMES:
        named = lambda tasks: [n for n, (s, _, _) in DATA_NAMES.items() if (s is None) == tasks]
        raise ConfigError(f"{where}.name={name!r}; choose one of {named(False)} (fine-tuning: "
                          f"{', '.join(named(True))})")
    source, task, record = DATA_NAMES[name]
    keys = read(record, section, where)
    if source is None:  # a fine-tuning task: its files, or TFDS (GLUE's data.source)
        return DataSpec(getattr(keys, "source", "files"), task, True, keys)
    return DataSpec(source, task, False, keys)


def section(record: type) -> ml_collections.ConfigDict:
    """A config section holding `record`'s defaults (what config files start from)."""
    return ml_collections.ConfigDict(dataclasses.asdict(record()))


def _typed(value: Any, kind: Any, key: str) -> Any:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # `float | None`: optional
        if value is None:
            return None
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ConfigError(f"{key}={value}: a finite number is needed")
        return float(value)
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind in (str, bool) and isinstance(value, kind):
        return value
    if kind is tuple and isinstance(value, (tuple, list)):
        return tuple(value)
    raise ConfigError(f"{key}={value!r}: expected a {kind.__name__}")


def read(record: type, values: Mapping[str, Any], where: str):
    """`values` (a config section, or a record already) as a `record`: each value of its type,
    a key the record does not have refused, a key left out at its default."""
    if isinstance(values, record):
        return values
    given = dict(values.items())
    names = [f.name for f in dataclasses.fields(record)]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ConfigError(f"unknown config key {where}.{unknown[0]}; valid keys there: {names}")
    kinds = typing.get_type_hints(record)
    typed = {k: _typed(v, kinds[k], f"{where}.{k}") for k, v in given.items()}
    for f in dataclasses.fields(record):
        values = f.metadata.get("valid")
        given = typed.get(f.name)  # (finite: _typed; None where the field is optional)
        if values and given is not None and not _within(given, values):
            shown = f"in {values}" if values[0] in "[(" else values
            raise ConfigError(f"{where}.{f.name}={typed[f.name]} must be {shown}; the default is "
                              f"{f.default}")
        choices = f.metadata.get("choices")
        if choices and f.name in typed and typed[f.name] not in choices:
            raise ConfigError(f"{where}.{f.name}={typed[f.name]!r}; choose one of {list(choices)}")
    return record(**typed)
