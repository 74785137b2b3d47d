"""The training loop, in named pieces: the jitted sharded `train_step`; one `Phase` per
sequence length or batch size (its data and compiled step); `cadence` (when to evaluate and save);
`report_step` (metrics lines), `save_and_evaluate`, `Preemption`; `train_loop` runs them in
order, and `train_and_evaluate` sets a run up (`restore_or_init`, `log_setup`) around it.

The state (state.py) is {params, opt_state, step}, sharded by the logical axis rules; the
batch is sharded over ('data', 'fsdp'). What a batch holds and what it costs comes from the
model's objective (objectives.py); evaluation from evaluate.py.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import signal
import threading
import time
from collections.abc import Collection
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import config as config_lib
from bert_jax import tasks
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.paths import WorkdirLock, is_remote, workdir_path
from bert_jax.specs import RunSpec
from bert_jax.training import checkpoint, evaluate, goodput, optim, setup, sharding, state
from bert_jax.training import input as pipelines
from bert_jax.training.metrics import MetricsWriter, json_dumps, mfu, peak_flops_per_device

Array = jax.Array
log = logging.getLogger(__name__)


class TrainingDiverged(ValueError):
    """Loss or gradient norm became NaN/Inf."""


def _split_microbatches(x: Array, k: int, mesh) -> Array:
    """[B, ...] -> [k, B/k, ...] taking every k-th row, so each device's rows split evenly
    into the k microbatches and no data moves between devices."""
    x = jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)
    spec = PartitionSpec(None, config_lib.BATCH_AXES, *([None] * (x.ndim - 2)))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def train_step(state: dict, batch: dict[str, Array], *, graphdef, objective, tx, schedule,
               accum: int, dropout_key: Array, mesh) -> tuple[dict, dict[str, Array]]:
    """One optimizer step over the global batch (k accumulated microbatches when accum > 1;
    an objective whose loss is one function of the whole batch, as the contrastive ones, takes
    the k chunks itself: `chunked_value_and_grad`). Besides the loss and metrics it returns
    the batch's real `tokens` and model `flops`."""
    params, step = state["params"], state["step"]
    rng = jax.random.fold_in(dropout_key, step)
    # Each loss term is normalised by its weight over the whole batch, so microbatch losses
    # add up to exactly the big-batch loss.
    denominators = {k: jnp.where(w > 0, w, 1.0) for k, w in objective.weights(batch).items()}

    def loss_fn(p, mb, key):
        terms, metrics = objective(nnx.merge(graphdef, p), mb, key)
        return sum(terms[k] / denominators[k] for k in terms), metrics

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    whole_batch = getattr(objective, "chunked_value_and_grad", None)  # a loss of the whole batch
    if accum > 1 and whole_batch:
        micro = jax.tree.map(lambda x: _split_microbatches(x, accum, mesh), batch)
        (loss, metrics), grads = whole_batch(graphdef, params, micro, rng, denominators)
    elif accum == 1:
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
    out = {"loss": loss, "grad_norm": grad_norm, "learning_rate": schedule(step),
           "tokens": objective.tokens(batch), "flops": objective.flops(batch)}
    out.update({k: s / jnp.maximum(n, 1e-12) for k, (s, n) in metrics.items()})
    return {"params": params, "opt_state": opt_state, "step": step + 1}, out


def jit_train_step(spec: RunSpec, graphdef, objective, tx, schedule, mesh, state_sh):
    """train_step jitted with the state's shardings (the state buffers are donated), for the
    train.grad_accum_steps of `spec` (a phase's spec: see config.phase_config); lower it
    with the state and `batch_shapes` to compile. Train and plan use this one function."""
    step = functools.partial(train_step, graphdef=graphdef, objective=objective, tx=tx,
                             schedule=schedule, accum=spec.train.grad_accum_steps, mesh=mesh,
                             dropout_key=jax.random.key(spec.seed + 1))
    if spec.shard_activations:
        step = sharding.activation_sharding(step, mesh, spec.logical_axis_rules)
    return jax.jit(step, out_shardings=(state_sh, sharding.replicated(mesh)), donate_argnums=0)


