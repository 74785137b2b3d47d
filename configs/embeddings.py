"""Sentence embeddings trained contrastively (docs/retrieval.md): an encoder of any BERT family
with mean pooling and normalised vectors (model.name=bert_embedding), trained on pair files
(data.name=pairs: a query and its positive, optional hard negatives; or scored pairs) with
sentence-transformers' losses, the global batch as the negative pool.

Variants (`arg`): `<loss>` or `<loss>,<size>`: loss `contrastive` (MultipleNegativesRankingLoss,
the default), `contrastive_symmetric` or `cosent` (pairs with a score, as STS-B); size one of
tiny mini small medium base large, or modernbert-<size> (default base). Recipe of
sentence-transformers' training scripts: batch 64, 1 epoch, lr 2e-5, 10% warmup then linear
decay, scale 20 (temperature 0.05).
  bert-jax convert hf:bert-base-uncased /ckpt/bert_base
  bert-jax train --config configs/embeddings.py --workdir /runs/emb \\
    --config.init_from=/ckpt/bert_base --config.data.data_dir=/data/pairs \\
    --config.data.train_file=train.jsonl --config.data.dev_file=dev.jsonl
Larger pools than memory holds: --config.train.grad_accum_steps=k embeds the batch in k
chunks (GradCache) with the same loss and gradient. Matryoshka: --config.model.matryoshka_dims
(e.g. "(768, 512, 256, 128, 64)").
"""

import ml_collections

from bert_jax import models, tasks


def get_config(arg: str = "contrastive") -> ml_collections.ConfigDict:
    loss, _, size = arg.partition(",")
    size = size or "base"
    config = tasks.finetune_defaults("pairs", size)
    config.model = ml_collections.ConfigDict(models.model_section(
        "bert_embedding", models.encoder_model_fields(size)))
    config.train.objective = loss
    config.train.batch_size = 64
    config.train.epochs = 1.0
    return config
