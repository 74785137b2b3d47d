"""Run configs: every run default (each once, with a one-line comment; a fine-tuning task's own
are the task's, in bert_jax.tasks), loading `file.py:arg` with `--config.x.y=v` overrides,
and validation that fails before anything compiles.

Config files (configs/*.py) define `get_config(arg)`: they start from the defaults of their
kind of run (`pretraining_defaults()`, `bert_jax.tasks.finetune_defaults(task, size)`,
`translation_defaults()`, or `training_defaults()`, the keys every run has), set `model` (the
model's own fields come from bert_jax.models) and only the values that differ for their setup.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import logging
import math
import shlex
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_collections

from bert_jax import models, paths, specs
from bert_jax.models import attention
from bert_jax.models.config import DTYPES, MODERNBERT_FIXED
from bert_jax.specs import (
    ConfigError,
    DecodeSpec,
    MeshSpec,
    OptimizerSpec,
    PhaseSpec,
    PretrainingData,
    RunSpec,
    ScheduleSpec,
    TrainSpec,
    TranslationData,
    read,
    section,
)

log = logging.getLogger(__name__)

MESH_AXES = ("data", "fsdp", "tensor")  # the device mesh's axes, in order
BATCH_AXES = ("data", "fsdp")  # the axes the examples of a batch are split over

# t5x vocabulary -> mesh axes. A logical axis maps to one mesh axis, several, or None
# (replicated). Params: embed over fsdp (ZeRO-3 style), mlp/heads/vocab over tensor
# (Megatron style); activations: batch over data and fsdp.
# data.instances: what a pretraining row holds (data/pretraining.py); pairs carry NSP labels
INSTANCES = ("pairs", "packed", "full_rows")
MLM_ONLY_DEFAULT = "packed"  # what an MLM-only (model.nsp=False) config chooses: docs/pretraining.md
# init_mode: how init_from's weights become the model's (training/tiling.py, docs/modernbert.md)
INIT_MODES = ("exact", "tile_from_middle", "transplant")

DEFAULT_AXIS_RULES = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("vocab", "tensor"),
    ("kv", None),
    ("length", None),
    ("layers", None),
)
LOGICAL_AXES = tuple(name for name, _ in DEFAULT_AXIS_RULES)  # the names the models use



class MissingExtra(ImportError):
    """An optional dependency a command needs is not installed (the message says how)."""


def phases(data) -> tuple[PhaseSpec, ...]:
    """data.phases as named records. On the command line and in config files each phase is
    written (first step, max_seq_length, max_predictions_per_seq[, batch size[, rope base]]),
    0 in the last two meaning the run's own, or as a dict of PhaseSpec's keys (which alone
    can give a phase its own microbatch); empty: one phase, the data section's values (a
    data section of a kind without phases, translation's or a task's, has that one)."""
    out = []
    given = (data.get("phases") if isinstance(data, ml_collections.ConfigDict)
             else getattr(data, "phases", ()))
    for i, phase in enumerate(tuple(given or ())):
        if isinstance(phase, Mapping):
            missing = [k for k in ("start_step", "seq_len", "predictions") if k not in phase]
            if missing:
                raise ConfigError(f"data.phases[{i}]={dict(phase)} lacks {missing}: a phase "
                                  f"written as a dict needs start_step, seq_len and predictions")
            out.append(read(PhaseSpec, phase, f"data.phases[{i}]"))
            continue
        shown = tuple(phase) if isinstance(phase, (tuple, list)) else phase
        form = (f"data.phases[{i}]={shown}: each phase is (first step, max_seq_length, "
                "max_predictions_per_seq), optionally then its batch size (0: train.batch_size) "
                "and its rope base (0: model.rope_theta), or a dict of those keys "
                "(start_step, seq_len, predictions, batch_size, rope_theta, microbatch)")
        if not isinstance(phase, (tuple, list)) or len(phase) not in (3, 4, 5):
            raise ConfigError(form)
        start, length, predictions, batch, theta = (*phase, 0, 0)[:5]
        try:
            out.append(PhaseSpec(int(start), int(length), int(predictions), int(batch) or None,
                                 float(theta) or None))
        except (TypeError, ValueError):
            raise ConfigError(f"{form}; each entry a number") from None
    _check_phase_order(out)
    return tuple(out)


def _check_phase_order(runs: Sequence[PhaseSpec]) -> None:
    """The first phase starts at step 0 and each later one after the one before: a phase listed
    out of order, or at the start step of another, would never run."""
    if runs and runs[0].start_step != 0:
        raise ConfigError(f"data.phases[0] starts at step {runs[0].start_step}: the first phase "
                          f"must start at step 0 (it sets the data of the run's first steps)")
    for i in range(1, len(runs)):
        before, now = runs[i - 1].start_step, runs[i].start_step
        if now <= before:
            raise ConfigError(
                f"data.phases[{i}] starts at step {now}, "
                + ("the same step as" if now == before else "before") + f" data.phases[{i - 1}] "
                f"(step {before}): list the phases by their first step, each starting later than "
                f"the one before (that phase would never run)")


def phase_microbatch(config, phase: PhaseSpec) -> int:
    """The rows of one microbatch in `phase`: its own, else the run's train.batch_size /
    train.grad_accum_steps."""
    return phase.microbatch or config.train.batch_size // config.train.grad_accum_steps


def training_defaults() -> ml_collections.ConfigDict:
    """The keys every training config has, with the defaults of a small CPU run."""
    c = ml_collections.ConfigDict()
    c.seed = 0  # parameter init, dropout and data order
    c.dtype = "float32"  # compute dtype: float32 | bfloat16 (params and optimizer stay float32)
    c.init_from = ""  # checkpoint dir (bert-jax convert output or workdir) to start from
    # exact: init_from's weights as they are (its sizes unless set); tile_from_middle: a larger
    # model of the config's sizes, each tensor tiled from the checkpoint's (ModernBERT-large from base);
    # transplant: the config's model, with each checkpoint tensor of the same name and shape, any
    # family (a partial start: the rest trained from scratch, both listed)
    c.init_mode = "exact"

    # The sections every run has: their keys, defaults and meanings are the records in specs.py.
    c.optimizer = section(OptimizerSpec)
    c.schedule = section(ScheduleSpec)
    c.train = section(TrainSpec)
    c.mesh = section(MeshSpec)
    c.logical_axis_rules = DEFAULT_AXIS_RULES
    # Activations pinned by the same rules at block boundaries (batch over data+fsdp, heads
    # and mlp over tensor); False leaves their layout to the compiler (`bert-jax plan` shows both)
    c.shard_activations = True
    return c


def pretraining_defaults() -> ml_collections.ConfigDict:
    """training_defaults plus the `data` section of BERT pretraining (configs/bert_pretrain.py;
    its keys: specs.PretrainingData)."""
    config = training_defaults()
    config.data = section(PretrainingData)
    return config


def finetune_defaults(task: str, size: str = "base") -> ml_collections.ConfigDict:
    """bert_jax.tasks.finetune_defaults (each task owns its defaults), kept here for config
    files that call it from this module. Imported when called: the tasks import this module."""
    from bert_jax import tasks  # the one import upwards (tests/helpers.py: LATE_IMPORTS)

    return tasks.finetune_defaults(task, size)


def translation_defaults() -> ml_collections.ConfigDict:
    """training_defaults plus the `data` (specs.TranslationData) and `decode` sections of a
    translation run (configs/wmt.py, multi30k.py)."""
    config = training_defaults()
    config.data = section(TranslationData)
    config.decode = section(DecodeSpec)
    return config


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` (unchanged) or a copy with the keys every run has that it lacks, at their
    defaults (training_defaults): a config saved by an older version, or a hand-built one,
    reads like one made today. Values present are never changed."""
    missing = _missing(config, training_defaults())
    if not missing:
        return config
    config = config.copy_and_resolve_references()
    with config.unlocked():
        for key, value in missing:
            node = config
            for name in key[:-1]:
                node = node[name]
            node[key[-1]] = value
    return config


