"""Checkpoints in and out: Hugging Face and original TF BERT checkpoints converted to ours
(convert, hf_weights, tf_checkpoint), ours exported as a Hugging Face folder (export), and
feature extraction from a checkpoint (features). A new checkpoint family lands here. It may
import training (checkpoint, state), tasks, models, data, config and the base modules.
"""
