"""Fine-tuning tasks: a task's data splits -> features for the train loop, and the model's
outputs on a split -> the official metrics and prediction files. One file per task family
(glue, ner, squad, swag: reader, features, official metric, writer), the metrics they share
(scoring) and this registry; a new task lands here (its `data` keys' defaults beside the
others, in config.finetune_defaults). It may import models, data, config and the base modules;
never training or anything above.

A Task has `main_metric` (ranks checkpoints; higher is better), `eval_splits` (evaluated
every `train.eval_every` steps; metrics of the first are `eval/<metric>`, of the others
`eval/<split>/<metric>`), `features(split)` (numpy arrays, cached), `score(split, outputs)`
and `write_predictions(split, outputs, out_dir)`. `split` is 'train', 'dev', 'test' or a
file path. Outputs are the model's outputs per example in file order (padding dropped).
Registry: TASKS, chosen by `config.data.name`.
"""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np
from etils import epath

from bert_jax import config as config_lib
from bert_jax import paths
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.tasks import glue, ner, scoring, squad, swag

log = logging.getLogger(__name__)


class Task:
    """What every task shares: the config's data section, the tokenizer, a features cache."""

    main_metric = "accuracy"
    eval_splits: tuple[str, ...] = ("dev",)

    def __init__(self, config: ml_collections.ConfigDict):
        self.config, self.data = config, config.data
        try:
            self.tokenizer = tokenizer_lib.load_tokenizer(tokenizer_dir(config))
        except FileNotFoundError as e:
            raise config_lib.ConfigError(f"{e}; set --config.data.tokenizer=<the directory of the "
                                         "vocabulary the checkpoint was trained with>") from None
        self.tokenizer.check_fits(config.model.vocab_size, f"tokenizer of {tokenizer_dir(config)}")
        self._examples: dict[str, Any] = {}
        self._features: dict[str, dict[str, np.ndarray]] = {}
        self._meta: dict[str, Any] = {}  # per split: what maps outputs back to examples

    def path(self, split: str) -> Path | epath.Path:
        """The file of `split`: data.<split>_file under data.data_dir, or split itself if a path
        (local or gs://, see paths.path)."""
        if split not in ("train", "dev", "test"):
            return paths.path(split)
        name = self.data[f"{split}_file"]
        if not name:
            raise config_lib.ConfigError(f"data.{split}_file is empty: set it to the {split} file")
        if paths.is_remote(name):
            return paths.path(name)
        if not self.data.data_dir and not Path(name).is_absolute():
            raise config_lib.ConfigError(
                f"data.data_dir is empty: set --config.data.data_dir=<folder with {name}>")
        if Path(name).is_absolute():
            return Path(name)
        return paths.path(self.data.data_dir) / name

    def examples(self, split: str):
        if split not in self._examples:
            path = self.path(split)
            paths.check_reachable(path)  # gs:// without a network: one line, not minutes of retries
            if not path.is_file():
                where = ("give an existing file" if split not in ("train", "dev", "test", "dev_mismatched")
                         else "check data.data_dir (and the file names)")
                raise FileNotFoundError(f"{self.data.name} {split} file not found: {path}; {where}")
            examples = self.read(path, training=split == "train")
            if not examples:
                raise ValueError(f"{path}: no examples found; expected a {self.data.name} {split} "
                                 "file with at least one example")
            self._examples[split] = examples
        return self._examples[split]

    def features(self, split: str) -> dict[str, np.ndarray]:
        if split not in self._features:
            self._features[split], self._meta[split] = self.encode(self.examples_limited(split),
                                                                   training=split == "train")
        return self._features[split]

    def meta(self, split: str):
        self.features(split)
        return self._meta[split]

    def labeled(self, split: str) -> bool:
        """Whether every example of the split has its gold label (test files have none)."""
        return all(e.label is not None for e in self.examples(split))

    def examples_limited(self, split: str):
        """examples(split), only the first data.max_train_examples for training when > 0."""
        examples, limit = self.examples(split), self.data.get("max_train_examples", 0)
        return examples[:limit] if split == "train" and limit > 0 else examples

    def num_train_examples(self) -> int:
        return len(next(iter(self.features("train").values())))


