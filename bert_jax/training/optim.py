"""Optax optimizers and learning-rate schedules from the run config.

Optimizers: `adam_weight_decay` is Google BERT's AdamWeightDecayOptimizer (optimization.py,
used by its pretraining and fine-tuning scripts): Adam without bias correction, weight decay
added to the update before the learning rate. `adamw` is optax's (and torch's) AdamW, the
same with bias correction. `adam` (Kingma & Ba, bias-corrected) is the Transformer paper's.
`stable_adamw` is ModernBERT's: optimi's StableAdamW with decouple_lr (its
`decoupled_stableadamw`), AdamW whose step shrinks per tensor when the gradient spikes.

A per-tensor statistic (StableAdamW's update RMS, LAMB's trust ratio) is taken per tensor of
the reference, not per leaf of ours: the layers of a stack are one leaf with a leading layer
axis (models/transformer.py vmaps them, scanned or not), so each layer's slice is its own
tensor (`tensor_mean`); StableAdamW's reference (ModernBERT in PyTorch) also holds q, k, v as
one fused Wqkv and the two GLU halves as one Wi, so those are one tensor each there.

A schedule maps optax's update count `c` (0-based: the update being computed is number
c + 1) to that update's learning rate. Two step conventions, each the one its paper uses:
  rsqrt_paper, warmup_rsqrt:            n = c + 1, as Vaswani et al.'s step_num (starts at 1)
  warmup_linear, constant, cosine, wsd: c, as BERT's `global_step` (read before its
                                        increment; Composer's, ModernBERT's, counts the
                                        same), so a warmup's first update has lr 0
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from bert_jax import config as config_lib
from bert_jax import specs

OPTIMIZERS = ("adam_weight_decay", "adam", "adamw", "stable_adamw", "lamb", "sgd")
SCHEDULES = ("rsqrt_paper", "warmup_rsqrt", "warmup_linear", "constant", "cosine", "wsd")
# wsd's decay shapes: progress p in [0, 1] through the decay -> share of (peak - final) kept.
DECAY_SHAPES = {"1-sqrt": lambda p: 1.0 - jnp.sqrt(p), "linear": lambda p: 1.0 - p}
# Schedules that end at train.steps, so a warmup longer than the run is a config mistake.
_DECAYING = ("warmup_linear", "cosine", "wsd")
# Schedules whose warmup is BERT's c / warmup factor, which a warmup in tokens replaces.
_WARMUP_FACTOR = ("constant", "wsd")
# BERT's exclude_from_weight_decay drops LayerNorm and bias; what is left is these leaves.
_DECAYED_LEAVES = ("kernel", "embedding")


def _warmup(c: jax.Array, warmup: int) -> jax.Array:
    """BERT's linear warmup factor c / warmup, 1 from c == warmup on (1 when warmup == 0)."""
    return jnp.minimum(c / warmup, 1.0) if warmup else jnp.ones_like(c)


