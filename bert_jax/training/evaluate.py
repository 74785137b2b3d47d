"""Evaluation: the eval steps, the evaluator interface (`Evaluator`) and its registry, and
`bert-jax eval --config ... --workdir <dir> --step latest|best|N|all` over saved checkpoints.

Evaluators (chosen by the run's task, else by its objective; see `EVALUATORS`):
"loss", ObjectiveEvaluator: the objective's metrics on the validation split (pretraining:
held-out documents). "task", TaskEvaluator: a fine-tuning task's official metrics on its dev
split(s), from the model outputs of every example; it can also write the task's prediction
files. "translation": the loss plus BLEU of decoded dev sentences (bert_jax.translation).
"""

from __future__ import annotations

import functools
import importlib
import itertools
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from bert_jax import config as config_lib
from bert_jax import paths, tasks
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.paths import workdir_path
from bert_jax.specs import RunSpec
from bert_jax.tasks import scoring
from bert_jax.training import checkpoint, setup, sharding, state
from bert_jax.training import input as pipelines
from bert_jax.training import metrics as metrics_lib

log = logging.getLogger(__name__)

Array = jax.Array


def eval_step(params: dict, batch: dict[str, Array], *, graphdef, objective) -> dict:
    """Sums (not means) of the loss terms, their weights and the metrics on one batch."""
    terms, metrics = objective(nnx.merge(graphdef, params), batch, None)
    return {"terms": terms, "weights": objective.weights(batch), "metrics": metrics}


def predict_step(params: dict, batch: dict[str, Array], *, graphdef, objective) -> tuple[dict, dict]:
    """(eval_step's sums, the model outputs) on one batch of a fine-tuning task."""
    out = objective.forward(nnx.merge(graphdef, params), batch, None)
    terms, metrics = objective.loss(out, batch)
    out = {**out, "example_weight": batch["example_weight"]}  # which rows are padding
    return {"terms": terms, "weights": objective.weights(batch), "metrics": metrics}, out


def _sharded(config: RunSpec, mesh, fn):
    """`fn` with the activation layout of the train step (config.shard_activations)."""
    if config.shard_activations:
        return sharding.activation_sharding(fn, mesh, config.logical_axis_rules)
    return fn


def jit_eval_step(config: RunSpec, graphdef, objective, mesh, *, outputs: bool = False):
    """The jitted eval step on params and a batch; with `outputs`, the predict step, whose model
    outputs are replicated so that every host gets all of them."""
    if outputs:
        return jax.jit(_sharded(config, mesh, functools.partial(
            predict_step, graphdef=graphdef, objective=objective)),
            out_shardings=sharding.replicated(mesh))
    return jax.jit(_sharded(config, mesh, functools.partial(
        eval_step, graphdef=graphdef, objective=objective)))


def _finish(total: dict, prefix: str) -> dict[str, float]:
    """Loss and metrics from summed eval_step outputs. A term or metric over no example (a
    weight of 0: CoSENT's loss on pairs without scores) has no value and is left out, never
    reported as 0; the loss too when none of its terms has one."""
    total = jax.device_get(total)
    terms = [k for k in total["terms"] if total["weights"][k] > 0]
    out = {f"{prefix}loss": float(sum(total["terms"][k] / total["weights"][k] for k in terms))
           } if terms else {}
    out.update({f"{prefix}{k}": float(s / n) for k, (s, n) in total["metrics"].items() if n > 0})
    return out


class Evaluator(Protocol):
    """What the train loop and `bert-jax eval` call. Built as
    `cls(config=, graphdef=, objective=, mesh=, task=)`; `prepare()` reads the eval data (a bad
    eval file stops a run before training); `run()` returns {"eval/<metric>": value}."""

    def prepare(self) -> None: ...

    def run(self, params, *, config: RunSpec | None = None, out_dir=None,
            splits=None) -> dict[str, float]:
        """config: the current length phase's config (pretraining); out_dir: where prediction
        files go (tasks); splits: which eval splits (tasks; default all)."""


