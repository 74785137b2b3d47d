"""GLUE fine-tuning (Devlin et al. 2019, 4.1): [CLS] A [SEP] B [SEP] -> pooled [CLS] -> classifier
(STS-B: a regression head). Paper setup: batch 32, 3 epochs, lr picked on dev from 5e-5, 3e-5,
2e-5 (configs/sweeps/glue.py runs that grid), 10% warmup then linear decay, dropout 0.1.

Variants (`arg`): `<task>` or `<task>,<size>` with task one of cola sst2 mrpc stsb qqp mnli
qnli rte wnli (mnli is scored on dev matched and mismatched) and size one of tiny mini small
medium base large, or modernbert-<size> (ModernBERT's heads: pooled [CLS] or mean, then
dense + GELU + norm; docs/modernbert.md) (default base). From a converted public checkpoint:
  bert-jax convert hf:bert-base-uncased /ckpt/bert_base
  bert-jax train --config configs/glue.py:mrpc --workdir /runs/mrpc \\
    --config.init_from=/ckpt/bert_base --config.data.data_dir=/data/glue
  bert-jax eval --config configs/glue.py:mrpc --workdir /runs/mrpc --step best --split test
TFDS instead of the TSV files: --config.data.source=tfds (data_dir: the TFDS data dir).
Long documents: size `long` (e.g. `sst2,long`) is a tiny BERT at 4,096 tokens with BigBird
attention (docs/attention.md, long inputs; `bench longdoc` builds its data from the Gutenberg
books: which author wrote an excerpt, in SST-2's layout), trained from scratch on a CPU.
Slice: one Cloud TPU v3-8 (4 chips, 8 devices; mesh data=-1), as in the paper ("at most 1
hour on a single Cloud TPU"); checked with: bert-jax plan --config configs/glue.py:mnli --topology v3-8
"""

import ml_collections

from bert_jax import models, tasks
from bert_jax.tasks import glue


def get_config(arg: str = "mrpc") -> ml_collections.ConfigDict:
    task, _, size = arg.partition(",")
    spec = glue.task_spec(task)
    long = size == "long"
    size = "tiny" if long else size or "base"
    config = tasks.finetune_defaults("glue", size)
    config.model = ml_collections.ConfigDict(models.model_section(
        "bert_classification", models.encoder_model_fields(size),
        num_labels=1 if spec.labels is None else len(spec.labels)))  # 1: regression (STS-B)
    config.data.task = task
    if long:  # 4,096-token rows, one document each, BigBird: seconds a step on 2 CPU cores
        config.model.update(vocab_size=4096, emb_dim=64, num_heads=2, head_dim=32, mlp_dim=256,
                            max_len=4096, attention_pattern="bigbird")
        config.data.update(max_seq_length=4096, pack=False)  # a document fills its row
        config.train.update(batch_size=2, epochs=1.0, log_every=10)
    return config