def make_schedule(schedule_cfg, learning_rate: float, total_steps: int,
                  d_model: int | None = None, *, where: str = "schedule",
                  length: str = "train.steps", warmup_factor: Any = None) -> optax.Schedule:
    """Update count -> learning rate for `schedule_cfg.name` (formulas in each branch);
    `schedule_cfg` the schedule section (or its ScheduleSpec). `where` and `length` name the
    keys and the step count in messages (a stage: schedule.stages[i] and its length);
    `warmup_factor(c)` replaces the warmup's c / warmup_steps (a warmup in tokens)."""
    schedule_cfg = specs.read(specs.ScheduleSpec, schedule_cfg, "schedule")
    name, warmup = schedule_cfg.name, schedule_cfg.warmup_steps
    if warmup_factor is not None and name not in _WARMUP_FACTOR:
        raise ValueError(f"{where}.warmup_tokens with {where}.name={name!r}: a warmup in tokens is "
                         f"for {list(_WARMUP_FACTOR)}")
    ramp = warmup_factor or (lambda c: _warmup(c, warmup))
    lr, total = float(learning_rate), int(total_steps)
    _check_name(name, SCHEDULES, where)
    if lr < 0:
        raise ValueError(f"optimizer.learning_rate={lr} must be >= 0")
    if name in ("rsqrt_paper", "warmup_rsqrt") and warmup < 1:
        raise ValueError(f"{where}.warmup_steps={warmup} must be >= 1 for {where}.name={name!r} "
                         f"(its formula divides by it)")
    if name in _DECAYING:
        if total < 1:
            raise ValueError(f"{length}={total} must be >= 1 (schedule {name!r} decays to it)")
        if warmup > total:
            raise ValueError(f"{where}.warmup_steps={warmup} exceeds {length}={total}: "
                             f"schedule {name!r} would never reach its peak or decay")

    if name == "rsqrt_paper":
        if d_model is None:
            raise ValueError("schedule.name='rsqrt_paper' needs d_model (config.model.emb_dim)")
        scale = lr * d_model**-0.5

        def schedule(count):
            # Vaswani et al. eq. (3): lrate = d_model^-0.5 * min(n^-0.5, n * warmup^-1.5).
            n = jnp.asarray(count, jnp.float32) + 1.0
            return scale * jnp.minimum(n**-0.5, n * warmup**-1.5)

    elif name == "warmup_rsqrt":
        def schedule(count):
            # lr * n / warmup up to n == warmup (exactly lr there), then lr * sqrt(warmup / n).
            n = jnp.asarray(count, jnp.float32) + 1.0
            return lr * jnp.minimum(n / warmup, jnp.sqrt(warmup / n))

    elif name == "warmup_linear":
        def schedule(count):
            # BERT optimization.py: lr * c / warmup while c < warmup, else polynomial_decay
            # (power 1, no cycle) lr * (1 - min(c, total) / total). Not rescaled after the
            # warmup, so the value jumps down to lr * (1 - warmup / total) at c == warmup.
            c = jnp.asarray(count, jnp.float32)
            decay = lr * (1.0 - jnp.minimum(c, total) / total)
            return jnp.where(c < warmup, lr * c / max(warmup, 1), decay)

    elif name == "constant":
        def schedule(count):
            return lr * ramp(jnp.asarray(count, jnp.float32))

    elif name == "wsd":
        return _wsd(schedule_cfg, lr, total, warmup, where, length, ramp)

    else:  # cosine
        final = schedule_cfg.final_fraction

        def schedule(count):
            # BERT-style warmup to lr at c == warmup, then half a cosine down to
            # lr * final_fraction at c == total (and held there after).
            c = jnp.asarray(count, jnp.float32)
            progress = jnp.clip((c - warmup) / max(total - warmup, 1), 0.0, 1.0)
            cosine = final + (1.0 - final) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
            return lr * jnp.where(c < warmup, ramp(c), cosine)

    return schedule


def _wsd(schedule_cfg, lr: float, total: int, warmup: int, where: str, length: str,
         ramp: Any) -> optax.Schedule:
    """Warmup-stable-decay (trapezoidal): BERT-style warmup to lr at c == warmup, lr until the
    last `decay` updates, then down to lr * final_fraction at c == total in the decay shape."""
    shape = schedule_cfg.decay_shape
    if shape not in DECAY_SHAPES:
        raise ValueError(f"{where}.decay_shape={shape!r}; choose one of {list(DECAY_SHAPES)}")
    final = schedule_cfg.final_fraction
    steps, fraction = schedule_cfg.decay_steps, schedule_cfg.decay_fraction
    if steps and fraction:
        raise ValueError(f"{where}.decay_steps={steps} and {where}.decay_fraction={fraction} "
                         f"both set the decay length; set one of them to 0")
    decay = round(fraction * total) if fraction else int(steps)
    if warmup + decay > total:
        key = (f"{where}.decay_fraction={fraction} ({decay} steps)" if fraction
               else f"{where}.decay_steps={steps}")
        raise ValueError(f"{key} after {where}.warmup_steps={warmup} is longer than "
                         f"{length}={total}: decay for at most {total - warmup} step(s)")
    shaped = DECAY_SHAPES[shape]

    def schedule(count):
        c = jnp.asarray(count, jnp.float32)
        # p = 0 at c == total - decay (still the peak), 1 at c == total (the final lr).
        progress = jnp.clip((c - (total - decay)) / max(decay, 1), 0.0, 1.0)
        stable_or_decay = final + (1.0 - final) * shaped(progress)
        return lr * jnp.where(ramp(c) < 1.0, ramp(c), stable_or_decay)  # (1: warmed up)

    return schedule


def _check_name(name: str, names: tuple[str, ...], where: str) -> None:
    if name not in names:
        raise specs.ConfigError(f"{where}.name={name!r}; choose one of {list(names)}")


