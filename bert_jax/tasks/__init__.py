"""Fine-tuning tasks: a task's data splits -> features for the train loop, and the model's
outputs on a split -> the official metrics and prediction files. A task is one file that
registers itself (glue, ner, squad, swag: reader, features, official metric, writer, and a
`Task` subclass decorated with `register`); `base` holds the `Task` interface and the
registry, `scoring` the metrics tasks share, this module the fine-tuning recipe
(`finetune_defaults`) and the helpers that ask the registry. It may import models, data,
config, paths, trees and log; never training or anything above.

A new task lands here as one file (imported below), or in your own module that your config
file imports: subclass `Task`, set `name` (the data.name that chooses it), implement `read`,
`encode`, `score` and `write_predictions`, add its `data` keys in `defaults`, and decorate it
with `register`; `finetune_defaults(name, size)` then gives its config, and train and eval
run it (docs/finetuning.md, "A new task"). A Task has `main_metric` (ranks checkpoints;
higher is better), `eval_splits` (evaluated every `train.eval_every` steps; metrics of the
first are `eval/<metric>`, of the others `eval/<split>/<metric>`), `features(split)` (numpy
arrays, cached), `score(split, outputs)` and `write_predictions(split, outputs, out_dir)`.
`split` is one of `splits` ('train', 'dev', 'test') or a file path. Outputs are the model's
outputs per example in file order (padding dropped). How its files and runs are recognised:
`file_kind`, `looks_like`, `run_name`, `evaluates`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Collection

import ml_collections

from bert_jax import config as config_lib
from bert_jax.specs import RunSpec, TaskData
from bert_jax.tasks import glue, ner, pairs, squad, swag  # noqa: F401 (each registers its task)
from bert_jax.tasks.base import TASKS, Task, register, tokenizer_dir, tokenizer_source

__all__ = ["TASKS", "Task", "TaskData", "register", "tokenizer_dir", "tokenizer_source", "finetune_defaults",
           "from_config", "run_name", "evaluates", "task_of_file", "resolve_steps"]

log = logging.getLogger(__name__)


def finetune_defaults(task: str, size: str = "base") -> ml_collections.ConfigDict:
    """training_defaults with the BERT paper's fine-tuning recipe (A.3: batch 32, 3 epochs, Adam
    (Google's, adam_weight_decay) lr 2e-5 of 5e-5, 3e-5, 2e-5, 10% warmup then linear decay,
    evaluation on dev) and the `data` section of `task` (a name in TASKS: glue, ner, squad,
    swag), which may change the recipe (Task.defaults); `size` tiny or mini: a CPU-sized run."""
    if task not in TASKS:
        *rest, last = TASKS
        raise config_lib.ConfigError(f"fine-tuning task {task!r}: choose {', '.join(rest)} or {last}")
    config = config_lib.training_defaults()
    config.optimizer.learning_rate = 2e-5
    config.optimizer.weight_decay = 0.01
    config.schedule.name = "warmup_linear"
    config.schedule.warmup_fraction = 0.1
    config.train.batch_size = 32
    config.train.steps = 0  # from train.epochs
    config.train.epochs = 3.0
    config.train.eval_every = 0
    config.train.eval_steps = 0  # the whole dev set
    config.train.log_every = 50
    config.train.checkpoint_every = 1000
    config.train.keep_checkpoints = 1  # plus the best by the task's main metric
    TASKS[task].defaults(config)
    # CPU-sized runs (also modernbert-tiny), often from scratch: a larger step size
    if size.rpartition("-")[2] in ("tiny", "mini"):
        config.optimizer.learning_rate = 1e-3
        # with bias correction: adam_weight_decay's early steps (up to 6.6x) at this lr leave
        # SST-2, MRPC and NER from scratch at the majority class (docs/training.md#optimizers)
        config.optimizer.name = "adamw"
        config.train.log_every = 10
    return config


def from_config(config: RunSpec) -> Task | None:
    """The fine-tuning task of config.data.name, or None for pretraining data."""
    cls = TASKS.get(config.data.name)
    return cls(config) if cls else None


def run_name(data) -> str | None:
    """A fine-tuning run's task as its config file names it (glue sst2, squad v2.0, ner...), from
    its data section; None for pretraining and translation data."""
    cls = TASKS.get(data.get("name"))
    return cls.run_name(data) if cls else None


def evaluates(ran_data, data) -> bool:
    """Whether a run fine-tuned with the data section `ran_data` is evaluated with a config of
    `data` (its own task, or one its task scores: GLUE's ax by an MNLI run); True for runs
    that were not fine-tuned."""
    ran = run_name(ran_data)
    return ran is None or TASKS[ran_data.get("name")].evaluates(ran, run_name(data))


def task_of_file(head: bytes, other_than: str) -> type[Task] | None:
    """The task, other than data.name `other_than`, whose files start unmistakably as `head`."""
    return next((cls for name, cls in TASKS.items() if name != other_than and cls.looks_like(head)),
                None)


def resolve_steps(spec: RunSpec, task: Task | None, set_by_user: Collection[str] = ()) -> RunSpec:
    """`spec` with train.steps from train.epochs (when train.steps is 0) and
    schedule.warmup_steps from schedule.warmup_fraction (when > 0), logged so the run shows
    what it did, and written into the config it saves. A train.steps set by the user is kept
    as it is; so is a schedule.warmup_steps given on the command line (`set_by_user`: dotted
    keys) over the config file's fraction (config.warmup_from_user)."""
    t, schedule = spec.train, spec.schedule
    if config_lib.warmup_from_user(spec, set_by_user):
        log.info(f"--config.schedule.warmup_steps={schedule.warmup_steps}: the config's "
                 f"schedule.warmup_fraction={schedule.warmup_fraction} is not used")
        schedule = dataclasses.replace(schedule, warmup_fraction=0.0)
        saved = json.loads(spec.saved)
        saved["schedule"]["warmup_fraction"] = 0.0
        spec = dataclasses.replace(spec, schedule=schedule, saved=json.dumps(saved))
    epochs, fraction = t.epochs, schedule.warmup_fraction
    from_epochs = epochs > 0 and t.steps == 0
    if not from_epochs and not fraction:
        return spec
    if from_epochs:
        if task is None:
            raise config_lib.ConfigError("train.epochs: pretraining data has no epoch size; set "
                                         "train.steps instead")
        n = task.num_train_examples()
        t = dataclasses.replace(t, steps=max(1, math.ceil(epochs * n / t.batch_size)))
        log.info(f"{n:,} training examples ({spec.data.name}), batch {t.batch_size}: "
                 f"train.epochs={epochs} -> train.steps={t.steps}")
    if fraction:
        schedule = dataclasses.replace(schedule, warmup_steps=int(fraction * t.steps))
        log.info(f"schedule.warmup_fraction={fraction} of train.steps={t.steps} -> "
                 f"schedule.warmup_steps={schedule.warmup_steps}")
    saved = json.loads(spec.saved)
    saved["train"]["steps"], saved["schedule"]["warmup_steps"] = t.steps, schedule.warmup_steps
    return dataclasses.replace(spec, train=t, schedule=schedule, saved=json.dumps(saved))

