"""BERT pretraining (MLM + NSP), the paper's setup (Devlin et al. 2019, A.2).

Variants (`arg`):
  base   L12 H768 A12 (110M) on 16 Cloud TPU chips: a v3-32 slice (4x4 chips, 32 devices: each
         TensorCore is one), mesh data=-1 (all devices):
           bert-jax train --config configs/bert_pretrain.py:base --workdir gs://BUCKET/bert_base \\
             --config.data.tokenizer=gs://BUCKET/vocab --config.data.train_files='gs://BUCKET/shards/*'
         (text files; the vocab from `bert-jax vocab --input 'gs://BUCKET/text/*' --out
         gs://BUCKET/vocab`; or array_record shards of `bert-jax prepare --out gs://BUCKET/shards`
         with --config.data.name=array_record --config.data.train_files='gs://BUCKET/shards/train-*')
  large  L24 H1024 A16 (340M) on 64 chips: a v3-128 slice (8x8 chips, 128 devices), mesh fsdp=8
         and data=-1 (16), same flags.
Check either before renting the slice (compiles for it here; pip install 'bert_jax[tpu]'):
  bert-jax plan --config configs/bert_pretrain.py:base --topology v3-32
  tiny, mini, small, medium: the released miniatures; `tiny` is sized for a CPU:
           bert-jax train --config configs/bert_pretrain.py:tiny --workdir /tmp/bert_tiny \\
             --config.data.tokenizer=/tmp/vocab --config.data.train_files='books/*.txt'
  long   4,096-token instances (one book = one document, data.text_format=document) for a
         tiny model on a CPU, to compare attention patterns (docs/attention.md, long inputs):
           bert-jax train --config configs/bert_pretrain.py:long --workdir /tmp/bert_long \
             --config.data.tokenizer=/tmp/vocab --config.data.train_files='books/*.txt' \
             --config.data.eval_files=heldout.txt --config.model.attention_pattern=bigbird
  mlm_tiny  `tiny` trained as RoBERTa and ModernBERT are: masked LM only (model.nsp=False, no
         pooler or NSP head), documents packed into rows with attention per document
         (data.instances=packed; full_rows: RoBERTa's rows across documents), 30% of the tokens
         masked in training and 15% in evaluation, a new masking each epoch:
           bert-jax train --config configs/bert_pretrain.py:mlm_tiny --workdir /tmp/mlm_tiny \
             --config.data.tokenizer=/tmp/vocab --config.data.train_files='books/*.txt'
The paper's schedule: batch 256, 1M steps, 90% at length 128 (20 predictions) then 10% at
512 (80 predictions), Adam lr 1e-4, b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 (Google's
AdamWeightDecayOptimizer, no bias correction: optimizer.name adam_weight_decay, the default),
10k warmup steps then linear decay, gradients clipped to norm 1.0, dropout 0.1, GELU. The
miniatures train with lr 1e-3 and the bias-corrected adamw (CPU-sized). Inspect a model:
  bert-jax info --config configs/bert_pretrain.py:base
"""

import ml_collections

from bert_jax import config as config_lib
from bert_jax import models


def get_config(arg: str = "base") -> ml_collections.ConfigDict:
    config = config_lib.pretraining_defaults()
    size = "tiny" if arg in ("long", "mlm_tiny") else arg
    config.model = ml_collections.ConfigDict(
        models.model_section("bert_pretraining", models.bert_model_fields(size)))
    config.train.keep_checkpoints = 5
    if arg in ("base", "large"):  # the paper's schedule
        config.train.batch_size = 256
        config.train.steps = 1_000_000
        config.train.log_every = 100
        config.train.eval_every = 10_000
        config.train.eval_steps = 100
        config.train.checkpoint_every = 10_000
        config.schedule.warmup_steps = 10_000
        config.data.phases = ((0, 128, 20), (900_000, 512, 80))
        if arg == "large":
            config.mesh.fsdp = 8  # and data=-1 (the default): the other 16 of 128 devices
    else:  # the miniatures: a CPU-sized run
        config.model.vocab_size = 8192
        config.data.max_seq_length = 64
        config.data.max_predictions_per_seq = 10
        config.train.steps = 300
        config.train.eval_every = 100
        config.train.eval_steps = 4
        config.train.checkpoint_every = 100
        config.schedule.warmup_steps = 30
        config.optimizer.learning_rate = 1e-3
        # with bias correction: adam_weight_decay's early steps (up to 6.6x) at this lr stall
        # the demo's MLM accuracy at 0.07 (adamw: 0.13; docs/training.md#optimizers)
        config.optimizer.name = "adamw"
    if arg == "long":  # few steps of 2 x 4,096 tokens: minutes per pattern on 2 CPU cores
        config.model.update(vocab_size=4096, emb_dim=64, num_heads=2, head_dim=32, mlp_dim=256,
                            max_len=4096)
        config.data.update(text_format="document", max_seq_length=4096,
                           max_predictions_per_seq=614)  # 15%
        config.train.update(batch_size=2, steps=40, log_every=10, eval_every=40, eval_steps=4,
                            checkpoint_every=40)
        config.schedule.warmup_steps = 5
    if arg == "mlm_tiny":
        config.model.nsp = False
        config.data.update(instances=config_lib.MLM_ONLY_DEFAULT, masked_lm_prob=0.3,
                           eval_masked_lm_prob=0.15,
                           max_predictions_per_seq=20)  # round(0.3 * 64) = 19, and room to pack
    return config