class ObjectiveEvaluator:
    """The objective's metrics over `train.eval_steps` batches of the validation split."""

    def __init__(self, *, config: RunSpec, graphdef, objective, mesh, task=None):
        self.config, self.mesh, self.objective = config, mesh, objective
        self.fn = jit_eval_step(config, graphdef, objective, mesh)
        self.phase_fns: dict[Any, Any] = {}  # phases whose model differs (their rope base)

    def _fn(self, config: RunSpec):
        if config.model == self.config.model:
            return self.fn
        key = config.model
        if key not in self.phase_fns:
            self.phase_fns[key] = jit_eval_step(config, state.graphdef_of(config), self.objective,
                                                self.mesh)
        return self.phase_fns[key]

    def prepare(self) -> None:
        """Reads one validation batch, so missing eval files or too few held-out documents
        stop a run before training rather than at its first evaluation."""
        next(iter(pipelines.make(self.config, "validation", num_batches=1)))

    def run(self, params, *, config: RunSpec | None = None, out_dir=None,
            splits=None) -> dict[str, float]:
        config = config or self.config  # pretraining: the current length phase's config
        # The run's batch in every phase (a phase's own may be smaller: batch size warmup), so
        # each evaluation reads the same examples.
        pipeline = pipelines.make(config, "validation", batch_size=self.config.train.batch_size,
                                  num_batches=config.train.eval_steps or None)
        total, fn = None, self._fn(config)
        for local in pipeline:
            sums = fn(params, sharding.global_batch(local, self.mesh, jax.process_count()))
            total = sums if total is None else jax.tree.map(jnp.add, total, sums)
        return _finish(total, "eval/")


class TaskEvaluator:
    """A fine-tuning task's loss, objective metrics and official metrics on its eval splits."""

    def __init__(self, *, config: RunSpec, graphdef, objective, mesh, task):
        self.config, self.mesh, self.task = config, mesh, task
        self.fn = jit_eval_step(config, graphdef, objective, mesh, outputs=True)

    def outputs(self, params, split: str) -> tuple[dict, dict[str, np.ndarray]]:
        """(summed losses and metrics, model outputs of every example of `split` in order)."""
        pipeline = pipelines.task_pipeline(self.config, self.task.features(split), train=False)
        total, outs = None, []
        for local in pipeline:
            batch = sharding.global_batch(local, self.mesh, jax.process_count())
            sums, out = self.fn(params, batch)
            total = sums if total is None else jax.tree.map(jnp.add, total, sums)
            out = jax.device_get(out)
            keep = out.pop("example_weight") > 0
            outs.append({k: v[keep] for k, v in out.items()})
        return total, {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}

    def prepare(self) -> None:
        """Reads and encodes the eval splits now (they are cached), so a missing or malformed
        dev file stops a run before training rather than at its first evaluation."""
        for split in self.task.eval_splits:
            self.task.features(split)

    def run(self, params, *, config: RunSpec | None = None, out_dir=None,
            splits=None) -> dict[str, float]:
        results: dict[str, float] = {}
        for i, split in enumerate(splits or self.task.eval_splits):
            prefix = "eval/" if i == 0 else f"eval/{Path(split).stem}/"
            total, outputs = self.outputs(params, split)
            if self.task.labeled(split):  # an unlabeled (test) file gets predictions only
                results.update(_finish(total, prefix))
                results.update({f"{prefix}{k}": float(v)
                                for k, v in self.task.score(split, outputs).items() if np.isscalar(v)})
            if out_dir is not None and jax.process_index() == 0:
                with paths.staged_output(out_dir) as local:  # the task writers' files, uploaded
                    local.mkdir(parents=True, exist_ok=True)
                    files = [paths.path(out_dir) / Path(f).relative_to(local)
                             for f in self.task.write_predictions(split, outputs, local)]
                log.info(f"predictions on {split}: {', '.join(map(str, files))}")
        return results


# Evaluator kinds. A kind whose code lives above training (translation decodes with its own
# modules) is named "module:Class" and imported when chosen, so training never imports it: the
# way big_vision loads its evaluators by name.
EVALUATORS: dict[str, type | str] = {
    "loss": ObjectiveEvaluator,
    "task": TaskEvaluator,
    "translation": "bert_jax.translation.translate:TranslationEvaluator",
}


def evaluator_class(kind: str) -> type:
    entry = EVALUATORS[kind]
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        entry = getattr(importlib.import_module(module), name)
    return entry


def make_evaluator(config: RunSpec, graphdef, objective, mesh, task=None) -> Evaluator:
    """The evaluator of a fine-tuning task, else the one its objective names."""
    kind = "task" if task is not None else objective.evaluator(config)
    return evaluator_class(kind)(config=config, graphdef=graphdef, objective=objective, mesh=mesh,
                                 task=task)


