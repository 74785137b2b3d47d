"""Sweep config files written before the command package import their helpers from here; the
sweep command is bert_jax.commands.sweep."""

from bert_jax.commands.sweep import PAPER_A3_GRID, sweep_config  # noqa: F401
