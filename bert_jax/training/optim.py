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

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from bert_jax import specs

OPTIMIZERS = ("adam_weight_decay", "adam", "adamw", "stable_adamw", "lamb", "sgd")
SCHEDULES = ("rsqrt_paper", "warmup_rsqrt", "warmup_linear", "constant", "cosine", "wsd")
# wsd's decay shapes: progress p in [0, 1] through the decay -> share of (peak - final) kept.
DECAY_SHAPES = {"1-sqrt": lambda p: 1.0 - jnp.sqrt(p), "linear": lambda p: 1.0 - p}
# Schedules that end at train.steps, so a warmup longer than the run is a config mistake.
_DECAYING = ("warmup_linear", "cosine", "wsd")
# BERT's exclude_from_weight_decay drops LayerNorm and bias; what is left is these leaves.
_DECAYED_LEAVES = ("kernel", "embedding")


def _warmup(c: jax.Array, warmup: int) -> jax.Array:
    """BERT's linear warmup factor c / warmup, 1 from c == warmup on (1 when warmup == 0)."""
    return jnp.minimum(c / warmup, 1.0) if warmup else jnp.ones_like(c)


def make_schedule(schedule_cfg, learning_rate: float, total_steps: int,
                  d_model: int | None = None) -> optax.Schedule:
    """Update count -> learning rate for `schedule_cfg.name` (formulas in each branch);
    `schedule_cfg` the schedule section (or its ScheduleSpec)."""
    schedule_cfg = specs.read(specs.ScheduleSpec, schedule_cfg, "schedule")
    name, warmup = schedule_cfg.name, schedule_cfg.warmup_steps
    lr, total = float(learning_rate), int(total_steps)
    if name not in SCHEDULES:
        raise ValueError(f"schedule.name={name!r}; choose one of {list(SCHEDULES)}")
    if lr < 0:
        raise ValueError(f"optimizer.learning_rate={lr} must be >= 0")
    if name in ("rsqrt_paper", "warmup_rsqrt") and warmup < 1:
        raise ValueError(f"schedule.warmup_steps={warmup} must be >= 1 for schedule.name={name!r} "
                         f"(its formula divides by it)")
    if name in _DECAYING:
        if total < 1:
            raise ValueError(f"train.steps={total} must be >= 1 (schedule {name!r} decays to it)")
        if warmup > total:
            raise ValueError(f"schedule.warmup_steps={warmup} exceeds train.steps={total}: "
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
            return lr * _warmup(jnp.asarray(count, jnp.float32), warmup)

    elif name == "wsd":
        return _wsd(schedule_cfg, lr, total, warmup)

    else:  # cosine
        final = schedule_cfg.final_fraction

        def schedule(count):
            # BERT-style warmup to lr at c == warmup, then half a cosine down to
            # lr * final_fraction at c == total (and held there after).
            c = jnp.asarray(count, jnp.float32)
            progress = jnp.clip((c - warmup) / max(total - warmup, 1), 0.0, 1.0)
            cosine = final + (1.0 - final) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
            return lr * jnp.where(c < warmup, _warmup(c, warmup), cosine)

    return schedule


def _wsd(schedule_cfg, lr: float, total: int, warmup: int) -> optax.Schedule:
    """Warmup-stable-decay (trapezoidal): BERT-style warmup to lr at c == warmup, lr until the
    last `decay` updates, then down to lr * final_fraction at c == total in the decay shape."""
    shape = schedule_cfg.decay_shape
    if shape not in DECAY_SHAPES:
        raise ValueError(f"schedule.decay_shape={shape!r}; choose one of {list(DECAY_SHAPES)}")
    final = schedule_cfg.final_fraction
    steps, fraction = schedule_cfg.decay_steps, schedule_cfg.decay_fraction
    if steps and fraction:
        raise ValueError(f"schedule.decay_steps={steps} and schedule.decay_fraction={fraction} "
                         f"both set the decay length; set one of them to 0")
    decay = round(fraction * total) if fraction else int(steps)
    if warmup + decay > total:
        key = (f"schedule.decay_fraction={fraction} ({decay} steps)" if fraction
               else f"schedule.decay_steps={steps}")
        raise ValueError(f"{key} after schedule.warmup_steps={warmup} is longer than "
                         f"train.steps={total}: decay for at most {total - warmup} step(s)")
    shaped = DECAY_SHAPES[shape]

    def schedule(count):
        c = jnp.asarray(count, jnp.float32)
        # p = 0 at c == total - decay (still the peak), 1 at c == total (the final lr).
        progress = jnp.clip((c - (total - decay)) / max(decay, 1), 0.0, 1.0)
        stable_or_decay = final + (1.0 - final) * shaped(progress)
        return lr * jnp.where(c < warmup, _warmup(c, warmup), stable_or_decay)

    return schedule


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


def stable_adamw(schedule: optax.Schedule, peak_lr: float, b1: float, b2: float, eps: float,
                 weight_decay: float) -> optax.GradientTransformation:
    """optimi's StableAdamW with decouple_lr (ModernBERT's `decoupled_stableadamw`): per tensor,
    lr_t = schedule / max(1, sqrt(mean(g^2 / max(v_hat, eps^2)))), then
    param *= 1 - lr_t / peak_lr * weight_decay (kernels and embeddings) and
    param -= lr_t * m_hat / (sqrt(v_hat) + eps), with m_hat, v_hat Adam's bias-corrected moments."""
    # Both terms are scaled by the same clipped lr_t, so the clipping divides their sum.
    adamw = optax.chain(optax.scale_by_adam(b1, b2, eps),
                        optax.add_decayed_weights(weight_decay / peak_lr if peak_lr else 0.0,
                                                  mask=decay_mask))

    def update(grads, state, params=None):
        out, state = adamw.update(grads, state, params)
        adam = state[0]  # v_hat includes this step's gradient, as in optimi
        nu_hat = optax.tree.bias_correction(adam.nu, b2, adam.count)

        # AdaFactor's update clipping: the RMS of g / sqrt(v_hat) (per reference tensor) is ~1
        # for steady gradients and grows when g spikes above its running average.
        ratio = jax.tree.map(lambda g, v: jnp.square(g) / jnp.maximum(v, eps**2), grads, nu_hat)
        rms = jax.tree.map(jnp.sqrt, tensor_mean(ratio, fuse=True))
        return jax.tree.map(lambda u, r: u / jnp.maximum(1.0, r), out, rms), state

    return optax.chain(optax.GradientTransformation(adamw.init, update),
                       optax.scale_by_learning_rate(schedule))


def _base_optimizer(opt, schedule: optax.Schedule) -> optax.GradientTransformation:
    """The optimizer proper for `opt.name`, before gradient clipping."""
    name, wd = opt.name, opt.weight_decay  # (each value in its range: specs.OptimizerSpec)
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer.name={name!r}; choose one of {list(OPTIMIZERS)}")
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
        return stable_adamw(schedule, opt.learning_rate, b1, b2, eps, wd)
    if name == "lamb":  # optax.lamb, its trust ratio per layer of a stack
        return optax.chain(optax.scale_by_adam(b1, b2, eps),
                           optax.add_decayed_weights(wd, mask=decay_mask),
                           scale_by_trust_ratio_per_tensor(), optax.scale_by_learning_rate(schedule))
    return optax.sgd(schedule, momentum=b1 or None)


def make_optimizer(config) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(optax transformation, schedule) from config.optimizer, .schedule, .train.steps."""
    opt = specs.read(specs.OptimizerSpec, config.optimizer, "optimizer")
    sched = specs.read(specs.ScheduleSpec, config.schedule, "schedule")
    d_model = config.model.get("emb_dim") if sched.name == "rsqrt_paper" else None
    schedule = make_schedule(sched, opt.learning_rate, config.train.steps, d_model)
    clip = opt.grad_clip_norm
    # identity() keeps the state's tree structure independent of clipping, so a checkpoint
    # restores whether or not grad_clip_norm changed between runs.
    first: optax.GradientTransformation = (optax.clip_by_global_norm(float(clip)) if clip
                                           else optax.identity())
    return optax.chain(first, _base_optimizer(opt, schedule)), schedule

