#!/usr/bin/env bash
# Runs one bert-jax command on every worker of a Cloud TPU VM pod slice (one process per
# host; jax.distributed initialises itself from the TPU environment).
#
#   launch/tpu_pod.sh NAME ZONE train --config configs/bert_pretrain.py:base \
#       --workdir gs://BUCKET/bert_base --config.data.tokenizer=gs://BUCKET/vocab \
#       --config.data.name=array_record --config.data.train_files='gs://BUCKET/shards/train-*'
#
# Create the slice first, e.g. BERT-Base's 16 chips (v3-32 = 16 chips, 4 hosts) or
# BERT-Large's 64 chips (v3-128):
#   gcloud compute tpus tpu-vm create NAME --zone ZONE --accelerator-type v3-32 \
#       --version tpu-ubuntu2204-base
set -euo pipefail
NAME=$1; ZONE=$2; shift 2
REPO=${BERT_JAX_REPO:?set BERT_JAX_REPO to the git URL of your bert_jax repository}
ARGS=$(printf ' %q' "$@")
gcloud compute tpus tpu-vm ssh "$NAME" --zone "$ZONE" --worker=all --command "
  set -e
  [ -d bert_jax ] || git clone $REPO bert_jax
  cd bert_jax && python3 -m venv .venv && .venv/bin/pip install -q -e . 'jax[tpu]'
  .venv/bin/bert-jax $ARGS"