# The largest whole number a config may hold: what numpy, JAX and XLA's shapes hold (64-bit
# integers; a size beyond it fails as a raw TypeError where XLA takes it). Token counts (a
# schedule's warmup_tokens) pass 32 bits, so this is the bound every count field shares.
INT_LIMIT = 2**63 - 1


def check_int_sizes(section: Mapping[str, Any], where: str = "") -> None:
    """Every whole number in `section` (its subsections and lists too) within +-INT_LIMIT: the
    upper bound of every count field of every section, checked before their own ranges (a
    ConfigError naming the key)."""
    items = section.items() if isinstance(section, Mapping) else enumerate(section)
    for key, value in items:
        name = f"{where}.{key}" if isinstance(section, Mapping) and where else (
            f"{where}[{key}]" if where else str(key))
        if isinstance(value, Mapping | list | tuple):
            check_int_sizes(value, name)
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_LIMIT:
            raise ConfigError(f"{name}={value} is beyond what a run can count (at most 2**63 - 1, "
                              "a 64-bit integer): set a smaller value")


def resolve(config, *, training: bool = True) -> RunSpec:
    """The run config as typed frozen records (specs.RunSpec), what every module below the
    commands reads: each section read as its record (types and ranges checked, a missing key
    at its default), the model section as its family's config with the compute dtype, the
    data section resolved to its source and task, data.phases as PhaseSpec records. A
    RunSpec is returned as it is. `training=False` (eval, translate: a stored config): the
    optimizer and schedule sections, which they do not read, are not checked (an older
    version may have stored a value today's records refuse); a spec with their defaults."""
    if isinstance(config, RunSpec):
        return config
    config = complete(config)
    check_int_sizes(config.to_dict())
    if config.dtype not in DTYPES:
        raise ConfigError(f"dtype={config.dtype!r}; choose one of {list(DTYPES)}")
    seed = config.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise ConfigError(f"seed={seed!r}: a whole number in [0, 2**31) (it seeds parameter init, "
                          "dropout and the data order)")
    if not isinstance(config.init_from, str):
        raise ConfigError(f"init_from={config.init_from!r}: a checkpoint directory (a string; "
                          "empty: none)")
    model_dtype = config.model.get("dtype")
    if model_dtype is not None and model_dtype != config.dtype:
        raise ConfigError(f"model.dtype={model_dtype!r} differs from dtype={config.dtype!r}: the "
                          f"compute dtype is set once, by --config.dtype (remove model.dtype)")
    try:  # a field the model does not read, a value it cannot take
        name, model = models.split_model_config({**config.model.to_dict(), "dtype": config.dtype})
    except ValueError as e:
        raise ConfigError(str(e)) from None
    data = specs.data(config.data)
    return RunSpec(
        model_name=name, model=model, data=data,
        train=read(TrainSpec, config.train, "train"),
        optimizer=_read_used(OptimizerSpec, config.optimizer, "optimizer", training),
        schedule=_read_used(ScheduleSpec, config.schedule, "schedule", training),
        mesh=read(MeshSpec, config.mesh, "mesh"), phases=phases(data.keys),
        decode=read(DecodeSpec, config.decode, "decode") if "decode" in config else None,
        seed=config.seed, dtype=config.dtype, init_from=config.init_from,
        init_mode=init_mode(config),
        logical_axis_rules=tuple(tuple(r) if isinstance(r, list) else r
                                 for r in config.logical_axis_rules),
        shard_activations=bool(config.shard_activations), saved=config.to_json())


