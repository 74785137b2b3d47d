"""Schedules in stages (schedule.stages) and phases with their own microbatch (data.phases),
and configs/modernbert.py's base and large against ModernBERT's published stages.

The reference is AnswerDotAI/ModernBERT, branch pretraining_documentation: the values of
yamls/modernbert/modernbert-{base,large}-{pretrain,context-extension,learning-rate-decay}.yaml
are written below, and the schedulers they name (src/scheduler.py's WarmupStableDecayScheduler
and OneMinusSqrtScheduler, Composer's ConstantWithWarmupScheduler, src/sequence_packer.py's
BatchSizeWarmupScheduler) are transcribed from that code, in tokens as they count time. Each
published stage is its own run that starts from the previous one's last checkpoint with the
scheduler, the optimizer's hyperparameters and the step count reset (reset_time,
restart_override)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import config as config_lib
from bert_jax import specs
from bert_jax.training import optim

# The yamls: (max_seq_len, max_duration tokens, global_train_batch_size, lr, weight_decay,
# scheduler), and the pretrain stage's batch-size warmup (device_train_microbatch_size as
# batch_size_warmup_min_size, batch_size_warmup_tokens), on 8 GPUs (the world size).
PUBLISHED = {
    "base": dict(
        stages=[(1024, 1_719e9, 4608, 8e-4, 1e-5, ("wsd", 3e9)),
                (8192, 250e9, 576, 3e-4, 1e-5, ("constant",)),
                (8192, 50e9, 576, 3e-4, 1e-5, ("one_minus_sqrt", 0.001))],
        micro=96, warmup_tokens=50e9, rope=(10_000.0, 160_000.0, 160_000.0)),
    "large": dict(
        stages=[(1024, 1_719e9, 4928, 5e-4, 1e-5, ("wsd", 2e9)),
                (8192, 250e9, 616, 5e-5, 1e-6, ("constant",)),
                (8192, 50e9, 624, 5e-5, 1e-6, ("one_minus_sqrt", 0.001))],
        micro=56, warmup_tokens=10e9, rope=(10_000.0, 160_000.0, 160_000.0)),
}
WORLD = 8


class BatchSizeWarmupScheduler:
    """src/sequence_packer.py, per device, in microbatches (from_composer divides the sizes by
    the microbatch); called with the device's tokens so far."""

    def __init__(self, min_batch_size, max_batch_size, warmup_tokens, world_size):
        self.min_batch_size, self.max_batch_size = min_batch_size, max_batch_size
        self.warmup_tokens = math.ceil(warmup_tokens / world_size)
        total = sum(range(min_batch_size, max_batch_size))
        per_unit, cumsum, self.thresholds = self.warmup_tokens / total, 0, []
        for batch_size in range(min_batch_size, max_batch_size):
            cumsum += batch_size
            self.thresholds.append(math.ceil(per_unit * cumsum))

    def __call__(self, tokens):
        if tokens >= self.warmup_tokens:
            return self.max_batch_size
        for i, threshold in enumerate(self.thresholds):
            if tokens < threshold:
                return self.min_batch_size + i
        return self.max_batch_size


def lr_multiplier(scheduler, t, t_max):
    """The stage's scheduler at `t` tokens of a stage of `t_max` tokens."""
    if scheduler[0] == "wsd":  # t_warmup, t_decay 0, alpha_f 0: warmup from 1e-10, then 1
        t_warmup = scheduler[1]
        return 1e-10 + (1.0 - 1e-10) * t / t_warmup if t < t_warmup else 1.0
    if scheduler[0] == "constant":  # constant_with_warmup, t_warmup 0
        return 1.0
    alpha_f = scheduler[1]  # one_minus_sqrt, t_decay = t_max
    return max(alpha_f, alpha_f + (1 - alpha_f) * (1 - math.sqrt(t / t_max)))


