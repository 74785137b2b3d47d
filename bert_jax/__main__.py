"""`python -m bert_jax`."""

from bert_jax.commands import run

run()
