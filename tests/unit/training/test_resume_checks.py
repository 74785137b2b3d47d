"""What a resume says of the data it trains on (checkpoint.say_data_changes) and of every other
setting (checkpoint.say_setting_changes)."""

import json

import pytest

from bert_jax.config import ConfigError
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


def test_every_other_changed_setting_is_named_and_an_unchanged_one_is_not(monkeypatch):
    """A key outside the data section, in any section, that differs from the checkpoint's: one
    warning naming each (a loss scale, a learning rate); keys an older version did not store,
    and the data section (said by say_data_changes), are not in it."""
    stored = {"seed": 0, "model": {"name": "bert_contrastive", "similarity_scale": 20.0},
              "optimizer": {"learning_rate": 1e-3}, "data": {"train_file": "a.jsonl"}}
    warned = []
    monkeypatch.setattr(checkpoint.log, "warning", warned.append)
    checkpoint.say_setting_changes("run/checkpoints/4", stored, json.loads(json.dumps(stored)))
    assert warned == []
    now = {"seed": 0, "model": {"name": "bert_contrastive", "similarity_scale": 5.0},
           "optimizer": {"learning_rate": 1e-3, "b1": 0.9}, "data": {"train_file": "b.jsonl"},
           "train": {"steps": 5}}
    now["optimizer"]["learning_rate"] = 2e-3
    checkpoint.say_setting_changes("run/checkpoints/4", stored, now)
    assert warned == [
        "warning: resuming run/checkpoints/4 with settings changed since it was saved "
        "(model.similarity_scale: 20.0 in the checkpoint, 5.0 here; optimizer.learning_rate: "
        "0.001 in the checkpoint, 0.002 here): the steps from here on use the new values; to "
        "resume the run as it was, use its config (run/checkpoints/4/config)"]


def test_a_run_fine_tuned_on_another_task_is_refused_and_the_same_task_is_not():
    """Another fine-tuning task (its head, labels and best metric) is another run, even where
    the shapes agree: refused naming both tasks; the same task, or a pretraining run, passes."""
    model = {"name": "bert_classification", "num_labels": 2}
    sst2 = {"model": model, "data": {"name": "glue", "task": "sst2"}}
    checkpoint.refuse_other_run("w/checkpoints/4", sst2, json.loads(json.dumps(sst2)))
    pretraining = {"model": {"name": "bert_pretraining"}, "data": {"name": "text"}}
    checkpoint.refuse_other_run("w/checkpoints/4", pretraining, dict(pretraining))
    with pytest.raises(ConfigError) as e:
        mrpc = {**sst2, "data": {"name": "glue", "task": "mrpc"}}
        checkpoint.refuse_other_run("w/checkpoints/4", sst2, mrpc)
    assert str(e.value) == (
        "checkpoint w/checkpoints/4 holds a run fine-tuned on glue sst2, but this config fine-tunes "
        "glue mrpc; use a new --workdir (--config.init_from may start it from this run's weights), "
        "or resume with the config stored in w/checkpoints/4/config")