def _read_used(record: type, values, where: str, used: bool):
    """read(record, values, where), or (a section the command does not use) the record's
    defaults where it does not read."""
    try:
        return read(record, values, where)
    except ConfigError:
        if used:
            raise
        return record()


def _missing(config, defaults, prefix=()) -> list[tuple[tuple[str, ...], Any]]:
    out = []
    for key, value in defaults.items():
        if key not in config:
            out.append(((*prefix, key), value))
        elif isinstance(value, ml_collections.ConfigDict) and isinstance(
                config[key], ml_collections.ConfigDict):
            out += _missing(config[key], value, (*prefix, key))
    return out


def load(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """`path.py[:arg]` -> get_config(arg), then `key.path=value` overrides applied in order."""
    if "://" in spec:
        raise ConfigError(f"--config={spec}: a config file is a local Python file (it is imported, "
                          "not read as data), never a URL; copy it here (e.g. gcloud storage cp) "
                          "and give that path")
    path, _, arg = spec.partition(":")
    if not Path(path).is_file():
        raise ConfigError(paths.wrong_kind(path, "--config", ("file",), "a config file (path.py[:arg])")
                          or f"--config={spec}: no such file {path}")
    if Path(path).suffix != ".py":
        raise ConfigError(f"--config={spec}: {path} is not a Python file; expected a config file "
                          "defining get_config(arg), e.g. configs/bert_pretrain.py:tiny")
    module_spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not callable(getattr(module, "get_config", None)):
        raise ConfigError(f"--config={spec}: {path} defines no get_config(arg); expected a config "
                          "file like those in configs/")
    try:
        config = module.get_config(arg) if arg else module.get_config()
    except ValueError as e:  # (how a config file refuses a variant it does not know)
        given = f"its argument {arg!r} (after the ':')" if arg else "get_config() without an argument"
        raise ConfigError(f"--config={spec}: {given}: {e}") from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"--config={spec}: get_config returned a {type(config).__name__}, expected "
                          "an ml_collections.ConfigDict")
    if "train" in config:  # a run config (a sweep's has none): the keys every run has
        config = complete(config)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r}: expected --config.key=value")
        set_value(config, key, value)
    return config


def repeated_override(overrides: Sequence[str]) -> str | None:
    """What is wrong when a `key=value` override's key is given twice (the last value replaces
    the first without a word), else None."""
    seen: dict[str, str] = {}
    for item in overrides:
        key, _, value = item.partition("=")
        if key in seen:
            return (f"--config.{key} is given twice ({seen[key]!r}, then {value!r}): the last "
                    "replaces the first")
        seen[key] = value
    return None


