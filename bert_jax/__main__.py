"""`python -m bert_jax`."""

from bert_jax.main import run

run()
