"""SQuAD v1.1 and v2.0 (Devlin et al. 2019, 4.2-4.3): question and paragraph packed as A/B in
doc_stride windows; start/end vectors; n-best spans mapped back to the original text; v2.0
predicts no answer when the [CLS] score beats the best span by null_score_diff_threshold.
Official EM / F1; predictions.json and nbest_predictions.json (v2: null_odds.json).

Variants (`arg`): `v1` (3 epochs, lr 5e-5, batch 32) or `v2` (2 epochs, lr 5e-5, batch 48),
optionally `,<size>` (tiny ... large, or modernbert-<size>; default base).
  bert-jax train --config configs/squad.py:v1 --workdir /runs/squad \\
    --config.init_from=/ckpt/bert_base --config.data.data_dir=/data/squad
  bert-jax eval --config configs/squad.py:v1 --workdir /runs/squad --step best
Slice: one Cloud TPU v3-8 (4 chips, 8 devices; mesh data=-1), as in the paper ("at most 1
hour on a single Cloud TPU"); checked with: bert-jax plan --config configs/squad.py:v1 --topology v3-8
"""

import ml_collections

from bert_jax import models, tasks


def get_config(arg: str = "v1") -> ml_collections.ConfigDict:
    version, _, size = arg.partition(",")
    if version not in ("v1", "v2"):
        raise ValueError(f"configs/squad.py:{arg}: choose v1 or v2")
    config = tasks.finetune_defaults("squad", size or "base")
    config.model = ml_collections.ConfigDict(models.model_section(
        "bert_span", models.encoder_model_fields(size or "base")))
    config.train.epochs = 3.0 if version == "v1" else 2.0
    config.train.batch_size = 32 if version == "v1" else 48
    d = config.data
    d.version_2 = version == "v2"
    name = "v1.1" if version == "v1" else "v2.0"
    d.train_file, d.dev_file = f"train-{name}.json", f"dev-{name}.json"
    d.max_seq_length = 384
    return config
