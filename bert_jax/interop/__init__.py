"""Checkpoints in and out: Hugging Face and original TF BERT checkpoints converted to ours
(convert, hf_weights, tf_checkpoint), ours exported as a Hugging Face folder (export), and
feature extraction from a checkpoint (features), sentence vectors (sentence_models; a corpus
into resumable shards: bulk_embed). Each Hugging Face family (BERT, RoBERTa,
ModernBERT) is one file in families/ that registers itself; convert and export are generic over
them, and a new checkpoint family is one file there. It may import training (checkpoint, state),
tasks, models, data, config and the base modules.
"""