def chosen_steps(workdir: str, spec: str, best_metric: str | None = None) -> list[int]:
    """`latest`, `best`, `all` or a step number -> checkpoint steps present in workdir."""
    path = checkpoint.checkpoint_dir(workdir)
    with checkpoint.manager(workdir) as m:
        steps = sorted(m.all_steps())
        scored = {s: (m.metrics(s) or {}).get(best_metric) for s in steps} if best_metric else {}
    if not steps:
        raise FileNotFoundError(f"{path}: no complete checkpoint to evaluate")
    if spec == "latest":
        return steps[-1:]
    if spec == "all":
        return steps
    if spec == "best":
        best = checkpoint.best_step(scored)
        if best is not None and np.isnan(scored[best]):
            log.info(f"--step=best: {best_metric} is nan (undefined) at every checkpoint of {path} "
                     f"that has it; taking the latest of them, step {best}")
        if best is None and best_metric is None:
            raise ValueError("--step=best: pretraining runs keep no best checkpoint (no task metric); "
                             "use --step=latest, all or a step number")
        if best is None:
            raise ValueError(f"--step=best: no checkpoint in {path} has an evaluation of {best_metric} "
                             "(train saves one with each evaluation); use --step=latest or a step number")
        return [best]
    if not spec.isdigit() or int(spec) not in steps:
        raise ValueError(f"--step={spec!r}: use latest, best, all or one of {steps}")
    return [int(spec)]


def undefined(name: str, value: float) -> bool:
    """Whether the metric `name` (eval/pearson, eval/<split>/spearman_cosine...) is nan because
    it is undefined, a correlation with a constant side (the task said which in a warning), not
    because the model failed: a model whose outputs are not finite has a non-finite loss too."""
    return bool(np.isnan(value)) and name.rsplit("/", 1)[-1] in scoring.CORRELATIONS