class GlueTask(Task):
    """The nine GLUE tasks (TSV files in the GLUE layout, or TFDS `glue/<task>`)."""

    def __init__(self, config):
        super().__init__(config)
        self.task = config.data.task
        self.spec = glue.task_spec(self.task)
        if config.data.source not in ("files", "tfds"):
            raise config_lib.ConfigError(f"data.source={config.data.source!r}; choose files (the GLUE "
                                         "TSVs under data.data_dir) or tfds")
        want = 1 if self.spec.labels is None else len(self.spec.labels)
        if config.model.get("num_labels", want) != want:
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
        if split not in ("train", "dev", "test", "dev_mismatched"):
            return paths.path(split)
        if not self.data.data_dir:
            raise config_lib.ConfigError("data.data_dir is empty: set --config.data.data_dir=<the GLUE "
                                         f"folder holding {self.spec.directory}/>")
        return glue.task_path(self.data.data_dir, *self._task_split(split))

    def examples(self, split: str):
        if self.data.source == "tfds" and split in ("train", "dev", "test", "dev_mismatched"):
            if split not in self._examples:
                self._examples[split] = glue.read_glue_tfds(*self._task_split(split),
                                                            data_dir=self.data.data_dir or None)
            return self._examples[split]
        return super().examples(split)

    def read(self, path: Path, training: bool = False):
        return glue.read_glue(self.task, path, skip_bad_rows=self.data.skip_bad_rows)

    def encode(self, examples, training: bool):
        return glue.encode(examples, self.tokenizer, self.data.max_seq_length, self.spec.labels), None

    def _predictions(self, outputs) -> np.ndarray:
        logits = outputs["logits"]
        return logits[:, 0] if self.spec.labels is None else np.argmax(logits, -1)

    def score(self, split: str, outputs) -> dict[str, float]:
        task = self._task_split(split)[0]
        return scoring.glue_metrics(task, self.features(split)["label_ids"], self._predictions(outputs))

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


class NerTask(Task):
    """Token tagging (CoNLL-2003, WNUT-17, any `token ... tag` column file), entity-level F1."""

    main_metric = "f1"

    def __init__(self, config):
        super().__init__(config)
        self.labels = tuple(config.data.labels)
        if len(self.labels) != config.model.num_labels:
            raise config_lib.ConfigError(f"data.labels has {len(self.labels)} tags but model.num_labels="
                                         f"{config.model.num_labels}; set --config.model.num_labels="
                                         f"{len(self.labels)}")

    def labeled(self, split: str) -> bool:
        return all(s.tags is not None for s in self.examples(split))

    def read(self, path: Path, training: bool = False):
        sentences = ner.read_columns(path, skip_bad_rows=self.data.skip_bad_rows)
        if sentences and sentences[0].tags is not None:
            ner.check_tags(sentences, self.labels, path)
        return sentences

    def encode(self, sentences, training: bool):
        f = ner.encode(sentences, self.tokenizer, self.labels, self.data.max_seq_length)
        keys = ("input_ids", "token_type_ids", "attention_mask", "label_ids", "label_weights")
        return {k: getattr(f, k) for k in keys}, f

    def _tags(self, split: str, outputs) -> list[list[str]]:
        sentences = self.examples(split)
        return ner.decode_predictions(self.meta(split), np.argmax(outputs["logits"], -1),
                                      self.labels, [len(s.words) for s in sentences])

    def score(self, split: str, outputs) -> dict[str, float]:
        sentences = self.examples(split)
        s = ner.entity_scores([x.tags for x in sentences], self._tags(split, outputs))
        return {"precision": s["precision"], "recall": s["recall"], "f1": s["f1"]}

    def write_predictions(self, split: str, outputs, out_dir: Path) -> list:
        out = paths.path(out_dir) / f"{self.path(split).stem}_predictions.txt"
        return [ner.write_tags(out, self.examples(split), self._tags(split, outputs))]


class SwagTask(Task):
    """SWAG four-way multiple choice (CSV or JSON lines)."""

    def read(self, path: Path, training: bool = False):
        return swag.read_swag(path, skip_bad_rows=self.data.skip_bad_rows)

    def encode(self, examples, training: bool):
        return swag.encode(examples, self.tokenizer, self.data.max_seq_length), None

    def score(self, split: str, outputs) -> dict[str, float]:
        examples = self.examples(split)
        return {"accuracy": scoring.accuracy([e.label for e in examples],
                                             np.argmax(outputs["logits"], -1))}

    def write_predictions(self, split: str, outputs, out_dir: Path) -> list:
        out = paths.path(out_dir) / f"{self.path(split).stem}_predictions.csv"
        with paths.open(out, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["guid", "label", *[f"logit{i}" for i in range(swag.NUM_CHOICES)]])
            for e, row in zip(self.examples(split), outputs["logits"]):
                w.writerow([e.guid, int(np.argmax(row)), *[f"{x:.4f}" for x in row]])
        return [out]


