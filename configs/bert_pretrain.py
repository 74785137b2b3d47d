"""BERT pretraining (MLM + NSP) at the paper's sizes and the released miniatures.

Variants (`arg`): tiny, mini, small, medium, base (L12 H768 A12, 110M), large (L24 H1024
A16, 340M). Inspect or train one:

  bert-jax info --config configs/bert_pretrain.py:base
  bert-jax train --config configs/bert_pretrain.py:tiny --workdir /tmp/bert_tiny

Until the text pipeline lands the data is synthetic (bert_jax/data/synthetic.py).
"""

import ml_collections

from bert_jax import config as config_lib
from bert_jax import models


def get_config(arg: str = "base") -> ml_collections.ConfigDict:
    config = config_lib.training_defaults()
    config.model = ml_collections.ConfigDict(
        dict(name="bert_pretraining", **models.bert_model_fields(arg)))
    config.data = ml_collections.ConfigDict()
    config.data.name = "synthetic"
    config.data.max_seq_length = 128  # the paper's first phase (90% of steps)
    config.data.max_predictions_per_seq = 20

    # The paper: batch 256, Adam lr 1e-4 (b1 0.9, b2 0.999), weight decay 0.01, 10k warmup
    # steps then linear decay, 1M steps.
    config.train.batch_size = 256
    config.train.steps = 1_000_000
    config.train.log_every = 100
    config.train.checkpoint_every = 10_000
    config.schedule.warmup_steps = 10_000
    if arg in ("tiny", "mini"):  # a CPU-sized run
        config.model.vocab_size = 1024
        config.data.max_seq_length = 64
        config.data.max_predictions_per_seq = 10
        config.train.batch_size = 32
        config.train.steps = 200
        config.train.log_every = 10
        config.train.checkpoint_every = 50
        config.schedule.warmup_steps = 20
        config.optimizer.learning_rate = 1e-3
    return config
