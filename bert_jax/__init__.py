"""bert_jax: the Transformer and BERT in JAX/Flax NNX."""
