"""`config.data` -> an iterator of host-local numpy batches with get_state()/set_state()."""

from __future__ import annotations

import jax

from bert_jax.data.synthetic import SyntheticPretraining

SOURCES = ("synthetic",)


def make(config, split: str, *, batch_size: int | None = None, num_batches: int | None = None):
    """The data pipeline of `config.data` for `split`, reading only this host's share."""
    d = config.data
    if d.name not in SOURCES:
        raise ValueError(f"data.name={d.name!r}; choose one of {list(SOURCES)}")
    return SyntheticPretraining(
        vocab_size=config.model.vocab_size, seq_len=d.max_seq_length,
        max_predictions=d.max_predictions_per_seq, batch_size=batch_size or config.train.batch_size,
        seed=config.seed, split=split, process_index=jax.process_index(),
        process_count=jax.process_count(), num_batches=num_batches)