def set_value(config: ml_collections.ConfigDict, key: str, text: str) -> None:
    """Sets `key` (dotted) from its command-line text, typed like the current value."""
    names = key.split(".")
    node, where = config, "config"
    while True:
        # A section may hold dotted keys itself (a sweep's grid: "optimizer.learning_rate").
        if isinstance(node, ml_collections.ConfigDict) and ".".join(names) in node:
            leaf = ".".join(names)
            break
        name = names.pop(0)
        if where == "config.model" and not names and name not in node:
            _check_model_reads(node.get("name"), name, text)
        if not isinstance(node, ml_collections.ConfigDict) or name not in node:
            valid = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
            if where == "config" and {"grid", "overrides"} <= set(valid):  # a sweep config
                # (a key the grid holds, as the seed always, cannot also be an override; a flag
                # cannot add a key to the grid)
                how = (f"set a trial's {key} in the grid, {grid_flag(key, text)} (one trial per "
                       f"value)" if key in node["grid"] else f"set {key} for every trial by adding "
                       f"it to the sweep's overrides, "
                       f"{overrides_flag(node['overrides'], f'{key}={text}')}")
                raise ConfigError(f"unknown config key {key!r}: a sweep config has only {valid}; "
                                  f"{how}")
            if where == "config.grid" and "seed" in node:  # a sweep's grid: whole run keys
                raise ConfigError(_not_in_grid(config, ".".join([name, *names]), key, text))
            raise ConfigError(f"unknown config key {key!r}: {where} has no {name!r}; "
                              f"valid keys there: {valid}")
        if not names:
            leaf = name
            break
        node, where = node[name], f"{where}.{name}"
    old = node[leaf]
    if isinstance(old, ml_collections.ConfigDict):
        raise ConfigError(f"--config.{key}={text!r}: {key} is a section, not a value; set its "
                          f"keys one by one, e.g. --config.{key}.<key>=<value> with <key> one of "
                          f"{sorted(old.keys())}")
    try:
        node[leaf] = _parse_like(old, text)
    except (ValueError, SyntaxError) as e:
        raise ConfigError(f"--config.{key}={text!r}: expected {type(old).__name__} "
                          f"like the default {old!r} ({e})") from None


def grid_flag(key: str, text: str) -> str:
    """The flag that sets a sweep grid's `key` to the one value written `text` (as a
    `--config.key=value` flag or a sweep's override writes it), quoted for a shell."""
    try:
        literal = not isinstance(ast.literal_eval(text), str)
    except (ValueError, SyntaxError):
        literal = False  # (a string, as a flag writes it unquoted)
    return f"--config.grid.{key}={shlex.quote(f'({text if literal else json.dumps(text)},)')}"


def _tuple_text(values: Sequence[Any]) -> str:
    """A tuple as a flag writes it, strings in double quotes (so that the shell's single
    quotes hold it as it is)."""
    shown = [json.dumps(v) if isinstance(v, str) else repr(v) for v in values]
    return "(" + ", ".join(shown) + ("," if len(shown) == 1 else "") + ")"


def overrides_flag(overrides: Sequence[str], item: str) -> str:
    """The flag that sets a sweep's overrides to `overrides` plus `item` ("key=value"): the
    flag replaces the whole tuple, so the items the sweep already has are kept in it."""
    kept = [o for o in overrides if o.partition("=")[0] != item.partition("=")[0]]
    return f"--config.overrides={shlex.quote(_tuple_text((*kept, item)))}"


def _not_in_grid(sweep, rest: str, key: str, text: str) -> str:
    """What is wrong with `--config.grid.<rest>` that names no key of a `sweep` config's grid: the
    first part of it that no grid key has (a typo of a grid key's), the grid's keys, and how a
    key that is not in the grid is swept or set."""
    parts, grid = rest.split("."), sweep["grid"]
    same = max(next((i for i, (a, b) in enumerate(zip(parts, k.split("."))) if a != b),
                    min(len(parts), len(k.split(".")))) for k in grid.keys())
    under = f" under {'.'.join(parts[:same])!r}" if same else ""
    try:
        values = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        values = (text,)
    one = values[0] if isinstance(values, (tuple, list)) and len(values) == 1 else "<value>"
    return (f"unknown config key {key!r}: config.grid has no {rest!r} ({parts[same]!r} is not a "
            f"part of any grid key{under}; the grid's keys: {sorted(grid.keys())}). A flag sets "
            f"the values of the grid's keys only: to sweep {rest}, add it to the grid of a copy of "
            f"the sweep file (a new axis, one trial per value); to give it one value in every "
            f"trial, add it to the sweep's overrides, "
            f"{overrides_flag(sweep['overrides'], f'{rest}={one}')}")


