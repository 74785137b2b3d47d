"""bert_jax: the Transformer and BERT in JAX/Flax NNX.

Importing the package (or any module of it) has no side effects: the CLI entry
(`bert_jax.commands.run`) and the tools' entry points attach the console log handler and quiet
libtpu on machines without a TPU. The layout and its import rules: README.md ("Map").
"""
