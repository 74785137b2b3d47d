#!/usr/bin/env bash
# The retrieval recipe at miniature size (docs/retrieval.md#scores-beside-each-other): a
# WordPiece vocabulary and MLM pretraining of a `mini` encoder on the shared text corpora
# (MODEL=bert: BERT mini, 4 x 256, configs/bert_pretrain.py:mini; MODEL=modernbert: the
# ModernBERT miniature of the same shape, configs/modernbert.py:mini, with the same vocabulary),
# its mean-pooled vectors scored as they are; then contrastive training
# (MultipleNegativesRankingLoss, in-batch negatives) from that checkpoint on the SQuAD training
# subset beside the repo (its questions and paragraphs), scored again; then CoSENT on the
# STS-B training pairs (scored pairs) from the contrastive checkpoint, scored again. Each score
# is STS-B dev and SQuAD dev as retrieval, with BM25 beside. BERT at 600 + 200 steps (no STS
# stage): 48 min on 2 busy cores (docs/retrieval.md); its
# PRETRAIN_STEPS=20 CONTRASTIVE_STEPS=10 STS_STEPS=10 run is the check that it goes through.
# Training's own end-of-run evaluation is the small STS-B dev file (the SQuAD dev retrieval of
# `score` is the one that counts, and takes minutes).
# Rerun in the same workdir, it goes on: the vocabulary and finished stages are kept (a stage
# trained to its steps trains no further) and rows already in scores.jsonl are not scored again
# (so rerun with the same steps).
# Usage: [MODEL=bert|modernbert] bash benchmarks/retrieval_recipe.sh [workdir]
# (default runs/retrieval_recipe; each step's JSON line is appended to <workdir>/scores.jsonl;
# STS_STEPS=0 skips the STS-B stage).
set -euo pipefail
W=${1:-runs/retrieval_recipe}
DATA=${BERT_JAX_SHARED_DATA:-../shared/data}
B=.venv/bin/bert-jax
MODEL=${MODEL:-bert}
PRETRAIN_STEPS=${PRETRAIN_STEPS:-1500}
CONTRASTIVE_STEPS=${CONTRASTIVE_STEPS:-400}
STS_STEPS=${STS_STEPS:-200}
case $MODEL in
  bert) MLM_CONFIG=configs/bert_pretrain.py:mini; ENCODER=mini; NAME="BERT mini" ;;
  modernbert) MLM_CONFIG=configs/modernbert.py:mini; ENCODER=modernbert-mini; NAME="ModernBERT mini" ;;
  *) echo "MODEL=$MODEL: choose bert or modernbert" >&2; exit 2 ;;
esac
for v in PRETRAIN_STEPS CONTRASTIVE_STEPS STS_STEPS; do  # STS_STEPS=0: no STS-B stage
  [[ ${!v} =~ ^[1-9][0-9]*$ || ($v == STS_STEPS && ${!v} == 0) ]] \
    || { echo "$v=${!v}: give a whole number of steps (at least 1)" >&2; exit 2; }
done
mkdir -p "$W"
score() {  # <name> <eval-embeddings flags...>: one JSON line, named, into scores.jsonl
  name=$1; shift  # a row scored already (a rerun in the same workdir) is not scored again
  grep -qF "{\"row\": \"$name\", " "$W/scores.jsonl" 2>/dev/null && return
  $B eval-embeddings --sts "$DATA/glue/STS-B/dev.tsv" --squad "$DATA/squad/dev-v1.1.json" "$@" \
    | tail -1 | sed "s/^{/{\"row\": \"$name\", /" >> "$W/scores.jsonl"
}
[ -d "$W/vocab" ] || $B vocab --input "$DATA/text/gutenberg/*.txt,$DATA/text/wikitext2/*.txt" \
  --size 8192 --type wordpiece --out "$W/vocab"
$B train --config "$MLM_CONFIG" --workdir "$W/mlm" \
  --config.data.tokenizer="$W/vocab" --config.model.vocab_size=8192 \
  --config.data.train_files="$DATA/text/gutenberg/*.txt,$DATA/text/wikitext2/*.txt" \
  --config.train.steps="$PRETRAIN_STEPS" --config.schedule.warmup_steps=$((PRETRAIN_STEPS / 10)) \
  --config.train.checkpoint_every=500 \
  --config.train.eval_every=0
score "$NAME: MLM pretraining only, mean pooling" --checkpoint "$W/mlm" --pooling mean --bm25
$B train --config "configs/embeddings.py:contrastive,$ENCODER" --workdir "$W/contrastive" \
  --config.init_from="$W/mlm" --config.data.tokenizer="$W/vocab" --config.model.vocab_size=8192 \
  --config.data.data_dir="$DATA/squad" --config.data.train_file=train-subset-v1.1.json \
  --config.data.dev_file="$(realpath "$DATA/glue/STS-B/dev.tsv")" --config.data.max_seq_length=128 \
  --config.train.steps="$CONTRASTIVE_STEPS" --config.schedule.warmup_steps=$((CONTRASTIVE_STEPS / 10)) \
  --config.train.eval_every=0 \
  --config.train.checkpoint_every="$CONTRASTIVE_STEPS"
score "$NAME: MLM pretraining, then contrastive on SQuAD-train" --checkpoint "$W/contrastive"
if [ "$STS_STEPS" -gt 0 ]; then
  $B train --config "configs/embeddings.py:cosent,$ENCODER" --workdir "$W/sts" \
    --config.init_from="$W/contrastive" --config.data.tokenizer="$W/vocab" \
    --config.model.vocab_size=8192 --config.data.data_dir="$DATA/glue/STS-B" \
    --config.data.train_file=train.tsv --config.data.dev_file=dev.tsv \
    --config.data.max_seq_length=128 \
    --config.train.steps="$STS_STEPS" --config.schedule.warmup_steps=$((STS_STEPS / 10)) \
    --config.train.eval_every=0 \
    --config.train.checkpoint_every="$STS_STEPS"
  score "$NAME: MLM, contrastive on SQuAD-train, then CoSENT on STS-B-train" --checkpoint "$W/sts"
fi
cat "$W/scores.jsonl"
