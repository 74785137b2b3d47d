"""ModernBERT pretraining (Warner et al. 2024, "Smarter, Better, Faster, Longer"): the modern
encoder recipe on the BERT family's switches (docs/modernbert.md).

Model (models.modernbert_model_fields): rope (theta 160k global, 10k local), GeGLU, pre-norm
with bias-free LayerNorms and linear layers, an embedding norm and a final norm, 128-token
local attention with a global layer every third, no token types, vocabulary 50,368 (a
multiple of 64), no dropout; masked LM only at 30% masking.
Optimisation: StableAdamW (lr 8e-4, betas 0.9/0.98, eps 1e-6, weight decay 1e-5 per peak lr,
no gradient clipping), warmup then a stable phase then a 1-sqrt decay (wsd), batch-size
warmup through data.phases' batch entry (768 -> 4,608 rows of 1,024 tokens over ~50B tokens),
and in the same run the context extension: from step 377,000 rows of 8,192 tokens with the
global layers' rope base raised from 10k to 160k (data.phases' 5th entry).

Variants (`arg`):
  base   22 x 768 (149M), 1,024-token rows; on a v5p-128 slice:
           bert-jax train --config configs/modernbert.py:base --workdir gs://BUCKET/modernbert \\
             --config.data.tokenizer=gs://BUCKET/tokenizer --config.data.train_files='gs://BUCKET/text/*'
  large  28 x 1024 (395M), same flags, mesh fsdp=8.
  tiny, mini, small, medium: miniatures with BERT's miniature shapes (FFN 1.5 x hidden) and an
         8,192-token vocabulary, sized for a CPU (docs/modernbert.md):
           bert-jax train --config configs/modernbert.py:tiny --workdir /tmp/modern_tiny \\
             --config.data.tokenizer=/tmp/vocab --config.data.train_files='books/*.txt'
Inspect or plan them:
  bert-jax info --config configs/modernbert.py:base
  bert-jax plan --config configs/modernbert.py:base --topology v5p-128
"""

import ml_collections

from bert_jax import config as config_lib
from bert_jax import models

# Rows per step during batch-size warmup at 1,024 tokens (ModernBERT: 768 -> 4,608 over ~50B
# tokens): (first step, rows); ~12.5B tokens per stage.
BATCH_WARMUP = ((0, 768), (15_900, 1_536), (23_850, 3_072), (27_820, 4_608))
CONTEXT_EXTENSION = 377_000  # the step where rows become 8,192 tokens (768 rows per step)


def get_config(arg: str = "base") -> ml_collections.ConfigDict:
    config = config_lib.pretraining_defaults()
    config.model = ml_collections.ConfigDict(
        models.model_section("bert_pretraining", models.modernbert_model_fields(arg)))
    o = config.optimizer
    o.name, o.learning_rate, o.b1, o.b2, o.eps, o.weight_decay = (
        "stable_adamw", 8e-4, 0.9, 0.98, 1e-6, 1e-5)
    o.grad_clip_norm = 0.0  # StableAdamW's per-tensor update clipping instead
    s = config.schedule
    s.name, s.decay_shape, s.final_fraction = "wsd", "1-sqrt", 0.0
    d = config.data
    d.instances = "packed"  # each document's sequences packed into rows, attention per sequence
    d.masked_lm_prob = 0.3
    d.eval_masked_lm_prob = 0.15
    d.whole_word_masking = False
    config.train.keep_checkpoints = 5
    if arg in ("base", "large"):
        d.max_seq_length, d.max_predictions_per_seq = 1024, 308  # 30% of 1,024
        micro = 768  # rows per microbatch: every phase's batch is a multiple of it
        config.train.batch_size = micro
        # 1,024-token phases with rope base 10k everywhere, then the context extension: 8,192
        # tokens with the global layers' base raised to model.rope_theta (160k).
        d.phases = tuple((start, 1024, 308, rows, 10_000.0) for start, rows in BATCH_WARMUP) \
            + ((CONTEXT_EXTENSION, 8192, 2458, micro, 0.0),)
        config.train.steps = CONTEXT_EXTENSION + 40_000  # ~1.7T tokens, then ~250B at 8,192
        config.schedule.warmup_steps = 3_800  # ~3B tokens at 768 rows
        config.schedule.decay_fraction = 0.1
        config.train.log_every = 100
        config.train.eval_every = 10_000
        config.train.eval_steps = 100
        config.train.checkpoint_every = 5_000
        config.model.attention_kernel = "splash"  # TPU; no attention dropout, as ModernBERT
        # 22 (28) layers under lax.scan: minutes of compiling per phase, not tens
        # (docs/modernbert.md#planning-base-on-v5p-and-v6e)
        config.model.scan_layers = True
        if arg == "large":
            config.mesh.fsdp = 8
        return config
    # The miniatures: a CPU-sized run (the BERT miniatures' data and steps, 30% masking).
    config.model.update(vocab_size=8192, max_len=8192)
    d.max_seq_length, d.max_predictions_per_seq = 128, 39  # 30% of 128
    config.train.steps = 300
    config.train.eval_every = 100
    config.train.eval_steps = 4
    config.train.checkpoint_every = 100
    config.schedule.warmup_steps = 30
    config.schedule.decay_fraction = 0.2
    config.optimizer.learning_rate = 1e-3
    return config
