"""The fine-tuning task interface (`Task`), the registry (`TASKS`, `register`) and the tokenizer
a task reads with."""

from __future__ import annotations

import abc
import logging
from pathlib import Path
from typing import Any, ClassVar

import ml_collections
import numpy as np
from etils import epath

from bert_jax import config as config_lib
from bert_jax import paths, specs
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.specs import RunSpec

log = logging.getLogger(__name__)

TASKS: dict[str, type[Task]] = {}  # data.name -> its Task, in the order registered


def register(cls: type[Task]) -> type[Task]:
    """Class decorator: `cls` becomes the task of `data.name == cls.name`, its data section
    read as `cls.Data`."""
    if not cls.name:
        raise ValueError(f"{cls.__name__}: set `name`, the data.name that chooses the task")
    TASKS[cls.name] = cls
    specs.register_data(cls.name, cls.Data, task=cls.name, source=False)
    return cls


class Task(abc.ABC):
    """A fine-tuning task on the config's data section: reads a split's file, encodes its
    examples as features (cached), scores the model's outputs and writes prediction files.
    `split` is a name in `splits` (its file from the config) or a file path."""

    name: ClassVar[str] = ""  # the data.name that chooses it
    main_metric = "accuracy"  # ranks checkpoints; higher is better
    eval_splits: tuple[str, ...] = ("dev",)  # evaluated every train.eval_every steps; the first is eval/
    splits: ClassVar[tuple[str, ...]] = ("train", "dev", "test")  # the names --split takes
    file_kind: ClassVar[str] = ""  # what its files are, as errors name them ("a SWAG file")
    Data: ClassVar[type[specs.TaskData]] = specs.TaskData  # its data section's keys

    # What the run is: its defaults and how its files and runs are recognised.

    @classmethod
    def defaults(cls, config: ml_collections.ConfigDict) -> None:
        """Adds the `data` section (its keys: `Data`); a task changes the fine-tuning recipe
        (finetune_defaults) after calling this."""
        config.data = specs.section(cls.Data)
        config.data.name = cls.name

    @classmethod
    def looks_like(cls, head: bytes) -> bool:
        """Whether a file starting with `head` is unmistakably one of this task's (so a --split
        file of another run's task is named as such); False when no start is unmistakable."""
        return False

    @classmethod
    def run_name(cls, data) -> str:
        """The run's task as its config file names it (glue sst2, squad v2.0, ner), from `data`."""
        return cls.name

    @classmethod
    def evaluates(cls, ran: str, asked: str | None) -> bool:
        """Whether a run fine-tuned on `ran` (a run_name) is evaluated with a config of `asked`
        (a run_name; None: not a fine-tuning config)."""
        return ran == asked

    # What every task implements.

    @abc.abstractmethod
    def read(self, path: Path | epath.Path, training: bool = False) -> list:
        """The examples of a file (training: with what training needs, e.g. answer spans)."""

    @abc.abstractmethod
    def encode(self, examples: list, training: bool) -> tuple[dict[str, np.ndarray], Any]:
        """(features as numpy arrays of one row per example or window, what maps outputs back
        to examples or None)."""

    @abc.abstractmethod
    def score(self, split: str, outputs: dict[str, np.ndarray]) -> dict[str, float]:
        """The official metrics of the model's outputs on `split` (one row per example in file
        order, padding dropped); holds main_metric."""

    @abc.abstractmethod
    def write_predictions(self, split: str, outputs: dict[str, np.ndarray], out_dir: Path) -> list:
        """Writes the task's prediction files for `split` into out_dir; returns their paths."""

    # Shared: the files, examples and features of a split, cached.

    def __init__(self, config: specs.RunSpec):
        self.config, self.data = config, config.data.keys
        try:
            self.tokenizer = tokenizer_lib.load_tokenizer(tokenizer_dir(config))
        except FileNotFoundError as e:
            raise config_lib.ConfigError(f"{e}; set --config.data.tokenizer=<the directory of the "
                                         "vocabulary the checkpoint was trained with>") from None
        self.tokenizer.check_fits(config.model.vocab_size, f"tokenizer of {tokenizer_dir(config)}")
        self._examples: dict[str, Any] = {}
        self._features: dict[str, dict[str, np.ndarray]] = {}
        self._meta: dict[str, Any] = {}  # per split: what maps outputs back to examples
        self._said: set[str] = set()  # the warnings said (say_once)

    def say_once(self, warning: str | None) -> None:
        """Logs the warning line `warning` (None: nothing) the first time only: a run
        evaluates every train.eval_every steps, and a file's property is worth one line."""
        if warning is not None and warning not in self._said:
            self._said.add(warning)
            log.warning(warning)

    def path(self, split: str) -> Path | epath.Path:
        """The file of `split`: data.<split>_file under data.data_dir, or split itself if a path
        (local or gs://, see paths.path)."""
        if split not in self.splits:
            return paths.path(split)
        name = getattr(self.data, f"{split}_file")
        if not name:
            raise config_lib.ConfigError(f"data.{split}_file is empty: set it to the {split} file")
        return self.file(name)

    def file(self, name: str) -> Path | epath.Path:
        """A data file's path: `name` under data.data_dir, or itself if absolute or gs://."""
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
            self._examples[split] = self.read_file(self.path(split), split)
        return self._examples[split]

    def read_file(self, path, split: str) -> list:
        """The examples of `split`'s file `path`, which must exist and hold one."""
        if not path.is_file():  # a folder there, or data.data_dir a file: said as such
            where = ("give an existing file" if split not in self.splits
                     else "check data.data_dir (and the file names)")
            if wrong := paths.wrong_kind(path, "", ("file",), "a file"):
                raise IsADirectoryError(f"{self.data.name} {split} file {wrong}; {where}")
            under = self.data.data_dir and str(path).startswith(str(self.data.data_dir))
            if under and (wrong := paths.wrong_kind(self.data.data_dir, "data.data_dir",
                                                   paths.FOLDER_KINDS, "a folder")):
                raise NotADirectoryError(f"{wrong}; give the folder that holds the {split} file")
            raise FileNotFoundError(f"{self.data.name} {split} file not found: {path}; {where}")
        examples = self.read(path, training=split == "train")
        if not examples:
            raise ValueError(f"{path}: no examples found; expected a {self.data.name} {split} "
                             "file with at least one example")
        return examples

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
        examples, limit = self.examples(split), self.data.max_train_examples
        return examples[:limit] if split == "train" and limit > 0 else examples

    def num_train_examples(self) -> int:
        return len(next(iter(self.features("train").values())))

    def train_datasets(self) -> tuple[tuple[int, ...], str]:
        """(the sizes of the datasets the training features hold one after the other, how
        batches are drawn from them: data/finetune.py's MIXES); one dataset: ((n,), "")."""
        return (self.num_train_examples(),), ""


def tokenizer_source(config: RunSpec) -> str:
    """data.tokenizer, else the init_from checkpoint directory (a `bert-jax convert` output
    and a training workdir hold their tokenizer files), else ""."""
    return getattr(config.data, "tokenizer", "") or config.init_from


def tokenizer_dir(config: RunSpec) -> str:
    """tokenizer_source, required."""
    directory = tokenizer_source(config)
    if not directory:
        raise config_lib.ConfigError("no tokenizer: set --config.data.tokenizer=<dir with vocab.txt or "
                                     "spm.model> (or --config.init_from=<converted checkpoint>)")
    return directory
