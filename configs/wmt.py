"""The Transformer (Vaswani et al. 2017) on WMT En-De: paper Table 3 base and big.

Variants (`arg`): base (N=6, d_model 512, d_ff 2048, h 8, dropout 0.1, 100k steps; 65M
published) and big (N=6, d_model 1024, d_ff 4096, h 16, dropout 0.3, 300k steps; 213M
published). Shared 37k BPE vocabulary, tied embeddings and pre-softmax weights, sinusoidal
positions, Adam (0.9, 0.98, 1e-9), lr = d_model^-0.5 * min(step^-0.5, step * 4000^-1.5),
label smoothing 0.1, beam 4 with alpha 0.6. The paper's batches hold about 25000 source and
25000 target tokens: here 128 rows of 256 tokens a side, packed with several pairs per row
(about 90% full, so ~29k real tokens a side), sized for a v3-8 slice (8 devices, mesh
data=8; big: fsdp=2 to halve the optimizer state per device); mesh.data=-1 fills any slice.
Data: TFDS wmt14_translate/de-en (newstest2013 as dev) and a shared 37k BPE:

  bert-jax vocab --input tfds:wmt14_translate/de-en:train:en,de --type sentencepiece \
    --sp_model_type bpe --size 37000 --lowercase=false --out runs/wmt_spm
  bert-jax train --config configs/wmt.py:base --workdir runs/wmt_base \
    --config.data.tokenizer=runs/wmt_spm
  bert-jax average --workdir runs/wmt_base --last 5 --out runs/wmt_base_avg
  bert-jax translate --checkpoint runs/wmt_base_avg --input newstest2014.en \
    --output newstest2014.out --reference newstest2014.de
(TFDS reads datasets built as array_record: `tfds build --file_format=array_record`.)
docs/translation.md runs the same config end to end on the WMT files of ../shared/data.
"""

import ml_collections

from bert_jax import config as config_lib
from bert_jax import models

# Paper Table 3 train steps per size.
_STEPS = {"base": 100_000, "big": 300_000}


def get_config(arg: str = "base") -> ml_collections.ConfigDict:
    config = config_lib.translation_defaults()
    config.model = ml_collections.ConfigDict(models.model_section(
        "transformer", models.transformer_model_fields(arg, vocab_size=37000)))

    d = config.data
    d.tfds_name = "wmt14_translate/de-en"  # train: WMT14 (4.5M pairs); validation: newstest2013
    d.bleu_sentences = 1000  # of newstest2013's 3000, at each evaluation

    config.optimizer.name = "adam"
    config.optimizer.learning_rate = 1.0  # rsqrt_paper: the scale of d_model^-0.5 * ...
    config.optimizer.b1, config.optimizer.b2, config.optimizer.eps = 0.9, 0.98, 1e-9
    config.optimizer.weight_decay = 0.0
    config.optimizer.grad_clip_norm = 0.0  # the paper clips nothing
    config.schedule.name = "rsqrt_paper"
    config.schedule.warmup_steps = 4000
    config.train.steps = _STEPS[arg]
    config.train.batch_size = 128
    config.train.label_smoothing = 0.1
    config.train.log_every = 100
    config.train.eval_every = 5000
    config.train.eval_steps = 4  # newstest2013 packs into ~3 batches (more are padding)
    config.train.checkpoint_every = 5000
    config.train.keep_checkpoints = 20  # big averages the last 20 (base: 5)
    if arg == "big":
        config.mesh.fsdp = 2
    return config