def check(spec: specs.RunSpec) -> None:
    """The optimizer and schedule choices that need no step count (setup.check runs them before
    a fine-tuning run's train.steps is known; make_optimizer checks the rest): the optimizer's
    name, schedule.stages as a whole (stages) and each stage's schedule name."""
    opt = specs.read(specs.OptimizerSpec, spec.optimizer, "optimizer")
    sched = specs.read(specs.ScheduleSpec, spec.schedule, "schedule")
    _check_name(opt.name, OPTIMIZERS, "optimizer")
    for i, stage in enumerate(stages(opt, sched)):
        _check_name(stage.name, SCHEDULES, f"schedule.stages[{i}]" if sched.stages else "schedule")


def stages(opt, sched) -> tuple[specs.StageSpec, ...]:
    """The run's schedule as stages: schedule.stages (each checked), or one stage from step 0
    with the schedule section's keys and the optimizer's learning rate and weight decay."""
    if not sched.stages:
        keys = {f.name: getattr(sched, f.name) for f in dataclasses.fields(specs.StageSpec)
                if hasattr(sched, f.name)}
        return (specs.StageSpec(**{**keys, "start_step": 0, "learning_rate": opt.learning_rate,
                                   "weight_decay": opt.weight_decay}),)
    unused = [f for f in dataclasses.fields(sched)
              if f.name != "stages" and getattr(sched, f.name) != f.default]
    if unused:  # (a config file's own schedule keys too: the flags that reset them are named)
        shown = ", ".join(f"schedule.{f.name}={getattr(sched, f.name)!r}" for f in unused)
        reset = " ".join(f"--config.schedule.{f.name}={f.default}" for f in unused)
        raise specs.ConfigError(f"{shown} with schedule.stages: each stage has its own schedule "
                                f"keys, and these would not be used; set them in the stages "
                                f"(schedule.stages[i].<key>) and reset these to their defaults: "
                                f"{reset}")
    out = []
    for i, given in enumerate(sched.stages):
        if not isinstance(given, Mapping):
            raise specs.ConfigError(f"schedule.stages[{i}]={given!r}: each stage is a dict of "
                                    f"{[f.name for f in dataclasses.fields(specs.StageSpec)]}")
        stage = specs.read(specs.StageSpec, given, f"schedule.stages[{i}]")
        before = out[-1].start_step if out else None
        if before is None and stage.start_step != 0:
            raise specs.ConfigError(f"schedule.stages[0].start_step={stage.start_step}: the first "
                                    f"stage starts at step 0")
        if before is not None and stage.start_step <= before:
            raise specs.ConfigError(f"schedule.stages[{i}].start_step={stage.start_step} is not "
                                    f"after schedule.stages[{i - 1}]'s ({before}): stages run in "
                                    f"order of their start steps")
        out.append(dataclasses.replace(
            stage, learning_rate=opt.learning_rate if stage.learning_rate is None
            else stage.learning_rate,
            weight_decay=opt.weight_decay if stage.weight_decay is None else stage.weight_decay))
    return tuple(out)


