"""bert_jax: the Transformer and BERT in JAX/Flax NNX."""

from bert_jax import log as _log  # noqa: F401 (installs the package logger's console handler)
