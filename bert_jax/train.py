"""The training loop: state init or resume, the jitted sharded train step, evaluation,
metrics, checkpoints, preemption.

State is a dict {params, opt_state, step}: params a plain nested dict of float32 arrays
(the model is rebuilt from it with `nnx.merge` inside the step), sharded by the logical
axis rules; the batch is sharded over ('data', 'fsdp'). Read top to bottom:
train_step -> init/restore -> train_and_evaluate (evaluation: evaluate.py).
"""

from __future__ import annotations

import functools
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import checkpoint, evaluate, models, objectives, optim, sharding, tasks
from bert_jax import config as config_lib
from bert_jax.data import pipelines, vocab
from bert_jax.metrics import MetricsWriter, mfu, peak_flops_per_device

Array = jax.Array


class TrainingDiverged(ValueError):
    """Loss or gradient norm became NaN/Inf."""


def _split_microbatches(x: Array, k: int, mesh) -> Array:
    """[B, ...] -> [k, B/k, ...] taking every k-th row, so each device's rows split evenly
    into the k microbatches and no data moves between devices."""
    x = jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)
    spec = PartitionSpec(None, sharding.BATCH_AXES, *([None] * (x.ndim - 2)))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def train_step(state: dict, batch: dict[str, Array], *, graphdef, objective, tx, schedule,
               accum: int, dropout_key: Array, mesh) -> tuple[dict, dict[str, Array]]:
    """One optimizer step over the global batch (k accumulated microbatches when accum > 1)."""
    params, step = state["params"], state["step"]
    rng = jax.random.fold_in(dropout_key, step)
    # Each loss term is normalised by its weight over the whole batch, so microbatch losses
    # add up to exactly the big-batch loss.
    denominators = {k: jnp.where(w > 0, w, 1.0) for k, w in objective.weights(batch).items()}

    def loss_fn(p, mb, key):
        terms, metrics = objective(nnx.merge(graphdef, p), mb, key)
        return sum(terms[k] / denominators[k] for k in terms), metrics

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if accum == 1:
        (loss, metrics), grads = grad_fn(params, batch, jax.random.fold_in(rng, 0))
    else:
        micro = jax.tree.map(lambda x: _split_microbatches(x, accum, mesh), batch)

        def body(carry, xs):
            i, mb = xs
            (loss_i, m), g = grad_fn(params, mb, jax.random.fold_in(rng, i))
            return jax.tree.map(jnp.add, carry, (g, loss_i, m)), None

        (loss_s, metrics_s), grads_s = jax.eval_shape(
            grad_fn, params, jax.tree.map(lambda x: x[0], micro), rng)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (grads_s, loss_s, metrics_s))
        (grads, loss, metrics), _ = jax.lax.scan(body, zeros, (jnp.arange(accum), micro))

    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state["opt_state"], params)
    params = optax.apply_updates(params, updates)
    out = {"loss": loss, "grad_norm": grad_norm, "learning_rate": schedule(step)}
    out.update({k: s / jnp.maximum(n, 1e-12) for k, (s, n) in metrics.items()})
    return {"params": params, "opt_state": opt_state, "step": step + 1}, out


def model_config(config) -> dict[str, Any]:
    """The model section with the run's compute dtype (`dtype` is set once, at top level)."""
    return {**config.model.to_dict(), "dtype": config.dtype}


def abstract_state(config, tx, mesh):
    """(graphdef, abstract state, state shardings) without allocating anything."""
    model = models.abstract_model(model_config(config))
    graphdef, params_state = nnx.split(model, nnx.Param)
    param_sh = sharding.param_shardings(params_state, mesh, config.logical_axis_rules)
    params = nnx.to_pure_dict(params_state)
    opt_state = jax.eval_shape(tx.init, params)
    opt_sh = optax.tree_map_params(tx, lambda _, s: s, opt_state, param_sh,
                                   transform_non_params=lambda _: sharding.replicated(mesh))
    state = {"params": params, "opt_state": opt_state,
             "step": jax.ShapeDtypeStruct((), jnp.int32)}
    state_sh = {"params": param_sh, "opt_state": opt_sh, "step": sharding.replicated(mesh)}
    return graphdef, state, state_sh


def init_state(config, tx, state_sh, pretrained: dict | None = None) -> dict:
    """Fresh parameters (from config.seed), with those in `pretrained` (a subtree of the
    params) taking their place, and a fresh optimizer state; created already sharded."""
    def init(pretrained):
        model = models.create_model(model_config(config), seed=config.seed)
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        params = _overlay(params, pretrained)
        return {"params": params, "opt_state": tx.init(params), "step": jnp.int32(0)}
    return jax.jit(init, out_shardings=state_sh)(pretrained or {})


def _overlay(tree: dict, new: dict) -> dict:
    return {k: (_overlay(v, new[k]) if isinstance(v, dict) else new[k]) if k in new else v
            for k, v in tree.items()}