def staged(runs: tuple[specs.StageSpec, ...], total_steps: int, d_model: int | None = None,
           value: Any = None, tokens: Any = None, given: bool = True) -> optax.Schedule:
    """Update count -> the learning rate of the stage the count is in, from that stage's own
    schedule at the count since its start (`value(stage)`: a constant per stage instead,
    e.g. its weight decay per peak learning rate). A stage lasts to the next one's start
    (the last: to `total_steps`); stages the run does not reach are never called.
    `tokens(c, since)`: the tokens of updates since .. c-1, for warmups in tokens; `given`:
    whether the stages are schedule.stages (else the schedule section's keys, as messages say)."""
    starts = [stage.start_step for stage in runs]
    fns = []
    for i, stage in enumerate(runs):
        end = starts[i + 1] if i + 1 < len(runs) else int(total_steps)
        if value is not None:
            constant = float(value(stage))
            fns.append(lambda c, v=constant: jnp.full(jnp.shape(c), v, jnp.float32))
            continue
        if stage.start_step >= total_steps and i:
            fns.append(None)  # past train.steps: never reached
            continue
        where = f"schedule.stages[{i}]" if given else "schedule"
        length = (f"the length of {where} (steps {stage.start_step}-{end})"
                  if given and len(runs) > 1 else "train.steps")
        if i + 1 < len(runs) and stage.warmup_steps > end - stage.start_step:
            # (the last stage's warmup is the run's: checked against train.steps by its schedule)
            raise specs.ConfigError(
                f"{where}.warmup_steps={stage.warmup_steps} exceeds {length}, "
                f"{end - stage.start_step} steps: its learning rate would never reach its peak; "
                f"shorten the warmup, or start schedule.stages[{i + 1}] later")
        keys = {f.name: getattr(stage, f.name) for f in dataclasses.fields(specs.ScheduleSpec)
                if hasattr(stage, f.name)}
        ramp = None
        if stage.warmup_tokens:
            if stage.warmup_steps:
                raise specs.ConfigError(f"{where}.warmup_steps={stage.warmup_steps} and "
                                        f"{where}.warmup_tokens={stage.warmup_tokens} both set "
                                        f"the warmup; set one of them to 0")

            def ramp(c, start=stage.start_step, over=float(stage.warmup_tokens)):
                # The tokens since the stage began, before this update (Composer's timestamp).
                return jnp.minimum(tokens(c + start, start) / over, 1.0)
        fns.append(make_schedule(specs.ScheduleSpec(**keys), stage.learning_rate,
                                 end - stage.start_step, d_model, where=where, length=length,
                                 warmup_factor=ramp))
    if len(runs) == 1:
        return fns[0]

    def schedule(count):
        out = fns[0](count)
        for start, fn in zip(starts[1:], fns[1:]):
            if fn is not None:  # the stage's own count, 0 at its first update
                out = jnp.where(count >= start, fn(jnp.maximum(count - start, 0)), out)
        return out

    return schedule


def stage_ends(spec: specs.RunSpec) -> tuple[int, ...]:
    """The steps where a stage of schedule.stages ends within the run (the next one's start):
    their checkpoints are kept, to resume or decay from."""
    opt = specs.read(specs.OptimizerSpec, spec.optimizer, "optimizer")
    sched = specs.read(specs.ScheduleSpec, spec.schedule, "schedule")
    return tuple(s.start_step for s in stages(opt, sched)[1:] if s.start_step <= spec.train.steps)


def step_tokens(spec: specs.RunSpec) -> Any:
    """(count, since) -> the tokens (rows x length, padding included) of updates since ..
    count-1, from the batch and length of each phase of data.phases (config.phase_config)."""
    spec = config_lib.resolve(spec)
    runs = spec.phases or (None,)
    parts = []  # (first step, last step + 1, tokens per step)
    for i, phase in enumerate(runs):
        start = phase.start_step if phase else 0
        end = runs[i + 1].start_step if i + 1 < len(runs) else None
        cfg = config_lib.phase_config(spec, start)[1]
        length = cfg.data.max_seq_length
        if not length:
            raise specs.ConfigError("schedule.stages[...].warmup_tokens needs data.max_seq_length "
                                    "(tokens per step); use warmup_steps")
        parts.append((start, end, cfg.train.batch_size * length))

    def tokens(count, since=0):
        # Step counts stay exact in float32 (below 2^24); each phase's share is one product.
        c, total = jnp.asarray(count, jnp.float32), 0.0
        for start, end, per_step in parts:
            last = jnp.inf if end is None else end
            steps = jnp.clip(c, start, last) - jnp.clip(since, start, last)
            total = total + float(per_step) * steps
        return total

    return tokens


def _last_key(path: tuple) -> Any:
    """The name of a leaf's last path entry (dict key or attribute), or None."""
    if not path:
        return None
    last = path[-1]
    return getattr(last, "key", getattr(last, "name", None))


def decay_mask(params: Any) -> Any:
    """True for leaves named 'kernel' or 'embedding' (weight-decayed), False for the rest."""
    return jax.tree_util.tree_map_with_path(lambda p, _: _last_key(p) in _DECAYED_LEAVES, params)


class ScaleByAdamNoBiasCorrectionState(NamedTuple):
    """Adam's moments without a step count: nothing here depends on the step."""
    mu: Any
    nu: Any


