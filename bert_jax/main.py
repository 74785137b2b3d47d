"""`bert_jax.main:run`, the console script of earlier installs: the command line is bert_jax.commands."""

from bert_jax.commands import main, run  # noqa: F401

if __name__ == "__main__":
    run()