def _check_split_file(split: str, config: RunSpec, workdir: str) -> None:
    """A --split file in another task's format (a SQuAD JSON on a GLUE run...) is named as
    such, rather than as a malformed row of this task's format."""
    try:
        with paths.path(split).open("rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return  # missing or unreadable: the task's reader says so
    if other := tasks.task_of_file(head, config.data.name):
        ran = tasks.run_name(json.loads(config.saved)["data"])
        raise ValueError(f"--split={split} is {other.file_kind}, but {workdir} is a {ran} run; give a "
                         f"{ran} file, or evaluate a {other.name} run with it")


def run_config(config, workdir: str, set_by_user: frozenset[str] = frozenset()
               ) -> ml_collections.ConfigDict:
    """The config to evaluate `workdir` with: the one stored with its latest checkpoint, or
    `config` (the user's --config) with the stored model section, since the weights decide
    the model; of the model keys the user set on the command line (`set_by_user`, e.g.
    "model.attention_kernel"), those of how it runs (kind "run") apply, and one the checkpoint
    decides otherwise is an error naming it. The tokenizer is the workdir's own copy unless
    data.tokenizer names one."""
    stored = checkpoint.read_config(workdir)
    if config is None:
        if "train" not in stored or "data" not in stored:
            raise config_lib.ConfigError(
                f"{workdir}: its checkpoint stores a model but no training config (a `bert-jax "
                f"convert` output?); pass --config=<the task's config file> to evaluate it")
        config = config_lib.complete(ml_collections.ConfigDict(stored))
        try:
            config_lib.mesh_shape(config.mesh, jax.device_count())
        except config_lib.ConfigError:
            log.info(f"the stored mesh {config.mesh.to_dict()} does not fit {jax.device_count()} "
                     f"devices here; evaluating on mesh data={jax.device_count()}")
            config.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
    else:
        config = config.copy_and_resolve_references()
        model = {k: v for k, v in stored["model"].items() if k != "dtype"}
        if model.get("name") != config.model.get("name"):
            raise config_lib.ConfigError(
                f"{workdir} holds a model.name={model.get('name')!r} model but --config is for "
                f"model.name={config.model.get('name')!r} (data.name={config.data.get('name')!r}); "
                f"leave out --config to evaluate it with its own config, or fine-tune it with "
                f"--config.init_from={workdir}")
        ran, asked = tasks.run_name(stored.get("data", {})), tasks.run_name(config.data)
        # The run's eval/ holds its task's results; another task's numbers would replace them.
        if not tasks.evaluates(stored.get("data", {}), config.data):
            raise config_lib.ConfigError(
                f"{workdir} was fine-tuned on {ran} but --config is for {asked}; its eval/ holds {ran} "
                f"results, never replaced by another task's: leave out --config (or give a {ran} "
                f"config; its other files: --split), or fine-tune on {asked} from it with "
                f"--config.init_from={workdir} and a new --workdir")
        asked = {k.removeprefix("model."): config.model[k.removeprefix("model.")]
                 for k in set_by_user if k.startswith("model.")}
        ignored = {k: v for k, v in asked.items() if k in checkpoint.STATE_FIELDS and model.get(k) != v}
        if ignored:
            key, value = next(iter(sorted(ignored.items())))
            raise config_lib.ConfigError(
                f"--config.model.{key}={value}: the checkpoint in {workdir} decides model.{key} "
                f"({model.get(key)!r}), so the flag would do nothing; drop it (what the model "
                f"runs with, e.g. model.attention_kernel or model.scan_layers, may be set)")
        changed = checkpoint.changed_fields(model, config.model.to_dict(), checkpoint.STATE_FIELDS,
                                            "model.")
        if changed:
            log.info(f"model from the checkpoint in {workdir}, not --config ({changed})")
        model.update({k: v for k, v in asked.items() if k not in checkpoint.STATE_FIELDS})
        config.model = ml_collections.ConfigDict(model)
    data = config.data
    if "tokenizer" in data and not (data.tokenizer and paths.path(data.tokenizer).exists()) and (
            tokenizer_lib.has_tokenizer(workdir)):
        data.tokenizer = str(workdir)
    return config


SPLIT_RECORD = "split.txt"  # in eval/<split>/: the split whose results those are


def split_folder(eval_dir, split: str, is_file: bool) -> tuple[Any, str]:
    """(eval/<split name>/, what its SPLIT_RECORD says) for the results of `split` (a split
    name, or a file: its name without the extension; the record: the name, or the file's
    real path): a file of the same name in another folder gets eval/<name>-2/ (-3, ...)
    instead of replacing the first one's results. A folder without a record (written before
    records were) is taken as this split's."""
    given = os.path.realpath(split) if is_file and not paths.is_remote(split) else split
    name = re.sub(r"[^\w.-]+", "_", Path(split).stem if "/" in split else split)
    for i in itertools.count(1):
        folder = eval_dir / (name if i == 1 else f"{name}-{i}")
        record = folder / SPLIT_RECORD
        if not record.exists() or record.read_text("utf-8").strip() == given:
            break
    if i > 1:
        log.info(f"results of --split={split} in {folder} ({eval_dir / name} holds those of "
                 f"{(eval_dir / name / SPLIT_RECORD).read_text('utf-8').strip()})")
    return folder, given


def evaluate_checkpoints(config, workdir: str, step_spec: str = "latest",
                         split: str | None = None, set_by_user: frozenset[str] = frozenset()
                         ) -> list[dict]:
    """Metrics of each chosen checkpoint, written to <workdir>/eval/step_<N>.json; fine-tuning
    tasks also write their predictions to <workdir>/eval/step_<N>/. A `split` other than the
    task's dev split writes to <workdir>/eval/<split name>/ instead. `config` None: the one
    stored with the checkpoints (see run_config, with the keys `set_by_user` on the command
    line). A result with a non-finite value (but an `undefined` correlation) is an error and
    never replaces a result already written."""
    config = config_lib.resolve(run_config(config, workdir, set_by_user), training=False)
    setup.check(config, platform=setup.platform(), devices=jax.device_count(),
                processes=jax.process_count(), training=False)
    task = tasks.from_config(config)
    engine = setup.build(config, sharding.make_mesh(config.mesh), training=False)
    mesh, target = engine.mesh, engine.params()
    evaluator = make_evaluator(config, engine.graphdef, engine.objective, mesh, task)
    best = f"eval/{task.main_metric}" if task else None
    if split is not None and task is None:
        raise ValueError("--split applies to fine-tuning tasks; pretraining evaluates held-out "
                         "documents and translation its dev set (data.eval_files): leave out "
                         "--split (a translation test set: bert-jax translate --reference)")
    if split is not None and split not in task.splits:
        _check_split_file(split, config, workdir)
    eval_dir, record = workdir_path(workdir) / "eval", None
    if split is not None and split != task.eval_splits[0]:
        # Another split's results go beside the dev ones, never over them: eval/<split>/.
        eval_dir, record = split_folder(eval_dir, split, split not in task.splits)
    results = []
    with jax.set_mesh(mesh):
        for step in chosen_steps(workdir, step_spec, best):
            params = checkpoint.restore_params(workdir, target, step)
            out = eval_dir / f"step_{step}"
            if task is None:
                _, phase_cfg, _ = config_lib.phase_config(config, max(step - 1, 0))
                metrics = evaluator.run(params, config=phase_cfg)
            else:
                metrics = evaluator.run(params, out_dir=out, splits=[split] if split else None)
            result = {"step": step, **metrics}
            bad = sorted(k for k, v in metrics.items() if not np.isfinite(v) and not undefined(k, v))
            if bad:
                raise ValueError(f"checkpoint step {step}: {', '.join(bad)} not finite "
                                 f"({metrics[bad[0]]}); {out.with_suffix('.json')} left as it was")
            if jax.process_index() == 0:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.with_suffix(".json").write_text(metrics_lib.json_dumps(result, indent=1) + "\n")
                if record is not None:
                    (eval_dir / SPLIT_RECORD).write_text(record + "\n", "utf-8")
            results.append(result)
    return results
