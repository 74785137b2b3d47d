"""ModernBERT pretraining (Warner et al. 2024, "Smarter, Better, Faster, Longer"): the modern
encoder recipe on the BERT family's switches (docs/modernbert.md).

Model (models.modernbert_model_fields): rope (theta 160k global, 10k local), GeGLU, pre-norm
with bias-free LayerNorms and linear layers, an embedding norm and a final norm, 128-token
local attention with a global layer every third, no token types, vocabulary 50,368 (a
multiple of 64), dropout 0.1 on the attention output only (attn_out_dropout_prob); masked LM
only at 30% masking.

base and large are the three published stages (AnswerDotAI/ModernBERT, branch
pretraining_documentation, yamls/modernbert/modernbert-{base,large}-{pretrain,
context-extension,learning-rate-decay}.yaml) in one run, each stage a `schedule.stages`
entry that restarts the schedule with its own learning rate and weight decay (as the
published stages restart from the previous one's checkpoint with reset_time and
restart_override), and a `data.phases` entry for its rows:
  1. pretrain: 1.719T tokens of 1,024-token rows, StableAdamW (betas 0.9/0.98, eps 1e-6, no
     gradient clipping) at a constant lr after a warmup in tokens, the batch warmed up from
     the smallest batch to the full one in equal-step phases (BatchSizeWarmupScheduler),
     rope base 10k in every layer;
  2. context extension: 250B tokens of 8,192-token rows at a constant, lower lr, the global
     layers' rope base 160k;
  3. decay: 50B tokens more, the lr from the stage's peak to 0.1% of it in a 1-sqrt shape.
Each stage's last checkpoint is kept (train.keep_checkpoints keeps only the newest), to
resume or decay from. Steps are counted from tokens with full rows (the published runs count
tokens without padding, so they run a little longer per token budget).

Variants (`arg`):
  base   22 x 768 (149M), on a v5p-128 slice (64 devices: microbatches of 768 rows of 1,024
         tokens, 64 rows of 8,192):
           bert-jax train --config configs/modernbert.py:base --workdir gs://BUCKET/modernbert \\
             --config.data.tokenizer=gs://BUCKET/tokenizer --config.data.train_files='gs://BUCKET/text/*'
  large  28 x 1024 (395M), same flags, plus --config.init_from=<a folder holding base's
         pretrain-stage checkpoint>: its weights tiled from the middle into large's shapes
         (init_mode=tile_from_middle, docs/modernbert.md); its published batches (616 and 624
         rows at 8,192) split only over 8 batch shards (or 1, 2, 4): a v5p-16 slice, fsdp=8.
  tiny, mini, small, medium: miniatures with BERT's miniature shapes (FFN 1.5 x hidden) and an
         8,192-token vocabulary, sized for a CPU (docs/modernbert.md), one wsd schedule:
           bert-jax train --config configs/modernbert.py:tiny --workdir /tmp/modern_tiny \\
             --config.data.tokenizer=/tmp/vocab --config.data.train_files='books/*.txt'
Inspect or plan them:
  bert-jax info --config configs/modernbert.py:base
  bert-jax plan --config configs/modernbert.py:base --topology v5p-128
"""

import math

import ml_collections

from bert_jax import config as config_lib
from bert_jax import models

# The published stages (the yamls named above). World: the 8 GPUs of the published runs, over
# which BatchSizeWarmupScheduler spreads its token budget; rows: global rows per step;
# microbatch: our rows per accumulated microbatch at 1,024 and at 8,192 tokens (memory only).
PUBLISHED = {
    "base": dict(lr=8e-4, warmup_tokens=3_000_000_000, rows=4608, first_rows=768,
                 batch_warmup_tokens=50_000_000_000, weight_decay=1e-5,
                 extension=dict(lr=3e-4, weight_decay=1e-5, rows=576),
                 decay=dict(lr=3e-4, weight_decay=1e-5, rows=576), microbatch=(768, 64)),
    "large": dict(lr=5e-4, warmup_tokens=2_000_000_000, rows=4928, first_rows=448,
                  batch_warmup_tokens=10_000_000_000, weight_decay=1e-5,
                  extension=dict(lr=5e-5, weight_decay=1e-6, rows=616),
                  decay=dict(lr=5e-5, weight_decay=1e-6, rows=624), microbatch=(448, 56, 48)),
}
WORLD = 8
PRETRAIN_TOKENS, EXTENSION_TOKENS, DECAY_TOKENS = 1_719_000_000_000, 250_000_000_000, 50_000_000_000
DECAY_FINAL = 0.001  # one_minus_sqrt's alpha_f: the last lr is 0.1% of the stage's


def batch_warmup(first_rows: int, rows: int, tokens: int, seq_len: int,
                 world: int = WORLD) -> list[tuple[int, int]]:
    """[(first step, rows)] of ModernBERT's batch-size warmup: each device's batch grows one
    microbatch (first_rows / world rows) at a time from one to rows / first_rows of them, for
    equal token shares per size (size b: b / sum(sizes) of the device's tokens / world),
    until `tokens` in all; then the full batch."""
    lo, hi = 1, rows // first_rows
    per_size = math.ceil(tokens / world) / sum(range(lo, hi))
    device_tokens = first_rows // world * seq_len  # one device's tokens of one microbatch
    out, step, seen, share = [], 0, 0, 0
    for size in range(lo, hi):
        share += size
        # The size serves while the device's tokens so far are below the size's threshold.
        steps = max(0, math.ceil((math.ceil(per_size * share) - seen) / (size * device_tokens)))
        out.append((step, size * first_rows))
        step, seen = step + steps, seen + steps * size * device_tokens
    return [*out, (step, rows)]


