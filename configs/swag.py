"""SWAG (Devlin et al. 2019, 4.4): four [CLS] context [SEP] start + ending [SEP] sequences, one
score each from the pooled [CLS], softmax over the four. Paper: 3 epochs, lr 2e-5, batch 16.
Reads the swagaf CSV files (train.csv, val.csv, test.csv) or JSON lines with the same fields.

Variants (`arg`): `base` (default), or another size (tiny ... large, or modernbert-<size>).
  bert-jax train --config configs/swag.py --workdir /runs/swag \\
    --config.init_from=/ckpt/bert_base --config.data.data_dir=/data/swagaf/data
Slice: one Cloud TPU v3-8 (4 chips, 8 devices; mesh data=-1), as in the paper ("at most 1
hour on a single Cloud TPU"); checked with: bert-jax plan --config configs/swag.py --topology v3-8
"""

import ml_collections

from bert_jax import models, tasks


def get_config(arg: str = "base") -> ml_collections.ConfigDict:
    config = tasks.finetune_defaults("swag", arg)
    config.model = ml_collections.ConfigDict(models.model_section(
        "bert_choice", models.encoder_model_fields(arg)))  # one score per ending
    config.train.batch_size = 16
    config.data.train_file, config.data.dev_file, config.data.test_file = (
        "train.csv", "val.csv", "test.csv")
    return config