class SquadTask(Task):
    """SQuAD v1.1 / v2.0 span extraction; official EM / F1 (percent, as the official script)."""

    main_metric = "f1"

    def __init__(self, config):
        super().__init__(config)
        self.version_2 = bool(config.data.version_2)

    def labeled(self, split: str) -> bool:
        return all(e.answers or e.is_impossible for e in self.examples(split))

    def read(self, path: Path, training: bool = False):
        # Training needs the answer spans (and checks them).
        return squad.read_squad(path, is_training=training, version_2=self.version_2,
                                skip_bad_rows=self.data.skip_bad_rows)

    def encode(self, examples, training: bool):
        d = self.data
        f = squad.encode(examples, self.tokenizer, max_seq_length=d.max_seq_length,
                         doc_stride=d.doc_stride, max_query_length=d.max_query_length,
                         is_training=training)
        keys = ["input_ids", "token_type_ids", "attention_mask"]
        keys += ["start_positions", "end_positions"] if training else []
        return {k: getattr(f, k) for k in keys}, f

    def _postprocess(self, split: str, outputs):
        examples, d = self.examples(split), self.data
        return squad.postprocess(
            examples, self.meta(split), outputs["start_logits"], outputs["end_logits"],
            n_best_size=d.n_best_size, max_answer_length=d.max_answer_length,
            version_2=self.version_2, null_score_diff_threshold=d.null_score_diff_threshold,
            lowercase=self.tokenizer.lowercase)

    def score(self, split: str, outputs) -> dict[str, float]:
        predictions, _, _ = self._postprocess(split, outputs)
        return squad.evaluate(self.examples(split), predictions, version_2=self.version_2)

    def write_predictions(self, split: str, outputs, out_dir: Path) -> list:
        predictions, nbest, null_odds = self._postprocess(split, outputs)
        return [squad.write_predictions(out_dir, predictions, nbest, null_odds if self.version_2 else {})]


TASKS = {"glue": GlueTask, "ner": NerTask, "swag": SwagTask, "squad": SquadTask}


def tokenizer_source(config) -> str:
    """data.tokenizer, else the init_from checkpoint directory (a `bert-jax convert` output
    and a training workdir hold their tokenizer files), else ""."""
    return config.data.get("tokenizer") or config.get("init_from") or ""


def tokenizer_dir(config) -> str:
    """tokenizer_source, required."""
    directory = tokenizer_source(config)
    if not directory:
        raise config_lib.ConfigError("no tokenizer: set --config.data.tokenizer=<dir with vocab.txt or "
                                     "spm.model> (or --config.init_from=<converted checkpoint>)")
    return directory


def from_config(config) -> Task | None:
    """The fine-tuning task of config.data.name, or None for pretraining data."""
    cls = TASKS.get(config.data.name)
    return cls(config) if cls else None


def resolve_steps(config, task: Task | None) -> ml_collections.ConfigDict:
    """A copy of `config` with train.steps from train.epochs (when train.steps is 0) and
    schedule.warmup_steps from schedule.warmup_fraction (when > 0), logged so the run shows
    what it did. A train.steps set by the user is kept as it is."""
    epochs, fraction = config.train.get("epochs", 0.0), config.schedule.get("warmup_fraction", 0.0)
    from_epochs = epochs > 0 and config.train.steps == 0
    if not from_epochs and not fraction:
        return config
    config = config.copy_and_resolve_references()
    if from_epochs:
        if task is None:
            raise config_lib.ConfigError("train.epochs: pretraining data has no epoch size; set "
                                         "train.steps instead")
        n = task.num_train_examples()
        config.train.steps = max(1, math.ceil(epochs * n / config.train.batch_size))
        log.info(f"{n:,} training examples ({config.data.name}), batch {config.train.batch_size}: "
                 f"train.epochs={epochs} -> train.steps={config.train.steps}")
    if fraction:
        config.schedule.warmup_steps = int(fraction * config.train.steps)
        log.info(f"schedule.warmup_fraction={fraction} of train.steps={config.train.steps} -> "
                 f"schedule.warmup_steps={config.schedule.warmup_steps}")
    return config

