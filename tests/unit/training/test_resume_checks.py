"""What a resume says of the data it trains on (checkpoint.say_data_changes)."""

from bert_jax.training import checkpoint


def _said(monkeypatch, stored: dict, now: dict) -> list[str]:
    warned = []
    monkeypatch.setattr(checkpoint.log, "warning", warned.append)
    checkpoint.say_data_changes("run/checkpoints/4", {"data": stored}, {"data": now})
    return warned


def test_other_training_data_is_named_and_what_only_scores_is_not(monkeypatch):
    stored = {"train_file": "a.jsonl", "mix": "proportional", "dev_file": "dev.tsv", "n_best_size": 20}
    assert _said(monkeypatch, stored, dict(stored)) == []
    # what is evaluated, or how SQuAD's answers are read off, is not the training stream
    assert _said(monkeypatch, stored, {**stored, "dev_file": "other.tsv", "n_best_size": 10}) == []
    said = _said(monkeypatch, stored, {**stored, "train_file": "a.jsonl,b.jsonl", "mix": "round_robin"})
    assert len(said) == 1 and said[0].startswith(
        "warning: resuming run/checkpoints/4 with other training data (data.mix: 'proportional' in "
        "the checkpoint, 'round_robin' here; data.train_file: 'a.jsonl' in the checkpoint, "
        "'a.jsonl,b.jsonl' here): the batches from this step on follow the new data"), said


def test_a_key_an_older_version_did_not_store_is_not_a_change(monkeypatch):
    """A checkpoint saved before data.mix existed (one training file then) resumes without a
    warning about it; a stored config without a data section is not compared."""
    now = {"train_file": "a.jsonl", "mix": "proportional"}
    assert _said(monkeypatch, {"train_file": "a.jsonl"}, now) == []
    warned = []
    monkeypatch.setattr(checkpoint.log, "warning", warned.append)
    checkpoint.say_data_changes("run/checkpoints/4", {}, {"data": {"train_file": "a.jsonl"}})
    assert warned == []
