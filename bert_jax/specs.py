"""Typed, frozen records of the sections every run has (train, optimizer, schedule, mesh) and of
a sequence-length phase: each key's type, default and meaning, stated once, here.

Config files and `--config.<key>=<value>` overrides stay ml_collections: config.py builds the
default sections from these records (`section`), and the engine reads a section back with
`read(Record, section, "where")`, which types each value, refuses a key the record does not
have, and fills a key an older or hand-made config leaves out with its default. A choice
(which optimizer, which schedule) is checked by the unit that owns it (training/optim.py).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from typing import Any

import ml_collections


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the fix."""


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """The `train` section: how long, in what batches, and how often to log, evaluate and save."""

    steps: int = 100  # total optimizer steps (fine-tuning: 0 = from train.epochs)
    epochs: float = 0.0  # fine-tuning: > 0 with train.steps=0 sets steps = ceil(epochs * examples / batch)
    label_smoothing: float = 0.0  # sequence targets (transformer, decoder_lm): mass spread over the vocab
    objective: str = ""  # the loss (training/objectives.py OBJECTIVES); empty: the model's own
    batch_size: int = 32  # global, over all hosts and microbatches
    grad_accum_steps: int = 1  # microbatches per step (a scan; same result as one batch)
    log_every: int = 10  # steps between metrics.jsonl lines
    eval_every: int = 0  # steps between evaluations (0: only at the end)
    eval_steps: int = 10  # batches per evaluation (0: the whole eval split)
    checkpoint_every: int = 50  # steps between checkpoints (and one at the end)
    keep_checkpoints: int = 3  # newest K kept


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """The `optimizer` section. The defaults are BERT's: Google's AdamWeightDecayOptimizer (no
    bias correction); adamw is torch's and optax's AdamW (bias-corrected, what HF's Trainer
    uses); stable_adamw is ModernBERT's (AdamW with per-tensor update clipping); translation
    configs set adam. The names: training/optim.py OPTIMIZERS."""

    name: str = "adam_weight_decay"  # adam_weight_decay | adam | adamw | stable_adamw | lamb | sgd
    learning_rate: float = 1e-4  # peak (rsqrt_paper: the paper's scale factor)
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-6
    weight_decay: float = 0.01  # decoupled; not on LayerNorm or biases (stable_adamw: per peak lr)
    grad_clip_norm: float = 1.0  # global-norm clipping; 0 = off


@dataclasses.dataclass(frozen=True)
class ScheduleSpec:
    """The `schedule` section: the learning rate by step (training/optim.py SCHEDULES)."""

    name: str = "warmup_linear"  # rsqrt_paper | warmup_rsqrt | warmup_linear | constant | cosine | wsd
    warmup_steps: int = 10  # linear warmup from 0
    final_fraction: float = 0.0  # cosine, wsd: final lr as a fraction of the peak
    warmup_fraction: float = 0.0  # > 0: warmup_steps = fraction * train.steps (fine-tuning: 0.1)
    # wsd (warmup-stable-decay): the last decay_steps (or decay_fraction * train.steps) steps
    # decay to final_fraction, shaped 1-sqrt (ModernBERT's) or linear; 0: no decay
    decay_steps: int = 0
    decay_fraction: float = 0.0
    decay_shape: str = "1-sqrt"


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """The `mesh` section: the device mesh's axis sizes."""

    data: int = -1  # -1: all devices left after the other axes
    fsdp: int = 1  # parameters and optimizer state split over these devices (ZeRO-3 style)
    tensor: int = 1  # matmuls split over these devices (Megatron style)


@dataclasses.dataclass(frozen=True)
class PhaseSpec:
    """One sequence-length phase of a run (data.phases): from `start_step` on, rows of `seq_len`
    tokens with at most `predictions` masked positions, `batch_size` rows a step (None: the
    run's train.batch_size) and the global layers' rope base `rope_theta` (None: the model's)."""

    start_step: int
    seq_len: int
    predictions: int
    batch_size: int | None = None
    rope_theta: float | None = None


def section(record: type) -> ml_collections.ConfigDict:
    """A config section holding `record`'s defaults (what config files start from)."""
    return ml_collections.ConfigDict(dataclasses.asdict(record()))


def _typed(value: Any, kind: Any, key: str) -> Any:
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ConfigError(f"{key}={value}: a finite number is needed")
        return float(value)
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind in (str, bool) and isinstance(value, kind):
        return value
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
    return record(**{k: _typed(v, kinds[k], f"{where}.{k}") for k, v in given.items()})
