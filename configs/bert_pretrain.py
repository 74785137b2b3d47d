"""BERT pretraining (MLM + NSP) at the paper's sizes and the released miniatures.

Variants (`arg`): tiny, mini, small, medium, base (L12 H768 A12, 110M), large (L24 H1024
A16, 340M). Inspect one:

  bert-jax info --config configs/bert_pretrain.py:base
"""

import ml_collections

from bert_jax import models


def get_config(arg: str = "base") -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0  # parameter init and data order
    config.model = ml_collections.ConfigDict(
        dict(name="bert_pretraining", **models.bert_model_fields(arg)))
    config.data = ml_collections.ConfigDict()
    config.data.max_seq_length = 128  # the paper's first phase (90% of steps)
    return config