def batch_shapes(spec: dict, mesh) -> dict[str, jax.ShapeDtypeStruct]:
    """An objective's batch_spec with the batch sharding over `mesh`."""
    return {k: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding.batch_sharding(mesh, s.ndim))
            for k, s in spec.items()}


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase of the run (data.phases): its config, data and compiled step."""

    index: int
    config: RunSpec  # the run's spec with this phase's data lengths and batch
    end: int  # the step at which the next phase starts (or train.steps)
    pipeline: Any  # host-local batches, with get_state()/set_state()
    step_fn: Any  # the jitted train step, for this phase's number of microbatches
    objective: Any  # what every batch must look like (objective.batch_spec)
    clock: goodput.Clock  # compiling is timed
    # Per row count (None: a fixed shape; packed fine-tuning batches come in a few row
    # counts): the batch spec and the step compiled for it, each made once.
    specs: dict = dataclasses.field(default_factory=dict)
    compiled: dict = dataclasses.field(default_factory=dict)

    def batch_spec(self, rows: int | None = None) -> dict:
        if rows not in self.specs:
            self.specs[rows] = self.objective.batch_spec(self.config, rows)
        return self.specs[rows]

    def step(self, train_state: dict, batch: dict[str, Array]) -> tuple[dict, dict]:
        rows = self.rows(batch)
        if rows not in self.compiled:
            t0 = time.perf_counter()
            with self.clock.timing("compile"):
                self.compiled[rows] = self.step_fn.lower(train_state, batch).compile()
            log.info(f"compiled the step for packed batches of {rows} rows in "
                     f"{time.perf_counter() - t0:.1f}s")
        return self.compiled[rows](train_state, batch)

    def rows(self, batch: dict) -> int | None:
        return batch["input_ids"].shape[0] if self.objective.rows_vary(self.config) else None


class Microbatches:
    """The train batches of a run with batch sizes in data.phases: each step's batch is the
    next `accum` microbatches (train.batch_size / grad_accum_steps rows) of one stream, so a
    phase that grows the batch reads on from where the one before stopped; the stream's
    position (get_state) counts microbatches."""

    def __init__(self, source, accum: int):
        self.source, self.accum = source, accum

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        parts = [next(self.source) for _ in range(self.accum)]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def get_state(self) -> dict:
        return self.source.get_state()

    def set_state(self, state: dict) -> None:
        self.source.set_state(state)


def _set_position(pipeline, saved: dict) -> None:
    """Puts `pipeline` at the checkpointed position `saved["pipeline"]`. A position this config's
    pipeline cannot take (its data layout changed since the save: data.pack, data.instances
    build other stages, whose state has other keys) is the user's change: an error naming the
    data keys changed (`saved["changes"]`, set by restore_or_init) and the ways on."""
    try:
        pipeline.set_state(saved["pipeline"])
    except (LookupError, TypeError, ValueError) as e:
        where = saved.get("checkpoint", "the checkpoint")
        changed = f"data changed: {saved['changes']}" if saved.get("changes") else "no data key changed"
        raise config_lib.ConfigError(
            f"checkpoint {where}: its data position does not fit this config's data pipeline "
            f"({changed}; {type(e).__name__}: {e}); a resume cannot change how batches are "
            f"built: resume with the stored config ({where}/config), or train in a new --workdir "
            f"(--config.init_from may start it from this run's weights)") from None


def _phase_pipeline(config: RunSpec, phase_cfg: RunSpec, index: int, saved: dict,
                    previous: Phase | None, task):
    """The train batches of phase `index`: the previous phase's stream when they share it
    (config.phase_stream), else a new one at the saved position if that was in this stream."""
    stream = config_lib.phase_stream(config, index)
    if stream == index:  # its own stream, at the phase's batch size
        pipeline = pipelines.make(phase_cfg, "train", task=task)
        if saved and saved.get("phase") == index:
            _set_position(pipeline, saved)
        return pipeline
    if previous is not None and config_lib.phase_stream(config, previous.index) == stream:
        source = previous.pipeline.source
    else:
        micro = phase_cfg.train.batch_size // phase_cfg.train.grad_accum_steps
        source = pipelines.make(phase_cfg, "train", task=task, batch_size=micro)
        if saved and config_lib.phase_stream(config, saved.get("phase", 0)) == stream:
            _set_position(source, saved)
    return Microbatches(source, phase_cfg.train.grad_accum_steps)


def start_phase(config: RunSpec, step: int, saved: dict, *, make_step, state_now, objective, mesh, task,
                clock: goodput.Clock, previous: Phase | None = None) -> Phase:
    """Data pipeline and compiled step of the phase at `step` (after `previous`, when the run
    goes on from it); `saved` is the checkpointed data position (used if it belongs to this
    phase's stream); `make_step(phase config)` jits the step."""
    index, phase_cfg, end = config_lib.phase_config(config, step)
    step_fn = make_step(phase_cfg)
    with clock.host("data"):
        pipeline = _phase_pipeline(config, phase_cfg, index, saved, previous, task)
    t0 = time.perf_counter()
    phase = Phase(index, phase_cfg, end, pipeline, step_fn, objective, clock)
    vary = objective.rows_vary(phase_cfg)
    if not vary:  # a fixed shape: compile now (else at each new row count)
        with clock.timing("compile"):
            phase.compiled[None] = step_fn.lower(state_now, batch_shapes(phase.batch_spec(), mesh)
                                                 ).compile()
    t = phase_cfg.train
    compiled = ("packed into rows; compiles at each new row count" if vary
                else f"compiled in {time.perf_counter() - t0:.1f}s")
    log.info(f"phase {index} from step {step}: batch {t.batch_size} x "
             f"{phase_cfg.data.max_seq_length} tokens in {t.grad_accum_steps} microbatch(es); "
             f"{compiled}")
    return phase


def next_batch(phase: Phase, mesh) -> dict[str, Array]:
    """The next global batch, checked against the shapes the objective trains on."""
    local = next(phase.pipeline)
    batch = sharding.global_batch(local, mesh, jax.process_count())
    want = phase.batch_spec(phase.rows(batch))
    got = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
    if got != want:
        diff = sorted(f"{k}: data {got.get(k)}, objective {want.get(k)}"
                      for k in set(got) | set(want) if got.get(k) != want.get(k))
        raise ValueError(f"data.name={phase.config.data.name!r} gives batches that differ from "
                         f"what model.name={phase.config.model_name!r} trains on: {'; '.join(diff)}")
    return batch


def cadence(step: int, t, *, preempted: bool, keeps_best: bool,
            kept: Collection[int] = ()) -> tuple[bool, bool]:
    """(evaluate, save) after `step`: evaluations every train.eval_every steps and at the end;
    saves every train.checkpoint_every steps, at the end, on preemption, at the `kept` steps
    (where a schedule stage ends), and (fine-tuning, which keeps the best checkpoint) with
    every evaluation."""
    evaluate_now = bool(t.eval_every and step % t.eval_every == 0) or step == t.steps
    save = (step % t.checkpoint_every == 0 or step == t.steps or preempted or step in kept
            or (evaluate_now and keeps_best))
    return evaluate_now, save


@dataclasses.dataclass
class Window:
    """Steps, real tokens and model FLOPs since the last metrics line, and its start time."""

    start: float
    steps: int = 0
    tokens: float = 0.0
    flops: float = 0.0

    def restart(self) -> None:
        self.start, self.steps, self.tokens, self.flops = time.perf_counter(), 0, 0.0, 0.0


@dataclasses.dataclass(frozen=True)
class Run:
    """What the pieces of the loop share, fixed for the whole run (built by `_train`)."""

    config: RunSpec
    mesh: Any
    task: Any  # the fine-tuning task, None for pretraining data
    objective: Any
    make_step: Any  # phase config -> the jitted train step, compiled per phase (start_phase)
    evaluator: Any
    ckpt: checkpoint.TrainCheckpointer
    writer: MetricsWriter
    clock: goodput.Clock  # where the wall time goes (goodput)
    config_json: dict  # the run config, stored with each checkpoint
    peak: tuple[float, int]  # (peak FLOP/s per device, how many such peaks the devices have)
    best_metric: str | None  # fine-tuning keeps the best checkpoint by this eval metric


def report_step(run: Run, step: int, metrics_dev: dict, window: Window) -> dict | None:
    """Host side of a finished step: NaN check, then (every train.log_every steps and at the
    end) the metrics line with tokens/s, MFU and the goodput totals. Returns the line if
    written."""
    ready = all(x.is_ready() for x in jax.tree.leaves(metrics_dev))  # does not wait
    m = {k: float(v) for k, v in jax.device_get(metrics_dev).items()}
    run.clock.read(step, ready)
    if not (np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"])):
        good = run.ckpt.latest_step()
        raise TrainingDiverged(
            f"step {step}: loss {m['loss']}, grad norm {m['grad_norm']} (not finite); "
            f"stopped. Last good checkpoint: {f'{run.ckpt.path}/{good}' if good is not None else 'none'}; "
            f"lower optimizer.learning_rate or raise schedule.warmup_steps")
    window.steps += 1
    window.tokens += m.pop("tokens")
    window.flops += m.pop("flops")
    t = run.config.train
    if step % t.log_every and step != t.steps:
        return None
    seconds = max(time.perf_counter() - window.start, 1e-9)
    peak_flops, num_peaks = run.peak
    m.update(steps_per_sec=window.steps / seconds, tokens_per_sec=window.tokens / seconds,
             mfu=mfu(window.flops / window.steps, seconds / window.steps, num_peaks, peak_flops))
    m.update(run.clock.fields())
    with run.clock.host(None):
        run.writer.write(step, m)
        run.clock.persist(force=False)
    window.restart()
    return m


def _report(run: Run, pending: tuple[int, dict], window: Window, summary: dict) -> None:
    """report_step of a pending (step, metrics); a metrics line it writes is the summary's."""
    line = report_step(run, *pending, window)
    if line is not None:
        summary["metrics"] = line


def save_checkpoint(run: Run, step: int, train_state: dict, phase: Phase,
                    metrics: dict | None = None) -> None:
    """Saves the state and the data position (phase, pipeline state) as checkpoint `step`."""
    data_state = {"phase": phase.index, "pipeline": phase.pipeline.get_state()}
    with run.clock.timing("save"):
        run.ckpt.save(step, train_state["params"], train_state["opt_state"], data_state,
                      run.config_json, metrics=metrics)
    run.clock.saved(step)


def save_and_evaluate(run: Run, step: int, train_state: dict, phase: Phase, *, evaluate_now: bool,
                      save: bool) -> dict[str, float] | None:
    """The save and evaluation due after `step` (see cadence). Saved before evaluating, so a
    failing evaluation loses no training; a run that keeps the best checkpoint saves with the
    evaluation's metrics, or without them if the evaluation fails. Returns the evaluation's
    metrics (None when none was due)."""
    with_metrics = save and evaluate_now and run.best_metric is not None
    if save and not with_metrics:
        save_checkpoint(run, step, train_state, phase)
    if not evaluate_now:
        return None
    try:
        with run.clock.timing("eval"):
            results = run.evaluator.run(train_state["params"], config=phase.config)
    except BaseException:
        if with_metrics:
            save_checkpoint(run, step, train_state, phase)
        raise
    run.writer.write(step, results)
    if with_metrics:
        save_checkpoint(run, step, train_state, phase, metrics=results)
    return results


# In a multi-process run, where the process that got Ctrl-C writes that it did (any value), so
# that every process ends the run as interrupted, not only that one.
INTERRUPTED_KEY = "bert_jax/train/interrupted"


def distributed_store():
    """JAX's key-value store of a multi-process run (jax.distributed) whose preemption notifier
    is on (JAX's default), else None."""
    if jax.process_count() < 2:
        return None
    from jax._src import distributed  # its client: no public handle (as commands/peers.py)

    state = distributed.global_state
    return state.client if state.preemption_sync_manager is not None else None


class Preemption:
    """SIGTERM (TPU maintenance / preemption), or in a multi-process run the processes'
    agreement to stop (Orbax's preemption sync point): save at the next step and exit 0.
    SIGINT (Ctrl-C) saves the same way, the run then ending as interrupted (the command exits
    130); a second Ctrl-C stops at once (KeyboardInterrupt), the save not waited for.

    In a multi-process run (`store`: its key-value store) a save is collective, so a signal
    reaching one process must stop all of them after one step: SIGTERM is left to JAX's
    preemption notifier (jax.distributed.initialize installs it), through which the processes
    agree on the step (ckpt.reached_preemption); Ctrl-C writes INTERRUPTED_KEY, then raises
    SIGTERM for that notifier, so that every process saves the agreed step and ends as
    interrupted (exit 130), none of them alone."""

    def __init__(self, ckpt: checkpoint.TrainCheckpointer, store=None):
        self.ckpt = ckpt
        self.store = store
        self.requested = threading.Event()
        self.interrupted = False
        self._old: dict = {}

    def due(self, step: int) -> bool:
        """Whether the run stops after `step` (saving it first)."""
        return self.requested.is_set() or self.ckpt.reached_preemption(step)

    def stopped_by_ctrl_c(self) -> bool:
        """Whether the stop due was asked by Ctrl-C, here or (multi-process) in any process."""
        if self.interrupted or self.store is None:
            return self.interrupted
        try:
            return self.store.key_value_try_get(INTERRUPTED_KEY) is not None
        except Exception:  # noqa: BLE001 (JAX's NOT_FOUND: no process wrote it; a SIGTERM)
            return False

    def _interrupt(self, *_) -> None:
        self.interrupted = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the next Ctrl-C: at once
        if self.store is None:
            self.requested.set()
            return
        try:
            self.store.key_value_set(INTERRUPTED_KEY, str(jax.process_index()))
        except Exception:  # noqa: BLE001 (the store unreachable: the others stop as on SIGTERM)
            pass
        signal.raise_signal(signal.SIGTERM)  # to JAX's notifier: the processes agree on a step

    def __enter__(self):
        if self.store is None and jax.process_count() > 1:
            # JAX's preemption service off (JAX_ENABLE_PREEMPTION_SERVICE=false): no way to
            # agree on a step, and a save made by one process alone waits for the others
            # forever; so the signals keep their defaults and stop the process at once (its
            # peers then stop with a line naming it), the checkpoints saved before kept.
            log.warning("warning: JAX's preemption service is off in this multi-process run, so "
                        "Ctrl-C or SIGTERM stops it without saving the step reached (the last "
                        "checkpoint is kept); unset JAX_ENABLE_PREEMPTION_SERVICE to save on them")
            return self
        if threading.current_thread() is threading.main_thread():
            self._old = {signal.SIGINT: signal.signal(signal.SIGINT, self._interrupt)}
            if self.store is None:  # (else JAX's own SIGTERM handler, which a Python one replaces)
                self._old[signal.SIGTERM] = signal.signal(signal.SIGTERM, lambda *_: self.requested.set())
        return self

    def __exit__(self, *exc):
        for signum, handler in self._old.items():
            signal.signal(signum, handler)


def train_loop(run: Run, phase: Phase, train_state: dict, start: int) -> dict[str, Any]:
    """Steps from `start` to train.steps, each dispatched before the previous step's metrics
    are read (the host never waits inside a step), with the phase switches, reports, saves,
    evaluations and preemption due after each. Returns the summary (step, preempted, the
    last metrics line, the last evaluation)."""
    t = run.config.train
    summary: dict[str, Any] = {"step": start, "preempted": False}
    window = Window(start=time.perf_counter())
    pending, step = None, start
    run.clock.loop_started()
    with Preemption(run.ckpt, distributed_store()) as preemption:
        while step < t.steps:
            if step == phase.end:
                phase = start_phase(run.config, step, {}, make_step=run.make_step, state_now=train_state,
                                    objective=run.objective, mesh=run.mesh, task=run.task,
                                    clock=run.clock, previous=phase)
            with run.clock.host("data"):
                batch = next_batch(phase, run.mesh)
            train_state, metrics = phase.step(train_state, batch)
            run.clock.dispatched()
            step += 1
            if pending is not None:  # the previous step's metrics, read with this one dispatched
                _report(run, pending, window, summary)
            pending = (step, metrics)
            preempted = step < t.steps and preemption.due(step)  # (the last step: finished)
            evaluate_now, save = cadence(step, t, preempted=preempted, kept=run.ckpt.kept,
                                         keeps_best=run.best_metric is not None)
            if not (evaluate_now or save):
                continue
            _report(run, pending, window, summary)
            pending = None
            results = save_and_evaluate(run, step, train_state, phase, evaluate_now=evaluate_now,
                                        save=save)
            if results is not None:
                summary["eval"] = results
            window.restart()  # evaluation and saving stay out of the next tokens/s
            if preempted:
                if preemption.stopped_by_ctrl_c():  # said by the command, which exits 130
                    summary["interrupted"] = f"{run.ckpt.path}/{step}"
                else:
                    log.info(f"SIGTERM: saved checkpoint {run.ckpt.path}/{step}; exiting")
                summary["preempted"] = True
                break
        if pending is not None:
            _report(run, pending, window, summary)
    with run.clock.timing("save"):  # the last saves, still being written
        run.ckpt.wait()
    summary["step"] = step
    return summary


def _prepare_workdir(config: RunSpec, workdir: str) -> None:
    """Creates the workdir and copies the tokenizer into it (local or gs://, either way), so
    the workdir can later be an init_from or a checkpoint for features."""
    if not is_remote(workdir):
        workdir_path(workdir).mkdir(parents=True, exist_ok=True)
    tokenizer = tasks.tokenizer_source(config)
    if jax.process_index() == 0 and tokenizer and workdir_path(tokenizer).is_dir():
        tokenizer_lib.copy_tokenizer(tokenizer, workdir)


def restore_or_init(config: RunSpec, ckpt: checkpoint.TrainCheckpointer, engine: setup.Engine,
                    config_json: dict) -> tuple[int, dict, dict]:
    """(start step, train state, saved data position): the latest good checkpoint's, or a
    fresh state (with the init_from weights) at step 0."""
    target = engine.train_state()
    restored = ckpt.restore_latest(target["params"], target["opt_state"], config_json)
    if restored:
        start, params, opt_state, data_state = restored
        step0 = jax.device_put(jnp.int32(start), engine.state_sh["step"])
        log.info(f"resumed from {ckpt.path}/{start}")
        data_state = {**data_state, "checkpoint": f"{ckpt.path}/{start}", "changes": ckpt.data_changes}
        return start, {"params": params, "opt_state": opt_state, "step": step0}, data_state
    pretrained = state.pretrained(config, target["params"], engine.mesh) if config.init_from else None
    return 0, state.init_state(config, engine.tx, engine.state_sh, pretrained), {}


def log_setup(config: RunSpec, mesh, abstract, state_sh) -> tuple[float, int]:
    """Logs the devices, mesh, peak FLOP/s, model and state size; returns (peak FLOP/s per
    device, how many such peaks the devices have) for MFU."""
    peak, peak_source = peak_flops_per_device()
    # Simulated CPU devices share one measured host peak; real accelerators each have theirs.
    num_peaks = 1 if jax.devices()[0].platform == "cpu" else jax.device_count()
    n_params = sum(x.size for x in jax.tree.leaves(abstract["params"]))
    log.info(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind} "
             f"({jax.process_count()} processes); mesh {dict(mesh.shape)}; peak "
             f"{peak / 1e12:.2f} TFLOP/s per device ({peak_source})\n"
             f"model: {config.model_name}, {n_params:,} parameters; state "
             f"{sharding.bytes_per_device(abstract, state_sh) / 2**20:,.1f} MiB per device")
    return peak, num_peaks


def log_goodput(clock: goodput.Clock) -> dict[str, float]:
    """Logs where this attempt's and the job's wall time went; returns the job's totals."""
    a, t = clock.attempt(), clock.fields()
    spent = ", ".join(f"{c} {a[f'{c}_s']:.1f}s" for c in goodput.CATEGORIES)
    line = (f"goodput: train steps {100 * a['train_s'] / max(a['wall_s'], 1e-9):.1f}% of this "
            f"run's {a['wall_s']:.1f}s ({spent})")
    if t["goodput/restarts"]:
        line += (f"; the job's {t['goodput/restarts'] + 1} runs {100 * t['goodput']:.1f}% of "
                 f"{t['goodput/wall_s']:.1f}s, {t['goodput/redone_steps']:.0f} steps redone")
    log.info(line)
    return {k.removeprefix("goodput/"): v for k, v in t.items()}


def _train(config: RunSpec, workdir: str, task, started: float) -> dict[str, Any]:
    engine = setup.build(config, sharding.make_mesh(config.mesh))
    mesh, objective, graphdef, state_sh = engine.mesh, engine.objective, engine.graphdef, engine.state_sh
    t = config.train
    _prepare_workdir(config, workdir)
    config_json = json.loads(config.saved)
    best_metric = f"eval/{task.main_metric}" if task else None
    with jax.set_mesh(mesh), checkpoint.TrainCheckpointer(
            workdir, keep=t.keep_checkpoints, best_metric=best_metric,
            kept=optim.stage_ends(config)) as ckpt:
        start, train_state, data_state = restore_or_init(config, ckpt, engine, config_json)
        if start >= t.steps:
            log.info(f"already trained: checkpoint step {start} >= train.steps={t.steps}")
            summary = {"step": start, "preempted": False, "steps": t.steps, "best_metric": best_metric}
            _repair_summary(workdir, summary)
            return summary
        clock = goodput.Clock(workdir, start_step=start, started=started,
                              enabled=jax.process_index() == 0)
        if clock.redone_steps:
            log.info(f"steps {start + 1}-{start + clock.redone_steps} are done again: the last "
                     f"run reached step {start + clock.redone_steps}, its checkpoints after "
                     f"{start} did not survive")
        # Called with each phase's config: a phase's batch size sets its microbatch count.
        # A phase may change the model's static graph (its rope base): then its own graphdef.
        def make_step(phase_cfg: RunSpec):
            phase_graph = graphdef if phase_cfg.model == config.model else state.graphdef_of(phase_cfg)
            return jit_train_step(phase_cfg, graphdef=phase_graph, objective=objective, tx=engine.tx,
                                  schedule=engine.schedule, mesh=mesh, state_sh=state_sh)
        try:
            evaluator = evaluate.make_evaluator(config, graphdef, objective, mesh, task)
            evaluator.prepare()  # a missing or bad eval file stops the run now, not after training
            peak = log_setup(config, mesh, engine.abstract, state_sh)
            phase = start_phase(config, start, data_state, make_step=make_step, state_now=train_state,
                                objective=objective, mesh=mesh, task=task, clock=clock)
            with MetricsWriter(workdir, enabled=jax.process_index() == 0, total_steps=t.steps,
                               resume_step=start) as writer:
                run = Run(config, mesh, task, objective, make_step, evaluator, ckpt, writer, clock,
                          config_json, peak, best_metric)
                summary = train_loop(run, phase, train_state, start)
        finally:  # a failed or interrupted attempt's time counts too
            clock.persist()
    summary.update(steps=t.steps, best_metric=best_metric, goodput=log_goodput(clock))
    if jax.process_index() == 0:  # sweeps read it to skip finished runs
        (workdir_path(workdir) / "summary.json").write_text(
            json_dumps(summary, indent=1) + "\n")
    return summary


def _repair_summary(workdir: str, summary: dict[str, Any]) -> None:
    """A finished run's summary.json, when missing, unreadable or not saying that it finished
    at its last checkpoint's step, rewritten from that checkpoint (`summary`: step, steps, best
    metric; a sweep reads it to count the run finished); one that says so is kept as it is,
    its eval, metrics and goodput with it, even where train.steps is now given otherwise."""
    path = workdir_path(workdir) / "summary.json"
    try:
        old = json.loads(path.read_text())
        said = {k: old.get(k) for k in ("step", "preempted")} if isinstance(old, dict) else old
        if said == {k: summary[k] for k in ("step", "preempted")}:
            return
        why = f"did not say this run finished ({json_dumps(said)[:80]})"
    except FileNotFoundError:
        why = "was missing"
    except ValueError as e:  # (not JSON, not UTF-8)
        why = f"was not valid JSON ({str(e)[:80]})"
    if jax.process_index() == 0:
        path.write_text(json_dumps(summary, indent=1) + "\n")
        log.info(f"{path} {why}: rewritten from checkpoint step {summary['step']}")


def train_and_evaluate(config, workdir: str, set_by_user: Collection[str] = (),
                       started: float | None = None) -> dict[str, Any]:
    """Trains `config` in `workdir`, resuming from its latest good checkpoint if any; with
    init_from, model sizes the user did not set (`set_by_user`: dotted keys) come from that
    checkpoint. `started`: when the job's process started (unix time; default now), where its
    wall time (goodput.py) begins. Returns a summary (final step, last metrics, last eval,
    whether preempted, goodput)."""
    started = time.time() if started is None else started
    spec = config_lib.resolve(state.sizes_from_init(config_lib.complete(config), set_by_user))
    config_lib.check_overrides_read(spec, set_by_user)
    setup.check(spec, platform=setup.platform(), devices=jax.device_count(),
                processes=jax.process_count())
    task = tasks.from_config(spec)  # None for pretraining data
    spec = tasks.resolve_steps(spec, task, set_by_user)
    checkpoint.check_writable(workdir)  # storage reachable and writable, before anything is built
    with WorkdirLock(workdir, enabled=jax.process_index() == 0):
        return _train(spec, workdir, task, started)