def _check_model_reads(model_name, field: str, text: str) -> None:
    """A model field the chosen model does not read (so not in its section): an error naming
    both rather than 'unknown key'."""
    if (model_name in models.MODELS and field in models.ALL_FIELDS
            and field not in models.model_fields(model_name)):
        raise ConfigError(models.not_read(model_name, field, text, where="--config.model"))


def _parse_like(old, text: str):
    if isinstance(old, bool):
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ValueError("not a boolean")
    if isinstance(old, int):
        return int(text)
    if isinstance(old, float):
        return float(text)
    if isinstance(old, str) or old is None:
        return text
    try:
        value = ast.literal_eval(text)  # tuples, lists, dicts
    except (ValueError, SyntaxError):  # (its message names an AST node or a parser state)
        raise ValueError("not a Python literal: write it as in a config file, strings quoted, "
                         "e.g. (64, 128) or (('a', 'b'),)") from None
    if not isinstance(value, type(old)):
        raise ValueError(f"got a {type(value).__name__}")
    return value


def mesh_shape(mesh_cfg, num_devices: int) -> dict[str, int]:
    """Mesh axis sizes with the (at most one) -1 filled in; errors name the keys."""
    mesh = read(MeshSpec, mesh_cfg, "mesh")
    sizes = {axis: getattr(mesh, axis) for axis in MESH_AXES}
    fill = [a for a, n in sizes.items() if n == -1]
    bad = [a for a, n in sizes.items() if n == 0 or n < -1]
    if bad or len(fill) > 1:
        raise ConfigError(f"mesh {sizes}: sizes must be positive, with at most one -1 (fill)")
    fixed = math.prod(n for n in sizes.values() if n != -1)
    if fill:
        if num_devices % fixed:
            raise ConfigError(f"mesh {sizes}: {num_devices} devices are not divisible by the "
                              f"fixed axes' product {fixed}")
        sizes[fill[0]] = num_devices // fixed
    if math.prod(sizes.values()) != num_devices:
        raise ConfigError(f"mesh {sizes} needs {math.prod(sizes.values())} devices but "
                          f"{num_devices} exist; set mesh.data=-1 to use them all")
    return sizes


def check_axis_rules(rules) -> None:
    """Each rule a (logical axis the models use, mesh axis or axes or None) pair."""
    example = "e.g. (('embed', 'fsdp'), ('mlp', 'tensor'))"
    for rule in rules:
        if not (isinstance(rule, (tuple, list)) and len(rule) == 2):
            raise ConfigError(f"logical_axis_rules: {rule!r} is not a (logical axis, mesh axes) pair; "
                              f"write the rules as pairs, {example}")
        name, target = rule
        if name not in LOGICAL_AXES:
            raise ConfigError(f"logical_axis_rules: {name!r} is not a logical axis of the models; "
                              f"use one of {list(LOGICAL_AXES)}")
        targets = tuple(target) if isinstance(target, (tuple, list)) else (target,)
        if bad := [t for t in targets if t is not None and t not in MESH_AXES]:
            raise ConfigError(f"logical_axis_rules: ({name!r}, {target!r}) names mesh axis {bad[0]!r}, "
                              f"which does not exist; the mesh axes are {list(MESH_AXES)} (or None "
                              f"to replicate)")