def _pretrained(config, abstract_params, mesh) -> dict:
    """The config.init_from weights that fit this model (task heads stay fresh);
    `abstract_params` carry the target shardings."""
    found, fresh, unused = checkpoint.load_pretrained(
        config.init_from, model_config(config), abstract_params, mesh)
    _print0(f"init_from {config.init_from}: {len(jax.tree.leaves(found))} tensors loaded"
            + (f"; freshly initialised: {', '.join(fresh)}" if fresh else "")
            + (f"; not used: {', '.join(unused)}" if unused else ""))
    return found


def _with_shardings(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def phase_config(config, step: int):
    """(phase index, the config with that phase's data lengths, the step where it ends) for
    `config.data.phases` = ((first step, max_seq_length, max_predictions_per_seq), ...)."""
    phases = tuple(config.data.get("phases") or ())
    if not phases:
        return 0, config, config.train.steps
    index = max(i for i, p in enumerate(phases) if step >= p[0])
    phase_cfg = config.copy_and_resolve_references()
    phase_cfg.data.max_seq_length = int(phases[index][1])
    phase_cfg.data.max_predictions_per_seq = int(phases[index][2])
    end = phases[index + 1][0] if index + 1 < len(phases) else config.train.steps
    return index, phase_cfg, min(end, config.train.steps)


def model_flops_per_step(config, batch: dict) -> float:
    """Training FLOPs of the model's matmuls per step (3x forward: backward is 2x)."""
    seq_len = batch["input_ids"].shape[-1]
    f = models.flops_per_token(model_config(config), seq_len)
    fwd = f.get("encoder_per_token", 0.0) * batch["input_ids"].size
    if "masked_lm_positions" in batch:
        fwd += f.get("mlm_head_per_predicted_token", 0.0) * batch["masked_lm_positions"].size
    return 3 * fwd


class _Preemption:
    """SIGTERM (TPU maintenance / preemption) -> save at the next step boundary and exit 0."""

    def __init__(self):
        self.requested = threading.Event()
        self._old = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, lambda *_: self.requested.set())
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


def _print0(*args) -> None:
    if jax.process_index() == 0:
        print(*args, flush=True)


