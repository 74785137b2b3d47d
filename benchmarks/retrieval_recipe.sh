#!/usr/bin/env bash
# The retrieval recipe at miniature size (docs/retrieval.md#scores-beside-each-other): a
# WordPiece vocabulary and MLM pretraining of the `mini` BERT (4 x 256) on the shared text
# corpora, its mean-pooled vectors scored as they are, then contrastive training
# (MultipleNegativesRankingLoss, in-batch negatives) from that checkpoint on the SQuAD training
# subset beside the repo (its questions and paragraphs), scored again: STS-B dev and SQuAD dev
# as retrieval, with BM25 beside. At 600 + 200 steps: 48 min on 2 busy cores (docs/retrieval.md); its
# PRETRAIN_STEPS=20 CONTRASTIVE_STEPS=10 run is the check that it goes through.
# Usage: bash benchmarks/retrieval_recipe.sh [workdir]
# (default runs/retrieval_recipe; each step's JSON line is appended to <workdir>/scores.jsonl).
set -euo pipefail
W=${1:-runs/retrieval_recipe}
DATA=${BERT_JAX_SHARED_DATA:-../shared/data}
B=.venv/bin/bert-jax
PRETRAIN_STEPS=${PRETRAIN_STEPS:-1500}
CONTRASTIVE_STEPS=${CONTRASTIVE_STEPS:-400}
mkdir -p "$W"
score() {  # <name> <eval-embeddings flags...>: one JSON line, named, into scores.jsonl
  name=$1; shift
  $B eval-embeddings --sts "$DATA/glue/STS-B/dev.tsv" --squad "$DATA/squad/dev-v1.1.json" "$@" \
    | tail -1 | sed "s/^{/{\"row\": \"$name\", /" >> "$W/scores.jsonl"
}
[ -d "$W/vocab" ] || $B vocab --input "$DATA/text/gutenberg/*.txt,$DATA/text/wikitext2/*.txt" \
  --size 8192 --type wordpiece --out "$W/vocab"
$B train --config configs/bert_pretrain.py:mini --workdir "$W/mlm" \
  --config.data.tokenizer="$W/vocab" --config.model.vocab_size=8192 \
  --config.data.train_files="$DATA/text/gutenberg/*.txt,$DATA/text/wikitext2/*.txt" \
  --config.train.steps="$PRETRAIN_STEPS" --config.schedule.warmup_steps=$((PRETRAIN_STEPS / 10)) \
  --config.train.checkpoint_every=500 \
  --config.train.eval_every=0
score "MLM pretraining only, mean pooling" --checkpoint "$W/mlm" --pooling mean --bm25
$B train --config configs/embeddings.py:contrastive,mini --workdir "$W/contrastive" \
  --config.init_from="$W/mlm" --config.data.tokenizer="$W/vocab" --config.model.vocab_size=8192 \
  --config.data.data_dir="$DATA/squad" --config.data.train_file=train-subset-v1.1.json \
  --config.data.dev_file=dev-v1.1.json --config.data.max_seq_length=128 \
  --config.train.steps="$CONTRASTIVE_STEPS" --config.schedule.warmup_steps=$((CONTRASTIVE_STEPS / 10)) \
  --config.train.eval_every=0 \
  --config.train.checkpoint_every="$CONTRASTIVE_STEPS"
score "MLM pretraining, then contrastive on SQuAD-train" --checkpoint "$W/contrastive"
cat "$W/scores.jsonl"