def validate(config: RunSpec | ml_collections.ConfigDict, num_devices: int | None,
             num_processes: int = 1, *, training: bool = True) -> None:
    """Checks that need no compile: lengths, mesh and batch divisibility (types, ranges and
    the model's fields: resolve); `training=False` (evaluation) skips the training-only ones;
    `num_devices` None (no devices: `bert-jax info`): the mesh's form only, one batch shard.
    (Each choice is checked by its owner: model fields by their family's config
    (models/config.py), optimizer and schedule by optim.make_optimizer.)"""
    spec = resolve(config)
    t = spec.train
    if training and t.steps < 1 and not t.epochs > 0:  # 0 steps: from train.epochs (fine-tuning)
        raise ConfigError(f"train.steps={t.steps} must be >= 1")
    data, model = spec.data.keys, spec.model
    lengths = [data.max_seq_length] + [p.seq_len for p in spec.phases]
    if data.max_seq_length < 3:
        raise ConfigError(f"data.max_seq_length={data.max_seq_length} leaves no room for "
                          "[CLS] A [SEP] B [SEP]; use at least 3")
    if isinstance(data, PretrainingData):
        check_pretraining_data(data, lengths, model)
    try:  # attention the model cannot run
        attention.check(model, [n for n in lengths if n], training=training)
        attention.check_data(model, packed=data.packed)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    # A model without a position table (rope) still declares its context in model.max_len:
    # its checkpoint and an export (max_position_embeddings) say it. Held to it in training
    # only: a run trained past it before this check (nothing failed) is still evaluated.
    limit = model.max_len if model.max_positions is None else model.max_positions
    if max(lengths) > limit and (training or model.max_positions is not None):
        which = ("data.max_seq_length" if lengths[0] == max(lengths) else
                 f"data.phases[{[p.seq_len for p in spec.phases].index(max(lengths))}] length")
        table = ("the model's position table" if model.max_positions is not None
                 else "the context the model declares")
        raise ConfigError(f"{which}={max(lengths)} exceeds {table} (model.max_len={model.max_len}"
                          f"); use at most {limit}, or raise model.max_len")
    if training and isinstance(model, models.BertConfig) and model.hf_family == "modernbert":
        # (a stored model of an older version is still evaluated: training only)
        for key, fixed in MODERNBERT_FIXED.items():
            if getattr(model, key) != fixed:
                raise ConfigError(
                    f"model.{key}={getattr(model, key)!r} with model.hf_family='modernbert': Hugging "
                    f"Face's ModernBERT always has {key}={fixed!r} (the model could not be exported "
                    f"or read back as one); set --config.model.{key}={fixed}")
    if not 0.0 <= t.label_smoothing < 1.0:
        raise ConfigError(f"train.label_smoothing={t.label_smoothing} must be in [0, 1)")
    if num_devices is None:  # the devices the mesh's fixed sizes name (a -1 filled with 1)
        num_devices = math.prod(n for n in (spec.mesh.data, spec.mesh.fsdp, spec.mesh.tensor)
                                if n > 0)
    sizes = mesh_shape(spec.mesh, num_devices)
    check_axis_rules(spec.logical_axis_rules)
    shards = sizes["data"] * sizes["fsdp"]
    if not training:
        if t.batch_size % shards:
            raise ConfigError(f"train.batch_size={t.batch_size} (the eval batch) is not divisible by "
                              f"the batch shards mesh.data*mesh.fsdp={shards}")
        return
    if t.batch_size % t.grad_accum_steps:
        raise ConfigError(f"train.batch_size={t.batch_size} is not divisible by "
                          f"train.grad_accum_steps={t.grad_accum_steps}")
    micro = t.batch_size // t.grad_accum_steps
    if micro % shards:
        raise ConfigError(
            f"microbatch train.batch_size/grad_accum_steps={micro} is not divisible by the batch "
            f"shards mesh.data*mesh.fsdp={shards}; change the batch size or the mesh")
    if t.batch_size % num_processes:
        raise ConfigError(f"train.batch_size={t.batch_size} is not divisible by the "
                          f"{num_processes} processes (each loads an equal share)")
    check_phase_batches(spec, shards, num_processes)
    say_phases_after_the_end(spec)


def say_phases_after_the_end(spec: RunSpec) -> None:
    """A warning naming each data.phases entry and each schedule.stages entry that starts at or
    after train.steps: it never runs in this run (a later run with more steps may reach it).
    train.steps 0: set from train.epochs later, not compared. (A stage's keys are checked by
    training/optim.py; one that is not a dict with a whole start_step is left to it.)"""
    steps = spec.train.steps
    starts = [(f"data.phases[{i}]", p.start_step) for i, p in enumerate(spec.phases)]
    starts += [(f"schedule.stages[{i}]", stage.get("start_step"))
               for i, stage in enumerate(spec.schedule.stages) if isinstance(stage, Mapping)]
    late = [f"{where} (step {start})" for where, start in starts
            if steps >= 1 and isinstance(start, int) and start >= steps]
    if late:
        log.warning(f"warning: {', '.join(late)}: starts at or after train.steps={steps}, never "
                    f"reached in this run; drop it, or raise train.steps past it")


def check_overrides_read(spec: RunSpec, set_by_user: Collection[str]) -> None:
    """A model key given on the command line (`set_by_user`: dotted keys) that the run would
    not read: splash's tile sizes with a kernel that does not tile (in a config file they
    stay, ignored, so that a TPU config runs with another kernel elsewhere: docs/attention.md);
    or two keys that set one value (warmup_from_user)."""
    warmup_from_user(spec, set_by_user)
    if attention.kernel(spec.model.attention_kernel).reads_block_size:
        return
    given = sorted(k for k in set_by_user if k.startswith("model.attention_block"))
    if given:
        raise ConfigError(f"--config.{given[0]}: only a kernel that tiles (splash) reads it; with "
                          f"model.attention_kernel={spec.model.attention_kernel!r} it would do "
                          f"nothing: leave it out, or set --config.model.attention_kernel=splash")