def train_and_evaluate(config, workdir: str) -> dict[str, Any]:
    """Trains `config` in `workdir`, resuming from its latest good checkpoint if any.
    Returns a summary (final step, last metrics, last eval, whether preempted)."""
    config_lib.validate(config, jax.device_count(), jax.process_count())
    task = tasks.from_config(config)  # None for pretraining data
    if task is not None:
        config = tasks.resolve_steps(config, task)
    objective = objectives.for_model(config.model.name)
    tx, schedule = optim.make_optimizer(config)
    mesh = sharding.make_mesh(config.mesh)
    t = config.train
    if "://" not in workdir:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        tokenizer = tasks.tokenizer_source(config)
        if jax.process_index() == 0 and tokenizer and "://" not in tokenizer and Path(tokenizer).is_dir():
            vocab.copy_tokenizer(tokenizer, workdir)  # the workdir can then be an init_from
    config_json = json.loads(config.to_json())

    # Outside set_mesh: under a mesh, nnx.eval_shape takes logical names for mesh axes.
    graphdef, abstract, state_sh = abstract_state(config, tx, mesh)
    with jax.set_mesh(mesh):
        best_metric = f"eval/{task.main_metric}" if task else None
        ckpt = checkpoint.TrainCheckpointer(workdir, keep=t.keep_checkpoints, best_metric=best_metric)
        restored = ckpt.restore_latest(_with_shardings(abstract["params"], state_sh["params"]),
                                       _with_shardings(abstract["opt_state"], state_sh["opt_state"]))
        if restored:
            start, params, opt_state, data_state = restored
            step0 = jax.device_put(jnp.int32(start), state_sh["step"])
            state = {"params": params, "opt_state": opt_state, "step": step0}
            _print0(f"resumed from {ckpt.path}/{start}")
        else:
            pretrained = _pretrained(config, _with_shardings(abstract["params"], state_sh["params"]),
                                     mesh) if config.init_from else None
            start, state, data_state = 0, init_state(config, tx, state_sh, pretrained), {}
        if start >= t.steps:
            _print0(f"already trained: checkpoint step {start} >= train.steps={t.steps}")
            ckpt.close()
            return {"step": start, "preempted": False}

        step_fn = jax.jit(
            functools.partial(train_step, graphdef=graphdef, objective=objective, tx=tx,
                              schedule=schedule, accum=t.grad_accum_steps, mesh=mesh,
                              dropout_key=jax.random.key(config.seed + 1)),
            out_shardings=(state_sh, sharding.replicated(mesh)), donate_argnums=0)
        evaluator = evaluate.make_evaluator(config, graphdef, objective, mesh, task)
        peak, peak_source = peak_flops_per_device()
        # Simulated CPU devices share one measured host peak; real accelerators each have theirs.
        num_peaks = 1 if jax.devices()[0].platform == "cpu" else jax.device_count()
        n_params = sum(x.size for x in jax.tree.leaves(abstract["params"]))
        _print0(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind} "
                f"({jax.process_count()} processes); mesh {dict(mesh.shape)}; peak "
                f"{peak / 1e12:.2f} TFLOP/s per device ({peak_source})\n"
                f"model: {config.model.name}, {n_params:,} parameters; state "
                f"{sharding.bytes_per_device(abstract, state_sh) / 2**20:,.1f} MiB per device")

        phase: dict[str, Any] = {}

        def start_phase(step: int, saved: dict) -> None:
            """Data pipeline and compiled step of the sequence-length phase at `step`."""
            index, phase_cfg, end = phase_config(config, step)
            pipeline = pipelines.make(phase_cfg, "train", task=task)
            if saved and saved.get("phase") == index:
                pipeline.set_state(saved["pipeline"])
            first = sharding.global_batch(next(pipeline), mesh, jax.process_count())
            t0 = time.perf_counter()
            compiled = step_fn.lower(state, first).compile()
            flops = model_flops_per_step(config, first)
            phase.update(index=index, config=phase_cfg, end=end, pipeline=pipeline, batch=first,
                         compiled=compiled, flops=flops, tokens=first["input_ids"].size)
            _print0(f"phase {index} from step {step}: batch {t.batch_size} x "
                    f"{first['input_ids'].shape[1:]} in {t.grad_accum_steps} microbatch(es), "
                    f"{flops / 1e9:,.2f} model GFLOPs per step; compiled in "
                    f"{time.perf_counter() - t0:.1f}s")

        start_phase(start, data_state)
        writer = MetricsWriter(workdir, enabled=jax.process_index() == 0, total_steps=t.steps,
                               resume_step=start)
        summary: dict[str, Any] = {"step": start, "preempted": False}
        clock = {"time": time.perf_counter(), "step": start}

        def finish(step: int, metrics_dev) -> None:
            """Host side of a finished step: NaN check, then the metrics line."""
            m = jax.device_get(metrics_dev)
            if not (np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"])):
                good = ckpt.manager.latest_step()
                raise TrainingDiverged(
                    f"step {step}: loss {m['loss']}, grad norm {m['grad_norm']} (not finite); "
                    f"stopped. Last good checkpoint: "
                    f"{f'{ckpt.path}/{good}' if good is not None else 'none'}; lower "
                    f"optimizer.learning_rate or raise schedule.warmup_steps")
            if step % t.log_every == 0 or step == t.steps:
                now = time.perf_counter()
                rate = (step - clock["step"]) / max(now - clock["time"], 1e-9)
                clock.update(time=now, step=step)
                line = {k: float(v) for k, v in m.items()}
                line.update(steps_per_sec=rate, tokens_per_sec=rate * phase["tokens"],
                            mfu=mfu(phase["flops"], 1 / rate, num_peaks, peak))
                writer.write(step, line)
                summary["metrics"] = line

        pending, step = None, start
        try:
            with _Preemption() as preemption:
                while step < t.steps:
                    if step == phase["end"]:
                        start_phase(step, {})
                    batch = phase.pop("batch", None) or sharding.global_batch(
                        next(phase["pipeline"]), mesh, jax.process_count())
                    state, metrics = phase["compiled"](state, batch)
                    step += 1
                    if pending is not None:  # the previous step: done by now, or nearly
                        finish(*pending)
                    pending = (step, metrics)
                    preempted = preemption.requested.is_set() or (
                        jax.process_count() > 1 and ckpt.manager.reached_preemption(step))
                    do_eval = t.eval_every and step % t.eval_every == 0 or step == t.steps
                    # Fine-tuning saves at every evaluation, so the best one can be kept.
                    save = (step % t.checkpoint_every == 0 or step == t.steps or preempted
                            or (do_eval and task is not None))
                    if do_eval or save:
                        finish(*pending)
                        pending = None
                    if do_eval:
                        summary["eval"] = evaluator.run(state["params"], phase["config"])
                        writer.write(step, summary["eval"])
                    if save:
                        data_state = {"phase": phase["index"],
                                      "pipeline": phase["pipeline"].get_state()}
                        ckpt.save(step, state["params"], state["opt_state"], data_state, config_json,
                                  metrics=summary["eval"] if do_eval and task else None)
                    if do_eval or save:  # keep their time out of the next tokens/s
                        clock.update(time=time.perf_counter(), step=step)
                    if preempted:
                        _print0(f"SIGTERM: saved checkpoint {ckpt.path}/{step}; exiting")
                        summary["preempted"] = True
                        break
                if pending is not None:
                    finish(*pending)
        finally:
            ckpt.wait()
            ckpt.close()
            writer.close()
        summary["step"] = step
        summary.update(steps=t.steps, best_metric=best_metric)
        if jax.process_index() == 0:  # sweeps read it to skip finished runs
            (checkpoint.workdir_path(workdir) / "summary.json").write_text(
                json.dumps(summary, indent=1) + "\n")
        return summary
