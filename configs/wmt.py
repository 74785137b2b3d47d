"""The Transformer (Vaswani et al. 2017) on WMT En-De: paper Table 3 base and big.

Variants (`arg`): base (N=6, d_model 512, d_ff 2048, h 8, dropout 0.1, 65M published),
big (N=6, d_model 1024, d_ff 4096, h 16, dropout 0.3, 213M published). Shared 37k BPE
vocabulary, tied embeddings and pre-softmax weights, sinusoidal positions. Inspect one:

  bert-jax info --config configs/wmt.py:big
"""

import ml_collections

from bert_jax import models


def get_config(arg: str = "base") -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0  # parameter init and data order
    config.model = ml_collections.ConfigDict(
        dict(name="transformer", **models.transformer_model_fields(arg, vocab_size=37000)))
    config.data = ml_collections.ConfigDict()
    config.data.max_seq_length = 256  # longest source/target kept
    return config