def warmup_from_user(spec: RunSpec, set_by_user: Collection[str]) -> bool:
    """Whether the user's schedule.warmup_steps (a key in `set_by_user`) replaces a warmup
    fraction of the config file; a ConfigError if the user set a fraction (> 0) too: two values
    of one warmup, neither of which would be the run's for sure."""
    fraction = spec.schedule.warmup_fraction
    if not fraction or "schedule.warmup_steps" not in set_by_user:
        return False
    if "schedule.warmup_fraction" in set_by_user:
        raise ConfigError(
            f"--config.schedule.warmup_steps={spec.schedule.warmup_steps} and "
            f"--config.schedule.warmup_fraction={fraction} both set the warmup; give one (a "
            f"fraction of train.steps, or steps with --config.schedule.warmup_fraction=0)")
    return True


def check_phase_batches(config: RunSpec | ml_collections.ConfigDict, shards: int,
                        num_processes: int) -> None:
    """A phase's rope base only with rope, and a phase's batch a whole number of the run's
    microbatches (so each step's shapes stay those of the microbatch the mesh splits) and an
    equal share per process."""
    spec = resolve(config)
    for i, phase in enumerate(spec.phases):
        micro = phase_microbatch(spec, phase)
        if phase.rope_theta is not None:
            positions = getattr(spec.model, "positions", None)
            if positions != "rope":
                raise ConfigError(f"data.phases[{i}] sets a rope base ({phase.rope_theta}) for a "
                                  f"model without rope (model.positions={positions!r}); drop the "
                                  f"5th entry")
            if phase.rope_theta < 0:
                raise ConfigError(f"data.phases[{i}] rope base {phase.rope_theta} must be > 0 (0: "
                                  f"model.rope_theta)")
        which = (f"data.phases[{i}] microbatch={micro}" if phase.microbatch
                 else f"microbatch train.batch_size/grad_accum_steps={micro}")
        batch = phase.batch_size or spec.train.batch_size
        if batch < 1 or batch % micro:
            raise ConfigError(
                f"data.phases[{i}] batch {batch} is not a multiple of the {which} (the rows the "
                f"mesh's {shards} batch shards split); use a multiple of {micro}")
        if phase.microbatch and micro % shards:
            raise ConfigError(f"{which} is not divisible by the batch shards mesh.data*mesh.fsdp="
                              f"{shards}; change it or the mesh")
        if (phase.batch_size or phase.microbatch) and micro % num_processes:
            raise ConfigError(f"{which} is not divisible by the {num_processes} processes (with "
                              f"batch sizes in data.phases each loads an equal share of every "
                              f"microbatch)")


def check_pretraining_data(data: PretrainingData, lengths: Sequence[int], model=None) -> None:
    """The pretraining recipe's data values (data/pretraining.py) in their ranges, and rows
    that the model's head reads (NSP pairs exactly for model.nsp=True)."""
    kind = data.instances
    if kind not in INSTANCES:
        raise ConfigError(f"data.instances={kind!r}; choose one of {list(INSTANCES)} (pairs: BERT's "
                          f"NSP pairs; MLM only: {MLM_ONLY_DEFAULT}, docs/pretraining.md)")
    nsp = bool(getattr(model, "nsp", True)) if model is not None else kind == "pairs"
    if nsp and kind != "pairs":
        raise ConfigError(f"data.instances={kind!r} has no sentence pairs for model.nsp=True (the "
                          "next-sentence head); set --config.model.nsp=False to train the masked LM "
                          "only, or --config.data.instances=pairs")
    if not nsp and kind == "pairs":
        raise ConfigError(f"model.nsp=False (MLM only) has no next-sentence head for data.instances="
                          f"'pairs' (NSP sentence pairs); set --config.data.instances="
                          f"{MLM_ONLY_DEFAULT} (or full_rows), or model.nsp=True")
    # Each row holds at least [CLS] x [SEP] (packed), [CLS] x (full rows), and a pair at least
    # [CLS] A [SEP] B [SEP] with A and B one token each (the recipe draws a short target
    # length from [2, max_seq_length - 3]).
    least, what = {"pairs": (5, "pretraining instances [CLS] A [SEP] B [SEP]"),
                   "packed": (3, "packed sequences [CLS] text [SEP]"),
                   "full_rows": (2, "full rows [CLS] text")}[kind]
    if min(lengths) < least:
        which = (f"data.max_seq_length={lengths[0]}" if lengths[0] < least
                 else f"data.phases length {min(lengths)}")
        raise ConfigError(f"{which} is too short for {what}; use at least {least}")
    if data.name == "synthetic" and kind == "packed":
        raise ConfigError("data.instances='packed': data.name='synthetic' rows are full length "
                          "(nothing to pack); set --config.data.instances=full_rows")
    if kind == "full_rows" and data.pack:
        raise ConfigError("data.pack=True with data.instances='full_rows': full rows have no "
                          "padding to pack; set --config.data.pack=false (or data.instances=packed)")
    rates = {"data.masked_lm_prob": data.masked_lm_prob}
    if data.eval_masked_lm_prob:
        rates["data.eval_masked_lm_prob"] = data.eval_masked_lm_prob
    for key, rate in rates.items():
        if not 0.0 < rate <= 1.0:
            raise ConfigError(f"{key}={rate} is the fraction of tokens masked; use a value in (0, 1] "
                              "(the paper: 0.15; ModernBERT: 0.3 in training, 0.15 in evaluation; "
                              "data.eval_masked_lm_prob=0: the training rate)")
    budgets = [("data.max_seq_length", data.max_seq_length, "data.max_predictions_per_seq",
                data.max_predictions_per_seq)]
    budgets += [(f"data.phases[{i}] length", p.seq_len, f"data.phases[{i}] predictions",
                 p.predictions) for i, p in enumerate(phases(data))]
    for length_key, length, cap_key, cap in budgets:  # a row cannot hold them
        if cap > length:
            raise ConfigError(f"{cap_key}={cap} is more than the {length} tokens of a row "
                              f"({length_key}={length}); set {cap_key} <= {length}")
    if kind != "pairs":  # MLM only: the rate is the recipe, so a cap that would lower it is an error
        for key, rate in rates.items():
            for length_key, length, cap_key, cap in budgets:
                need = round(rate * length)
                if need > cap:
                    raise ConfigError(
                        f"{cap_key}={cap} is below {key}={rate} of {length_key}={length} "
                        f"({need} masked tokens a row); set {cap_key} >= {need}")


