"""Named entity recognition (Devlin et al. 2019, 5.3): each word's first sub-token -> a tag;
entity-level precision / recall / F1 (conlleval / seqeval semantics) on dev.

Variants (`arg`): `conll2003` or `wnut17`, optionally `,<size>` (tiny ... large, or
modernbert-<size>; default base).
Any `token ... tag` column file works: set data.data_dir, data.train_file/dev_file/test_file
and data.labels (the tag set, 'O' first; model.num_labels must equal its length).
  bert-jax train --config configs/ner.py:conll2003 --workdir /runs/ner \\
    --config.init_from=/ckpt/bert_base_cased --config.data.data_dir=/data/conll2003
  bert-jax eval --config configs/ner.py:conll2003 --workdir /runs/ner --step best --split test
Slice: one Cloud TPU v3-8 (4 chips, 8 devices; mesh data=-1), as in the paper ("at most 1
hour on a single Cloud TPU"); checked with: bert-jax plan --config configs/ner.py:conll2003 --topology v3-8
"""

import ml_collections

from bert_jax import models, tasks

_TYPES = {"conll2003": ("LOC", "MISC", "ORG", "PER"),
          "wnut17": ("corporation", "creative-work", "group", "location", "person", "product")}
_FILES = {"conll2003": ("train.txt", "valid.txt", "test.txt"),
          "wnut17": ("wnut17train.conll", "emerging.dev.conll", "emerging.test.annotated")}


def get_config(arg: str = "conll2003") -> ml_collections.ConfigDict:
    dataset, _, size = arg.partition(",")
    if dataset not in _TYPES:
        raise ValueError(f"configs/ner.py:{arg}: choose one of {sorted(_TYPES)}")
    labels = ("O", *(f"{p}-{t}" for p in "BI" for t in _TYPES[dataset]))
    config = tasks.finetune_defaults("ner", size or "base")
    config.model = ml_collections.ConfigDict(models.model_section(
        "bert_tagging", models.encoder_model_fields(size or "base"), num_labels=len(labels)))
    config.data.labels = labels
    config.data.train_file, config.data.dev_file, config.data.test_file = _FILES[dataset]
    return config