def stages(arg: str, seq_len: int = 1024, long_len: int = 8192, predictions: int = 308,
           long_predictions: int = 2458) -> tuple[tuple, tuple, int]:
    """(data.phases, schedule.stages, train.steps) of the published stages of `arg`."""
    p = PUBLISHED[arg]
    ramp = batch_warmup(p["first_rows"], p["rows"], p["batch_warmup_tokens"], seq_len)
    micro = p["microbatch"]
    phases = [dict(start_step=start, seq_len=seq_len, predictions=predictions, batch_size=rows,
                   rope_theta=10_000.0) for start, rows in ramp]
    ramp_tokens = sum((b[0] - a[0]) * a[1] * seq_len for a, b in zip(ramp, ramp[1:]))
    pretrain = ramp[-1][0] + math.ceil((PRETRAIN_TOKENS - ramp_tokens) / (p["rows"] * seq_len))
    ext, dec = p["extension"], p["decay"]
    extension = pretrain + math.ceil(EXTENSION_TOKENS / (ext["rows"] * long_len))
    end = extension + math.ceil(DECAY_TOKENS / (dec["rows"] * long_len))
    long_micro = (micro[1], micro[-1])
    phases.append(dict(start_step=pretrain, seq_len=long_len, predictions=long_predictions,
                       batch_size=ext["rows"], microbatch=long_micro[0]))
    if dec["rows"] != ext["rows"] or long_micro[1] != long_micro[0]:
        phases.append(dict(start_step=extension, seq_len=long_len, predictions=long_predictions,
                           batch_size=dec["rows"], microbatch=long_micro[1]))
    schedule = (
        dict(start_step=0, name="constant", learning_rate=p["lr"],
             warmup_tokens=p["warmup_tokens"], weight_decay=p["weight_decay"]),
        dict(start_step=pretrain, name="constant", learning_rate=ext["lr"],
             weight_decay=ext["weight_decay"]),
        dict(start_step=extension, name="wsd", learning_rate=dec["lr"], decay_fraction=1.0,
             decay_shape="1-sqrt", final_fraction=DECAY_FINAL, weight_decay=dec["weight_decay"]),
    )
    return tuple(phases), schedule, end


def get_config(arg: str = "base") -> ml_collections.ConfigDict:
    config = config_lib.pretraining_defaults()
    config.model = ml_collections.ConfigDict(
        models.model_section("bert_pretraining", models.modernbert_model_fields(arg)))
    o = config.optimizer
    o.name, o.learning_rate, o.b1, o.b2, o.eps, o.weight_decay = (
        "stable_adamw", 8e-4, 0.9, 0.98, 1e-6, 1e-5)
    o.grad_clip_norm = 0.0  # StableAdamW's per-tensor update clipping instead
    d = config.data
    d.instances = "packed"  # each document's sequences packed into rows, attention per sequence
    d.masked_lm_prob = 0.3
    d.eval_masked_lm_prob = 0.15
    d.whole_word_masking = False
    config.train.keep_checkpoints = 5
    if arg in ("base", "large"):
        d.max_seq_length, d.max_predictions_per_seq = 1024, 308  # 30% of 1,024
        d.phases, config.schedule.stages, config.train.steps = stages(arg)
        config.optimizer.learning_rate = PUBLISHED[arg]["lr"]
        config.train.batch_size = PUBLISHED[arg]["microbatch"][0]  # every 1,024 batch a multiple
        config.train.log_every = 100
        config.train.eval_every = 10_000
        config.train.eval_steps = 100
        config.train.checkpoint_every = 4_000  # the published save_interval
        config.model.attention_kernel = "splash"  # TPU; no attention dropout, as ModernBERT
        # 22 (28) layers under lax.scan: minutes of compiling per phase, not tens
        # (docs/modernbert.md#planning-base-on-v5p-and-v6e)
        config.model.scan_layers = True
        if arg == "large":
            config.mesh.fsdp = 8
            # Started from base's pretrain-stage checkpoint tiled to large's shapes (the
            # published init_from_checkpoint, mode tile_weights_from_middle): --config.init_from
            config.init_mode = "tile_from_middle"
        return config
    # The miniatures: a CPU-sized run (the BERT miniatures' data and steps, 30% masking).
    config.model.update(vocab_size=8192, max_len=8192)
    d.max_seq_length, d.max_predictions_per_seq = 128, 39  # 30% of 128
    s = config.schedule
    s.name, s.decay_shape, s.final_fraction = "wsd", "1-sqrt", 0.0
    config.train.steps = 300
    config.train.eval_every = 100
    config.train.eval_steps = 4
    config.train.checkpoint_every = 100
    config.schedule.warmup_steps = 30
    config.schedule.decay_fraction = 0.2
    config.optimizer.learning_rate = 1e-3
    return config