def init_mode(config) -> str:
    """config.init_mode, checked to be one of INIT_MODES."""
    mode = config.init_mode
    if mode not in INIT_MODES:
        raise ConfigError(f"init_mode={mode!r}; choose one of {list(INIT_MODES)} (exact: load init_from "
                          f"as it is; tile_from_middle: grow it to a larger model, docs/modernbert.md; "
                          f"transplant: take its tensors that fit, docs/finetuning.md)")
    return mode


def model_config(config) -> dict:
    """The `model` section with the run's compute dtype (`dtype`, set once at top level), as
    the models API takes it (a RunSpec's: its name and every field its model reads)."""
    if isinstance(config, RunSpec):
        return {"name": config.model_name,
                **{k: getattr(config.model, k) for k in models.model_fields(config.model_name)}}
    dtype = config.get("dtype") or config.model.get("dtype", "float32")
    if dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r}; choose one of {list(DTYPES)}")
    return {**config.model.to_dict(), "dtype": dtype}


def phase_stream(spec: RunSpec, index: int) -> Any:
    """Which data stream phase `index` reads: with batch sizes in data.phases, one stream of
    microbatches per (length, predictions, microbatch rows), so a phase that only grows the
    batch reads on where the one before stopped; otherwise each phase its own (started
    afresh)."""
    spec = resolve(spec)
    runs = spec.phases
    if not any(p.batch_size or p.microbatch for p in runs) or index >= len(runs):
        return index
    phase = runs[index]
    return (phase.seq_len, phase.predictions, phase_microbatch(spec, phase))


def phase_config(spec: RunSpec, step: int) -> tuple[int, RunSpec, int]:
    """(phase index, the run spec with that phase's data lengths and batch, the step where it
    ends) for the phase of data.phases (PhaseSpec) that `step` is in. A phase's batch is
    accumulated (train.grad_accum_steps) in the run's microbatch, or its own; its
    rope base is the global layers' rope_theta during the phase (ModernBERT's context
    extension raises it with the length)."""
    spec = resolve(spec)
    runs, t = spec.phases, spec.train
    if not runs:
        return 0, spec, t.steps
    index = max(i for i, p in enumerate(runs) if step >= p.start_step)
    phase = runs[index]
    keys = dataclasses.replace(spec.data.keys, max_seq_length=phase.seq_len,
                               max_predictions_per_seq=phase.predictions)
    changes = {"data": dataclasses.replace(spec.data, keys=keys)}
    if phase.batch_size is not None or phase.microbatch is not None:
        batch = phase.batch_size or t.batch_size
        changes["train"] = dataclasses.replace(
            t, batch_size=batch, grad_accum_steps=batch // phase_microbatch(spec, phase))
    if phase.rope_theta is not None:  # context extension: rope's global base
        changes["model"] = dataclasses.replace(spec.model, rope_theta=phase.rope_theta)
    end = runs[index + 1].start_step if index + 1 < len(runs) else t.steps
    return index, dataclasses.replace(spec, **changes), min(end, t.steps)