def scale_by_adam_no_bias_correction(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
    """m / (sqrt(v) + eps) with m, v the plain moving averages, as BERT's optimization.py:
    no division by 1 - b^t, so early updates are larger than Adam's (up to 6.6x, b1 0.9, b2 0.999)."""

    def init(params):
        return ScaleByAdamNoBiasCorrectionState(mu=optax.tree.zeros_like(params),
                                                nu=optax.tree.zeros_like(params))

    def update(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        out = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
        return out, ScaleByAdamNoBiasCorrectionState(mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


LAYER_STACK = "layers"  # the name of a stack's vmapped layers in a parameter path
# Leaves the StableAdamW reference fuses into one tensor: (module names) -> the fused name.
FUSED = {("query", "key", "value"): "Wqkv", ("wi", "wi_gate"): "Wi"}
_FUSED_NAME = {name: fused for names, fused in FUSED.items() for name in names}


def _names(path: tuple) -> tuple:
    return tuple(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path)


def _tensor(path: tuple, fuse: bool) -> tuple[tuple, bool]:
    """(the reference tensor a leaf belongs to, whether the leaf stacks layers on axis 0)."""
    names = _names(path)
    if fuse and len(names) >= 2 and names[-2] in _FUSED_NAME:
        names = (*names[:-2], _FUSED_NAME[names[-2]], names[-1])
    return names, LAYER_STACK in names


def tensor_mean(tree: Any, *, fuse: bool = False) -> Any:
    """The mean of each leaf's values over its reference tensor, shaped to broadcast against
    the leaf: per layer for stacked leaves, over the fused leaves together with `fuse`."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    sums: dict[tuple, Any] = {}
    counts: dict[tuple, int] = {}
    for path, x in flat:
        key, stacked = _tensor(path, fuse)
        axes = tuple(range(1 if stacked else 0, x.ndim))
        sums[key] = sums.get(key, 0.0) + jnp.sum(x, axis=axes)
        counts[key] = counts.get(key, 0) + math.prod(x.shape[a] for a in axes)
    out = []
    for path, x in flat:
        key, stacked = _tensor(path, fuse)
        mean = sums[key] / counts[key]
        out.append(mean.reshape(mean.shape + (1,) * (x.ndim - mean.ndim)) if stacked else mean)
    return treedef.unflatten(out)


def scale_by_trust_ratio_per_tensor() -> optax.GradientTransformation:
    """optax.scale_by_trust_ratio (LAMB's ||param|| / ||update||, 1 where either is 0) with the
    norms per tensor: per layer of a stacked leaf, as the reference's one variable a layer."""

    def update(updates, state, params=None):
        # ||p|| / ||u|| over the same elements = sqrt(mean(p^2) / mean(u^2))
        p2 = tensor_mean(jax.tree.map(jnp.square, params))
        u2 = tensor_mean(jax.tree.map(jnp.square, updates))

        def scale(u, p_sq, u_sq):
            ratio = jnp.sqrt(p_sq / jnp.where(u_sq == 0, 1.0, u_sq))
            return u * jnp.where((p_sq == 0) | (u_sq == 0), 1.0, ratio).astype(u.dtype)

        return jax.tree.map(scale, updates, p2, u2), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def stable_adamw(schedule: optax.Schedule, decay_per_lr: optax.Schedule, b1: float, b2: float,
                 eps: float) -> optax.GradientTransformation:
    """optimi's StableAdamW with decouple_lr (ModernBERT's `decoupled_stableadamw`): per tensor,
    lr_t = schedule / max(1, sqrt(mean(g^2 / max(v_hat, eps^2)))), then
    param *= 1 - lr_t * decay_per_lr (weight decay / the peak lr; kernels and embeddings) and
    param -= lr_t * m_hat / (sqrt(v_hat) + eps), with m_hat, v_hat Adam's bias-corrected moments.
    `decay_per_lr` is a schedule too: a stage restarts the optimizer with its own peak lr and
    weight decay (optimi's max_lr is the lr a restart sets)."""
    # Both terms are scaled by the same clipped lr_t, so the clipping divides their sum. The
    # state is that of chain(scale_by_adam, add_decayed_weights): checkpoints restore either way.
    adamw = optax.chain(optax.scale_by_adam(b1, b2, eps), optax.identity())

    def update(grads, state, params=None):
        out, state = adamw.update(grads, state, params)
        adam = state[0]  # v_hat includes this step's gradient, as in optimi
        decay = decay_per_lr(adam.count - 1)  # this update's (count: updates so far)
        out = jax.tree.map(lambda u, p, decayed: u + decay * p if decayed else u,
                           out, params, decay_mask(params))
        nu_hat = optax.tree.bias_correction(adam.nu, b2, adam.count)

        # AdaFactor's update clipping: the RMS of g / sqrt(v_hat) (per reference tensor) is ~1
        # for steady gradients and grows when g spikes above its running average.
        ratio = jax.tree.map(lambda g, v: jnp.square(g) / jnp.maximum(v, eps**2), grads, nu_hat)
        rms = jax.tree.map(jnp.sqrt, tensor_mean(ratio, fuse=True))
        return jax.tree.map(lambda u, r: u / jnp.maximum(1.0, r), out, rms), state

    return optax.chain(optax.GradientTransformation(adamw.init, update),
                       optax.scale_by_learning_rate(schedule))


def _base_optimizer(opt, schedule: optax.Schedule, runs: tuple[specs.StageSpec, ...],
                    total_steps: int) -> optax.GradientTransformation:
    """The optimizer proper for `opt.name`, before gradient clipping; `runs` the schedule's
    stages (their weight decays: one value but with stable_adamw, which scales it per stage)."""
    name, wd = opt.name, opt.weight_decay  # (each value in its range: specs.OptimizerSpec)
    if name != "stable_adamw":
        for i, stage in enumerate(runs):
            if stage.weight_decay != wd:
                raise ValueError(f"schedule.stages[{i}].weight_decay={stage.weight_decay} differs "
                                 f"from optimizer.weight_decay={wd}: a weight decay per stage is "
                                 f"stable_adamw's (decoupled, per peak lr); drop the stage's")
    _check_name(name, OPTIMIZERS, "optimizer")
    if name in ("adam", "sgd") and wd:
        raise ValueError(f"optimizer.weight_decay={wd} with optimizer.name={name!r}, which has "
                         f"no weight decay: set it to 0, or use optimizer.name='adam_weight_decay' "
                         f"or 'adamw'")
    b1, b2, eps = opt.b1, opt.b2, opt.eps
    if name == "adam":
        return optax.adam(schedule, b1=b1, b2=b2, eps=eps)
    if name == "adam_weight_decay":
        # BERT: update = m / (sqrt(v) + eps) + wd * param (masked), then param -= lr * update.
        return optax.chain(scale_by_adam_no_bias_correction(b1, b2, eps),
                           optax.add_decayed_weights(wd, mask=decay_mask),
                           optax.scale_by_learning_rate(schedule))
    if name == "adamw":
        # optax scales the decay by the learning rate, as adam_weight_decay does.
        return optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=decay_mask)
    if name == "stable_adamw":
        if not eps > 0:
            raise ValueError(f"optimizer.eps={eps} must be > 0 with optimizer.name='stable_adamw' "
                             f"(eps^2 floors the second moment its clipping divides by; "
                             f"ModernBERT: 1e-6)")
        decay_per_lr = staged(runs, total_steps, value=lambda stage: (
            stage.weight_decay / stage.learning_rate if stage.learning_rate else 0.0))
        return stable_adamw(schedule, decay_per_lr, b1, b2, eps)
    if name == "lamb":  # optax.lamb, its trust ratio per layer of a stack
        return optax.chain(optax.scale_by_adam(b1, b2, eps),
                           optax.add_decayed_weights(wd, mask=decay_mask),
                           scale_by_trust_ratio_per_tensor(), optax.scale_by_learning_rate(schedule))
    return optax.sgd(schedule, momentum=b1 or None)


def make_optimizer(spec: specs.RunSpec) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(optax transformation, schedule) from the run's optimizer, schedule and train.steps
    (a section not yet read as its record, as a test may give it, is read here)."""
    opt = specs.read(specs.OptimizerSpec, spec.optimizer, "optimizer")
    sched = specs.read(specs.ScheduleSpec, spec.schedule, "schedule")
    runs = stages(opt, sched)
    d_model = spec.model.emb_dim if any(s.name == "rsqrt_paper" for s in runs) else None
    tokens = step_tokens(spec) if any(s.warmup_tokens for s in runs) else None
    schedule = staged(runs, spec.train.steps, d_model, tokens=tokens, given=bool(sched.stages))
    clip = opt.grad_clip_norm
    # identity() keeps the state's tree structure independent of clipping, so a checkpoint
    # restores whether or not grad_clip_norm changed between runs.
    first: optax.GradientTransformation = (optax.clip_by_global_norm(float(clip)) if clip
                                           else optax.identity())
    return optax.chain(first, _base_optimizer(opt, schedule, runs, spec.train.steps)), schedule

