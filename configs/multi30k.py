"""A small Transformer on Multi30k (29,000 image-caption pairs) that trains on one CPU
machine: En->De by default (`arg` "de-en" reverses it), sacreBLEU on test2016 via translate.

Shared 8k SentencePiece BPE over both languages, cased (train it first, docs/translation.md):
  bert-jax vocab --input '../shared/data/mt/multi30k/train.*.gz' --type sentencepiece \\
    --sp_model_type bpe --size 8000 --lowercase=false --out runs/multi30k_spm
  bert-jax train --config configs/multi30k.py --workdir runs/multi30k
Model: 3+3 layers, d_model 256, 4 heads, d_ff 1024, pre-LayerNorm (steadier than the
paper's post-LN at this size and learning rate), dropout 0.1, label smoothing 0.1, tied
embeddings; batches of 64 rows x 64 tokens a side, ~92% full after packing (~3,800 real
target tokens, ~240 pairs). Paths in data.* are the shared data beside the checkout;
data.tokenizer is relative to where the commands run (the repo root in docs/translation.md).
"""


import ml_collections

from bert_jax import config as config_lib
from bert_jax import models, paths

# ../shared/data beside the checkout (or $BERT_JAX_SHARED_DATA), wherever the command runs.
_DATA = f"{paths.shared_data()}/mt/multi30k"


def get_config(arg: str = "en-de") -> ml_collections.ConfigDict:
    config = config_lib.translation_defaults()
    fields = models.transformer_model_fields("base", vocab_size=8000)
    fields.update(num_layers=3, num_decoder_layers=3, emb_dim=256, num_heads=4, head_dim=64,
                  mlp_dim=1024, norm="pre", dropout_rate=0.1, attention_dropout_rate=0.1)
    config.model = ml_collections.ConfigDict(models.model_section("transformer", fields))

    d = config.data
    if arg not in ("en-de", "de-en"):
        raise ValueError(f"configs/multi30k.py:{arg}: choose en-de or de-en")
    d.source_lang, d.target_lang = arg.split("-")
    d.train_files = f"{_DATA}/train.{{lang}}.gz"
    d.eval_files = f"{_DATA}/val.{{lang}}.gz"
    d.test_files = f"{_DATA}/test_2016_flickr.{{lang}}.gz"
    d.tokenizer = "runs/multi30k_spm"
    d.max_seq_length = 64

    config.optimizer.name = "adam"
    config.optimizer.learning_rate = 1e-3
    config.optimizer.b1, config.optimizer.b2, config.optimizer.eps = 0.9, 0.98, 1e-9
    config.optimizer.weight_decay = 0.0
    config.optimizer.grad_clip_norm = 0.0
    config.schedule.name = "warmup_rsqrt"
    config.schedule.warmup_steps = 400
    config.train.steps = 2000
    config.train.batch_size = 64
    config.train.label_smoothing = 0.1
    config.train.log_every = 50
    config.train.eval_every = 500
    config.train.eval_steps = 0  # the whole dev set
    config.train.checkpoint_every = 250
    config.train.keep_checkpoints = 5
    return config