def published_run(size):
    """Per step of the three runs back to back: (rows, length, rope base, lr at the step's
    first token, lr one step's tokens earlier and later, weight decay, peak lr)."""
    p, out = PUBLISHED[size], []
    for index, (length, duration, rows, lr, wd, scheduler) in enumerate(p["stages"]):
        warm = (BatchSizeWarmupScheduler(1, rows // (p["micro"] * WORLD), p["warmup_tokens"], WORLD)
                if index == 0 else None)
        tokens, device_tokens = 0, 0
        while tokens < duration:  # Composer stops at max_duration
            step_rows = rows if warm is None else warm(device_tokens) * p["micro"] * WORLD
            step_tokens = step_rows * length
            lrs = [lr * lr_multiplier(scheduler, max(t, 0), duration)
                   for t in (tokens, tokens - step_tokens, tokens + step_tokens)]
            out.append((step_rows, length, p["rope"][index], *lrs, wd, lr))
            tokens += step_tokens
            device_tokens += step_tokens // WORLD
    return out


@pytest.fixture(scope="module", params=["base", "large"])
def published(request):
    size = request.param
    return size, config_lib.load(f"configs/modernbert.py:{size}"), published_run(size)


def test_modernbert_runs_the_published_stages(published):
    """Batch, length, rope base and learning rate at 20 steps (and at every stage and phase
    boundary) equal the published runs': rows and lengths exactly, the lr within its published
    values one step's tokens before and after (steps count full rows; the published runs
    count tokens and stop at the first step past each budget)."""
    size, config, want = published
    assert config.train.steps == len(want)
    _, schedule = optim.make_optimizer(config)
    starts = [p.start_step for p in config_lib.phases(config.data)]
    starts += [s["start_step"] for s in config.schedule.stages]
    points = sorted({*np.linspace(0, len(want) - 1, 20).astype(int).tolist(),
                     *[s + d for s in starts for d in (-1, 0, 1) if 0 <= s + d < len(want)]})
    for step in points:
        rows, length, rope, lr, before, after, _, _ = want[step]
        _, cfg, _ = config_lib.phase_config(config, step)
        assert (cfg.train.batch_size, cfg.data.max_seq_length, cfg.model.rope_theta) == (
            rows, length, rope), (size, step)
        got = float(schedule(step))
        low, high = sorted((before, after))
        # (1e-9 of the peak: the published warmup starts from 1e-10 of it, ours from 0)
        slack = 1e-6 * high + 1e-9 * want[step][-1]
        assert low - slack <= got <= high + slack, (size, step, got, lr)


def test_modernbert_stages_decay_weights_as_the_published_optimizer(published):
    """decoupled_stableadamw (optimi, decouple_lr): p *= 1 - wd * lr_t / max_lr, max_lr the lr
    each stage's restart_override sets. A zero gradient leaves only that term."""
    size, config, want = published
    tx, schedule = optim.make_optimizer(config)
    params = {"kernel": jnp.ones((2,))}
    state = tx.init(params)
    for step in (10, config.schedule.stages[1]["start_step"] + 100, len(want) - 1):
        *_, wd, peak = want[step]
        at = optax.tree_utils.tree_set(state, count=jnp.asarray(step, jnp.int32))
        updates, _ = tx.update({"kernel": jnp.zeros((2,))}, at, params)
        got = float(1.0 + updates["kernel"][0])
        assert got == pytest.approx(1.0 - wd * float(schedule(step)) / peak, rel=1e-6), (size, step)


def test_stage_ends_are_kept_and_the_plain_schedules_are_one_stage():
    """Each stage's last step is a checkpoint kept beside the newest; BERT's and the
    Transformer's schedules written as one stage are the same schedule."""
    config = config_lib.load("configs/modernbert.py:base")
    assert optim.stage_ends(config) == tuple(s["start_step"] for s in config.schedule.stages[1:])
    for spec in ("configs/bert_pretrain.py:base", "configs/wmt.py"):
        plain = config_lib.load(spec)
        staged = plain.copy_and_resolve_references()
        s = plain.schedule
        staged.schedule = config_lib.section(specs.ScheduleSpec)
        staged.schedule.stages = (dict(
            start_step=0, name=s.name, warmup_steps=s.warmup_steps, final_fraction=s.final_fraction,
            decay_steps=s.decay_steps, decay_fraction=s.decay_fraction, decay_shape=s.decay_shape),)
        want, got = optim.make_optimizer(plain)[1], optim.make_optimizer(staged)[1]
        steps = jnp.arange(0, plain.train.steps, max(1, plain.train.steps // 97))
        np.testing.assert_array_equal(jax.vmap(got)(steps), jax.vmap(want)(steps), err_msg=spec)
        assert optim.stage_ends(staged) == ()


def test_a_later_stage_restarts_its_schedule():
    """Each stage's schedule counts from its own start: a warmup, a 1-sqrt decay over the
    stage, and a warmup in tokens that follows the phases' batch sizes."""
    config = config_lib.load("configs/bert_pretrain.py:tiny")
    config.train.steps, config.train.batch_size = 30, 8
    config.data.max_seq_length = 16
    config.data.phases = ((0, 16, 3), dict(start_step=5, seq_len=16, predictions=3, batch_size=16))
    config.schedule = config_lib.section(specs.ScheduleSpec)
    config.schedule.stages = (
        dict(start_step=0, name="constant", learning_rate=1.0, warmup_tokens=8 * 16 * 5 + 16 * 16 * 5),
        dict(start_step=10, name="constant", learning_rate=0.5, warmup_steps=4),
        dict(start_step=20, name="wsd", learning_rate=0.25, decay_fraction=1.0, final_fraction=0.1))
    _, schedule = optim.make_optimizer(config)
    got = [float(schedule(c)) for c in range(30)]
    # Stage 0: tokens 0, 128, ... up to step 5 (8 rows of 16), then 256 a step; 1920 in all.
    tokens = [128 * min(c, 5) + 256 * max(c - 5, 0) for c in range(10)]
    want = [t / 1920 for t in tokens]
    want += [0.5 * min(c / 4, 1.0) for c in range(10)]
    want += [0.25 * (0.1 + 0.9 * (1 - math.sqrt(c / 10))) for c in range(10)]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("stages, match", [
    (({"start_step": 3, "name": "constant"},), r"stages\[0\].start_step=3: the first stage starts at step 0"),
    (({"start_step": 0}, {"start_step": 0}), r"stages\[1\].start_step=0 is not after"),
    (({"start_step": 0, "lr": 1.0},), r"unknown config key schedule.stages\[0\].lr"),
    (({"start_step": 0, "learning_rate": -1.0},), r"schedule.stages\[0\].learning_rate=-1.0 must be > 0"),
    (((0, "constant"),), r"schedule.stages\[0\]=\(0, 'constant'\): each stage is a dict"),
    (({"start_step": 0, "name": "cosine", "warmup_steps": 50},),
     r"schedule.stages\[0\].warmup_steps=50 exceeds train.steps=10"),
    (({"start_step": 0}, {"start_step": 4, "name": "wsd", "decay_steps": 9}),
     r"schedule.stages\[1\].decay_steps=9 .* longer than the length of schedule.stages\[1\] "
     r"\(steps 4-10\)=6"),
    (({"start_step": 0, "warmup_steps": 2, "warmup_tokens": 100},), "both set the warmup"),
    (({"start_step": 0, "name": "warmup_rsqrt", "warmup_tokens": 100},),
     "a warmup in tokens is for"),
    (({"start_step": 0, "weight_decay": 0.5},), r"stages\[0\].weight_decay=0.5 differs"),
])
def test_bad_stages_are_refused_by_name(stages, match):
    config = config_lib.load("configs/bert_pretrain.py:tiny")
    config.train.steps = 10
    config.schedule = config_lib.section(specs.ScheduleSpec)
    config.schedule.stages = stages
    with pytest.raises(ValueError, match=match):
        optim.make_optimizer(config)


def test_schedule_keys_beside_stages_are_refused():
    """A top-level schedule key would do nothing beside stages (each stage has its own)."""
    config = config_lib.load("configs/modernbert.py:base", ["schedule.warmup_steps=100"])
    with pytest.raises(specs.ConfigError, match="schedule.warmup_steps=100 with schedule.stages"):
        optim.make_optimizer(config)


def test_the_refusal_of_schedule_keys_beside_stages_names_flags_that_clear_it():
    """The refusal names each key the config file sets with the flag that resets it to its
    default; given those flags, the same stages are accepted."""
    stages = "({'start_step': 0, 'name': 'constant', 'learning_rate': 1e-3},)"
    with pytest.raises(specs.ConfigError) as refused:
        optim.make_optimizer(config_lib.load("configs/modernbert.py:tiny",
                                             ["train.steps=4", f"schedule.stages={stages}"]))
    flags = refused.value.args[0].split("reset these to their defaults: ")[1].split()
    assert flags == ["--config.schedule.name=warmup_linear", "--config.schedule.warmup_steps=10",
                     "--config.schedule.decay_fraction=0.0"]
    config = config_lib.load("configs/modernbert.py:tiny", [
        "train.steps=4", f"schedule.stages={stages}", *(f.removeprefix("--config.") for f in flags)])
    optim.make_optimizer(config)  # accepted


def test_a_warmup_longer_than_its_stage_is_refused_naming_the_stage():
    """A stage that ends before its warmup does never reaches its peak: refused; the last
    stage's warmup is the run's (train.steps may grow), as without stages."""
    config = config_lib.load("configs/bert_pretrain.py:tiny", ["train.steps=10"])
    config.schedule = config_lib.section(specs.ScheduleSpec)
    config.schedule.stages = ({"start_step": 0, "name": "constant", "warmup_steps": 3},
                              {"start_step": 2, "name": "constant"})
    with pytest.raises(specs.ConfigError, match=r"schedule.stages\[0\].warmup_steps=3 exceeds the "
                       r"length of schedule.stages\[0\] \(steps 0-2\), 2 steps"):
        optim.make_optimizer(config)
    config.schedule.stages = ({"start_step": 0, "name": "constant", "warmup_steps": 2},
                              {"start_step": 2, "name": "constant", "warmup_steps": 20})
    optim.make_optimizer(config)


def test_a_phase_with_its_own_microbatch():
    """A phase written as a dict may set its microbatch: its batch is that many rows a
    microbatch, and the stream changes with it."""
    config = config_lib.load("configs/bert_pretrain.py:tiny")
    config.train.batch_size = 16
    config.data.phases = ((0, 32, 5, 32), dict(start_step=4, seq_len=64, predictions=10,
                                               batch_size=24, microbatch=8))
    _, first, _ = config_lib.phase_config(config, 0)
    _, second, _ = config_lib.phase_config(config, 4)
    assert (first.train.batch_size, first.train.grad_accum_steps) == (32, 2)
    assert (second.train.batch_size, second.train.grad_accum_steps) == (24, 3)
    assert config_lib.phase_stream(config, 1) == (64, 10, 8)
    config_lib.check_phase_batches(config, shards=8, num_processes=1)
    config.data.phases = (dict(start_step=0, seq_len=32, predictions=5, batch_size=24,
                               microbatch=12),)
    with pytest.raises(specs.ConfigError, match=r"data.phases\[0\] microbatch=12 is not divisible "
                                                r"by the batch shards mesh.data\*mesh.fsdp=8"):
        config_lib.check_phase_batches(config, shards=8, num_processes=1)
    config.data.phases = (dict(start_step=0, seq_len=32, predictions=5, batch_size=20,
                               microbatch=8),)
    with pytest.raises(specs.ConfigError, match=r"batch 20 is not a multiple of the data.phases\[0\] "
                                                r"microbatch=8"):
        config_lib.check_phase_batches(config, shards=8, num_processes=1)
    config.data.phases = (dict(start_step=0, seq_len=32),)
    with pytest.raises(specs.ConfigError, match=r"lacks \['predictions'\]"):
        config_lib.phases(config.data)
